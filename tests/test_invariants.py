"""Invariants of the performance model over plans (issue 25, item 5), on 100 evenly spaced groups of layouts that differ
only in recompute (all of a group's modes) of each workload of benchmarks/invariants.py, which checks them whole
and prints the count of violations: recomputing more is never faster; exposing a collective (a framework without
its overlaps) never speeds a layout up; a TP group moved out of the NVLink domain is never cheaper."""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import invariants  # noqa: E402

GROUPS = 100


@functools.lru_cache(maxsize=None)
def plan(i):
    return invariants.plan(i, GROUPS)


@pytest.mark.parametrize("i", range(len(invariants.CASES)), ids=["-".join(map(str, c[:3] + c[4:])) for c in invariants.CASES])
def test_recomputing_more_is_never_faster(i):
    pairs, bad = invariants.recompute_violations(plan(i)[1])
    assert pairs > 100 and not bad, bad


@pytest.mark.parametrize("i", invariants.EXPOSED_CASES)
def test_exposing_a_collective_never_speeds_a_layout_up(i):
    n, bad = invariants.exposed_violations(*plan(i))
    assert n > 100 and not bad, bad


@pytest.mark.parametrize("i", invariants.NVLINK_CASES)
def test_leaving_the_nvlink_domain_is_never_cheaper(i):
    n, bad = invariants.nvlink_violations(*plan(i))
    assert n and not bad, bad


def test_a_violation_is_counted():
    """The checks see a violation where one is planted: a layout that recomputes more and runs faster."""
    w, preds = plan(1)
    lay = next(lay for lay in preds if lay.recompute == "none")
    more = next(other for other in preds if other != lay and other.recompute != "none"
                and invariants.dataclasses.replace(other, recompute="none") == lay)
    planted = dict(preds)
    planted[more] = invariants.dataclasses.replace(preds[more], step_time_s=preds[lay].step_time_s / 2)
    assert invariants.recompute_violations(planted)[1]


def test_offloaded_layouts_keep_both_invariants():
    """Every offloaded layout of Llama 3 70B on 8 H100 nodes (Megatron-Core): the evenly spaced groups above can miss
    them. With the NIC sharing the copies' PCIe link (nic_shares_host_link), the NIC's busy share was taken over the
    phase's compute and its TP collectives, so exposing the TP overlap or moving TP out of the NVLink domain made the
    copies faster than the step grew (54 violations in benchmarks/invariants.py at 8d1b4b0)."""
    model, cluster, nodes, gb, fw, precision = invariants.CASES[1]
    w = invariants.make_workload(model, nodes, cluster, gb, precision, framework=fw)
    preds = {lay: invariants.predict(lay, w) for lay in invariants.valid_layouts(invariants.load_space(), w)
             if lay.offload_layers}
    n, bad = invariants.exposed_violations(w, preds)
    crossed, far = invariants.nvlink_violations(w, preds)
    assert n > 10 and crossed > 5 and not bad and not far, (bad, far)


def _b200_fp8(keep):
    """The Llama 3 70B B200 FP8 case of benchmarks/invariants.py (8 nodes, Megatron-Core): the layouts `keep` picks."""
    i = invariants.CASES.index(("llama3-70b", "b200", 8, 128, "megatron-core", "fp8"))
    model, cluster, nodes, gb, fw, precision = invariants.CASES[i]
    w = invariants.make_workload(model, nodes, cluster, gb, precision, framework=fw)
    return w, {lay: invariants.predict(lay, w) for lay in invariants.valid_layouts(invariants.load_space(), w)
               if keep(lay)}


def test_compute_that_hides_the_p2p_does_not_hide_the_gradient_sync_too():
    """Interleaved tp 8 pp 4 vp 8 layouts on B200 in FP8: the p2p overlap hid p2p under the stage's compute and the
    gradient sync hid under the same compute again, so selective recompute's attention shrank the shown p2p by what
    it added and hid more of the sync: selective ran faster than none (3 violations in benchmarks/invariants.py)."""
    w, preds = _b200_fp8(lambda lay: (lay.tp, lay.pp, lay.virtual_pipeline) == (8, 4, 8))
    pairs, bad = invariants.recompute_violations(preds)
    assert pairs > 20 and not bad, bad


def test_offloaded_b200_layouts_are_not_sped_up_by_exposing_the_overlaps():
    """Offloaded tp 4 layouts on B200 in FP8 (its NIC on the copies' PCIe link): the NIC's seconds were the sync's
    whole time (its exposed part too, which runs when no copy does) spread over the phase's kernels alone, so where
    the copies outlast the kernels they were slowed by more than the NIC's seconds could take from them, more than
    the overlaps saved (9 'collective exposed' violations in benchmarks/invariants.py)."""
    w, preds = _b200_fp8(lambda lay: lay.offload_layers and lay.tp == 4)
    n, bad = invariants.exposed_violations(w, preds)
    assert n > 10 and not bad, bad
