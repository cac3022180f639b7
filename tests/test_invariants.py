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


@pytest.mark.parametrize("i", range(len(invariants.CASES)), ids=[f"{c[0]}-{c[4]}" for c in invariants.CASES])
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
    model, cluster, nodes, gb, fw = invariants.CASES[1]
    w = invariants.make_workload(model, nodes, cluster, gb, framework=fw)
    preds = {lay: invariants.predict(lay, w) for lay in invariants.valid_layouts(invariants.load_space(), w)
             if lay.offload_layers}
    n, bad = invariants.exposed_violations(w, preds)
    crossed, far = invariants.nvlink_violations(w, preds)
    assert n > 10 and crossed > 5 and not bad and not far, (bad, far)
