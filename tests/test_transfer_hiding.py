"""`best` at a node count nobody measured ranks a layout as if the share of its step it hides under compute beyond the
most any measured trial hid showed in full (issue 30 round 44, tuner.transfer_hiding): the model hides a ZeRO-3 layout's
gathers wholly until they outlast its compute, and a study's trials test that only as far as their own steps hid. A
ZeRO-3 layout whose ZeRO-2 sibling keeps the headroom gives way to it (round 45): stage 3 is stage 2 and the gathers; an
offloaded layout to its sibling offloading fewer layers, whose copies only add."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

from tuner.best import corrected, fastest_unmeasured
from tuner.correction import Observations
from tuner.layout import Layout
from tuner.perfmodel import predict
from tuner.space import load_space
from tuner.specs import make_workload
from tuner.transfer_hiding import (by_verified_hiding, hidden_sync_share, less_work_first, measured_hiding,
                                    unverified_hiding)
from tuner.trial import Status

W4, W8 = (make_workload("llama3-8b", n, "h100", framework="megatron-core") for n in (4, 8))
MEASURED = Layout(tp=1, pp=1, dp=32, micro_batch=8, zero_stage=3, recompute="full")       # ZeRO-3, 2 micro-batches
TWIN = Layout(tp=1, pp=1, dp=64, micro_batch=8, zero_stage=3, recompute="full")           # it at 8 nodes
SMALL = Layout(tp=1, pp=1, dp=64, micro_batch=1, zero_stage=3, recompute="full")          # 8 micro-batches of 1
SMALL_THERE = Layout(tp=1, pp=1, dp=32, micro_batch=1, zero_stage=3, recompute="full")    # it at 4 nodes
Z3 = Layout(tp=2, pp=1, dp=32, micro_batch=2, zero_stage=3, recompute="none", sequence_parallel=True)
Z2 = dataclasses.replace(Z3, zero_stage=2)
OTHER = Layout(tp=1, pp=2, dp=32, micro_batch=1, zero_stage=1, recompute="none")


def record(layout: Layout, w=W4, factor: float = 1.2):
    p = predict(layout, w)
    return SimpleNamespace(layout=layout, status=Status.OK, nodes=w.nodes, peak_memory_gb=p.memory_gb,
                           mfu=p.mfu * factor, model=w.model.name, cluster=w.cluster.name, study="s",
                           runner="command", global_batch=None)


def row(layout: Layout, mfu: float, headroom: bool = True) -> dict:
    return {"layout": layout, "mfu": mfu, "memory_gb": 40.0, "headroom_ok": headroom}


def test_the_model_hides_more_of_a_smaller_micro_batch_and_megatron_deepspeed_hides_nothing():
    assert hidden_sync_share(SMALL_THERE, W4) > hidden_sync_share(MEASURED, W4) + 0.05
    mds = make_workload("22b", 2, "frontier", framework="megatron-deepspeed")
    assert hidden_sync_share(Layout(tp=2, pp=1, dp=8, micro_batch=1, zero_stage=3, recompute="full"), mds) == 0.0


def test_a_layout_hiding_more_than_any_measured_trial_gives_way_to_the_twin():
    measured = measured_hiding([record(MEASURED)], W8)
    assert measured[1].nodes == 4
    assert unverified_hiding(TWIN, W8, measured) == 0.0                # the twin is the measured trial at 4 nodes
    assert unverified_hiding(SMALL, W8, measured) > 0.05
    ranked = by_verified_hiding([row(SMALL, 0.50), row(TWIN, 0.48)], W8, measured, k=2)
    assert [r["layout"] for r in ranked] == [TWIN, SMALL]
    assert ranked[1]["mfu"] == 0.50                                    # only the order moves


def test_the_answer_and_its_stated_speed_through_best():
    rows = corrected([SMALL, TWIN], W8, Observations())
    for r, mfu in zip(rows, (0.50, 0.48)):
        r.update(mfu=mfu, p_fit=1.0, headroom_ok=True)
    weighed = (rows, W8, None, SimpleNamespace(evidence={"studies": [], "node_counts": [4], "ok_trials": 1}),
               measured_hiding([record(MEASURED)], W8))
    out = fastest_unmeasured(weighed, load_space("default"), k=2)
    assert [a["key"] for a in out] == [TWIN.key(), SMALL.key()]
    assert out[1]["mfu"] == 0.50
    alone = fastest_unmeasured(weighed[:4] + (None,), load_space("default"), k=2)      # nothing measured: the speed's
    assert [a["key"] for a in alone] == [SMALL.key(), TWIN.key()]


def test_the_most_any_trial_hid_is_the_reference():
    measured = measured_hiding([record(MEASURED), record(SMALL_THERE)], W8)       # a trial hid as much as SMALL will
    assert unverified_hiding(SMALL, W8, measured) == 0.0
    ranked = by_verified_hiding([row(SMALL, 0.50), row(TWIN, 0.48)], W8, measured, k=2)
    assert [r["layout"] for r in ranked] == [SMALL, TWIN]


def test_the_headroom_rule_still_comes_first_and_only_k_rows_come_back():
    measured = measured_hiding([record(MEASURED)], W8)
    ranked = by_verified_hiding([row(SMALL, 0.50, headroom=False), row(TWIN, 0.30)], W8, measured, k=2)
    assert [r["layout"] for r in ranked] == [TWIN, SMALL]
    assert [r["layout"] for r in by_verified_hiding([row(SMALL, 0.5), row(TWIN, 0.48)], W8, measured, k=1)] == [TWIN]


def test_the_model_never_prices_a_zero3_layout_ahead_of_its_zero2_sibling():
    """What less_work_first rests on, over such pairs of three spaces (stage 3 gathers besides what stage 2 does)."""
    pairs = 0
    for w, space in ((W8, "default"), (make_workload("22b", 8, "frontier", framework="megatron-deepspeed"),
                                       "frontier-2023"), (make_workload("mixtral-8x7b", 8, "h100"), "default")):
        layouts = set(load_space(space).enumerate_layouts(w))
        for lay in layouts:
            sib = dataclasses.replace(lay, zero_stage=2)
            if lay.zero_stage == 3 and sib in layouts and lay.pp == 1 and lay.micro_batch <= 2:
                pairs += 1
                assert predict(lay, w).mfu <= predict(sib, w).mfu
    assert pairs >= 20


def test_a_zero3_layout_the_correction_puts_ahead_gives_way_to_its_zero2_sibling():
    ranked = by_verified_hiding(less_work_first([row(Z3, 0.50), row(OTHER, 0.47), row(Z2, 0.45)]), W8, None, k=3)
    assert [r["layout"] for r in ranked] == [Z2, OTHER]                # in the ZeRO-3 layout's place
    assert ranked[0]["mfu"] == 0.45                                    # its own stated speed
    short = [row(Z3, 0.50), row(OTHER, 0.47), row(Z2, 0.45, headroom=False)]     # the sibling short of the headroom
    assert [r["layout"] for r in by_verified_hiding(less_work_first(short), W8, None, k=3)] == [Z3, OTHER, Z2]


def test_the_zero2_sibling_answers_through_best():
    rows = corrected([Z3, OTHER, Z2], W8, Observations())
    for r, mfu in zip(rows, (0.50, 0.47, 0.45)):
        r.update(mfu=mfu, p_fit=1.0, headroom_ok=True)
    weighed = (rows, W8, None, SimpleNamespace(evidence={"studies": [], "node_counts": [4], "ok_trials": 1}), None)
    out = fastest_unmeasured(weighed, load_space("default"), k=3)
    assert [a["key"] for a in out] == [Z2.key(), OTHER.key()]
    assert out[0]["mfu"] == 0.45 and "rank_mfu" not in out[0]


def test_the_model_never_prices_more_offloaded_layers_ahead_and_the_fewer_stand_for_them():
    for n in (1, 2, 4):
        base = Layout(tp=n, pp=1, dp=64 // n, micro_batch=2, zero_stage=2, recompute="none", sequence_parallel=n > 1)
        mfus = [predict(dataclasses.replace(base, offload_layers=k), W8).mfu for k in (0, 8, 16, 24)]
        assert mfus == sorted(mfus, reverse=True)
    off = [dataclasses.replace(Z3, offload_layers=k) for k in (24, 16)] + [dataclasses.replace(Z2, offload_layers=16)]
    rows = [row(off[0], 0.50), row(off[1], 0.48), row(off[2], 0.44), row(OTHER, 0.47),
            row(dataclasses.replace(Z2, offload_layers=8), 0.52, headroom=False)]
    ranked = by_verified_hiding(less_work_first(rows), W8, None, k=5)
    # ZeRO-3 offloading 24 layers, then 16, then ZeRO-2 offloading 16: the lightest keeping the headroom stands for all
    assert [r["layout"] for r in ranked] == [off[2], OTHER, dataclasses.replace(Z2, offload_layers=8)]
    assert ranked[0]["mfu"] == 0.44 and ranked[0]["rank_mfu"] == 0.50
