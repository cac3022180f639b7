"""`best --nodes 2N` ranks a layout by how much of its step it hides beyond what its nearest measured layout hid (issue 30
round 22): a measured family's error is not carried whole to a sibling whose gradient sync the model hides far more of."""

from __future__ import annotations

from types import SimpleNamespace

from tuner.best import by_verified_hiding, unverified_hiding, measured_hiding
from tuner.correction import hidden_sync_share
from tuner.layout import Layout
from tuner.perfmodel import predict
from tuner.specs import make_workload
from tuner.trial import Status

W4, W8 = (make_workload("llama3-8b", n, "h100", framework="megatron-core") for n in (4, 8))
MEASURED = Layout(tp=1, pp=1, dp=32, micro_batch=8, zero_stage=3, recompute="full")       # ZeRO-3, 2 micro-batches
TWIN = Layout(tp=1, pp=1, dp=64, micro_batch=8, zero_stage=3, recompute="full")           # it at 8 nodes
SMALL = Layout(tp=1, pp=1, dp=64, micro_batch=1, zero_stage=3, recompute="full")          # 8 micro-batches of 1


def record(layout: Layout, factor: float = 1.2):
    p = predict(layout, W4)
    return SimpleNamespace(layout=layout, status=Status.OK, nodes=4, peak_memory_gb=p.memory_gb, mfu=p.mfu * factor,
                           model=W4.model.name, cluster=W4.cluster.name, study="s", runner="command", global_batch=None)


def row(layout: Layout, mfu: float) -> dict:
    return {"layout": layout, "mfu": mfu, "memory_gb": 40.0, "headroom_ok": True}


def test_a_sibling_hiding_more_than_its_measured_neighbour_gives_way_to_the_twin():
    small_there = Layout(tp=1, pp=1, dp=32, micro_batch=1, zero_stage=3, recompute="full")
    assert hidden_sync_share(small_there, W4) > hidden_sync_share(MEASURED, W4) + 0.05    # the model hides more there
    rows = [row(SMALL, 0.50), row(TWIN, 0.48)]
    recs = [record(MEASURED)]
    measured = measured_hiding(recs, W8, None)
    assert unverified_hiding(TWIN, W8, measured) == 0.0                # the twin is the measured trial at 4 nodes
    assert unverified_hiding(SMALL, W8, measured) > 0.05
    ranked = by_verified_hiding(rows, W8, recs, None, k=2)
    assert [r["layout"] for r in ranked] == [TWIN, SMALL]
    assert ranked[1]["mfu"] == 0.50                                    # only the order moves


def test_nothing_measured_keeps_the_corrected_order():
    rows = [row(SMALL, 0.50), row(TWIN, 0.48)]
    assert [r["layout"] for r in by_verified_hiding(rows, W8, [], None, k=2)] == [SMALL, TWIN]
    assert [r["layout"] for r in by_verified_hiding(rows, W8, [], None, k=1)] == [SMALL]


def test_the_headroom_rule_still_comes_first():
    rows = [dict(row(SMALL, 0.50), headroom_ok=False), row(TWIN, 0.30)]
    ranked = by_verified_hiding(rows, W8, [record(MEASURED)], None, k=2)
    assert [r["layout"] for r in ranked] == [TWIN, SMALL]
