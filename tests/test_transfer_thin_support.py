"""`best --nodes 2N` ranks by a lower bound where no measured layout is near (issue 30 item 3): a layout that no
measured neighbour supports must beat a measured trial's twin by its own extrapolation's spread, not by a hair."""

from __future__ import annotations

import importlib
from dataclasses import replace

from tuner.layout import Layout

from test_transfer_interval import MEASURED, SPACE, W4, record

best_module = importlib.import_module("tuner.best")
DEFAULT_K = best_module.THIN_SUPPORT_K
FACTORS = (1.0, 0.7, 1.0, 1.0)                       # the model off by these at 2 nodes (MEASURED's order)
TWIN = replace(list(MEASURED)[2], dp=8)              # tp4-pp1-dp8-mb2: measured at dp 4, on the model (1.0)
UNSUPPORTED = Layout(tp=4, pp=4, dp=2, micro_batch=4, zero_stage=1, recompute="none")   # no trial near it


def _answer(k: float, monkeypatch) -> list[dict]:
    monkeypatch.setattr(best_module, "THIN_SUPPORT_K", k)
    recs = [record(lay, f) for lay, f in zip(MEASURED, FACTORS)]
    return best_module.best_for_unmeasured(W4, SPACE, recs, k=40)


def test_a_measured_twin_answers_before_an_unsupported_layout_rated_a_little_faster(monkeypatch):
    by_mean = _answer(0.0, monkeypatch)                           # the corrected mean alone (before issue 30 round 17)
    assert by_mean[0]["layout"] == UNSUPPORTED
    got = _answer(DEFAULT_K, monkeypatch)                              # the default rule
    assert got[0]["layout"] == TWIN
    rows = {r["layout"]: r for r in got}
    assert UNSUPPORTED in rows                                    # still listed, after the twin
    unsupported, twin = rows[UNSUPPORTED], rows[TWIN]
    # the stated speeds are the corrected means: the unsupported one is rated faster, by less than its spread
    assert 1.0 < unsupported["samples_per_second"] / twin["samples_per_second"] < 1.0 + unsupported["uncertainty"]
    assert twin["uncertainty"] < 0.5 * unsupported["uncertainty"]
    assert unsupported["samples_per_second"] == by_mean[0]["samples_per_second"]   # the order moved, not the figures

