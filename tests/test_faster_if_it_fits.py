"""`tuner best` at a node count nobody measured names the layout one trial would decide (issue 30 item 3): the fastest
one that fits with p_fit below the 0.95 the answer keeps, where it is predicted faster than the answer by more than the
study's stop threshold; with its p_fit and the command that runs it."""

from __future__ import annotations

import json

import pytest

import tuner.best as best_mod
from tuner.best import faster_if_it_fits
from tuner.layout import Layout
from tuner.search import STUDY_DEFAULTS
from tuner.specs import make_workload

W = make_workload("22b", 4)
SAFE = Layout(tp=2, pp=4, dp=4, micro_batch=1, zero_stage=1, recompute="none")
EDGE = Layout(tp=1, pp=8, dp=4, micro_batch=1, zero_stage=1, recompute="none")
NEAR = Layout(tp=2, pp=8, dp=2, micro_batch=2, zero_stage=1, recompute="none")


def row(layout: Layout, mfu: float, p_fit: float) -> dict:
    return {"layout": layout, "mfu": mfu, "p_fit": p_fit, "headroom_ok": p_fit >= 0.95, "memory_gb": 59.0,
            "limited_by": None if p_fit >= 0.95 else "its twin ran out of memory"}


def test_the_fastest_riskier_layout_beyond_the_stop_threshold_is_named():
    gain = STUDY_DEFAULTS["stop_threshold"]
    rows = [row(SAFE, 0.40, 1.0), row(NEAR, 0.40 * (1 + gain / 2), 0.8), row(EDGE, 0.40 * (1 + 3 * gain), 0.74)]
    got = faster_if_it_fits(rows, W)
    assert got["key"] == EDGE.key() and got["p_fit"] == 0.74
    assert got["faster_by"] == pytest.approx(3 * gain) and got["layout"] == EDGE.as_dict()
    assert got["samples_per_second"] > 0 and got["p_fit_limited_by"] == "its twin ran out of memory"
    assert faster_if_it_fits(rows[:2], W) is None            # within the threshold: no trial worth running
    assert faster_if_it_fits([row(EDGE, 0.5, 0.7), row(NEAR, 0.6, 0.6)], W) is None    # the answer itself is short


def test_its_flags_pin_exactly_that_layout(tuner):
    code, out, err = tuner("plan", "--model", "22b", "--nodes", "4", *EDGE.flags().split(), "--format", "json")
    assert code == 0, err
    got = json.loads(out)
    assert [Layout.from_dict(r["layout"]) for r in got] == [EDGE]
    assert "--dp" not in EDGE.flags() and "--no-sequence-parallel" in EDGE.flags()


def test_best_prints_it_with_the_command_that_runs_it(tuner, monkeypatch):
    """The line `tuner best` prints, and its command run as printed: one trial, of that layout."""
    def named(likely, workload):
        return {"key": EDGE.key(), "layout": EDGE.as_dict(), "flags": EDGE.flags(), "samples_per_second": 8.1,
                "faster_by": 0.072, "p_fit": 0.74, "memory_gb": 59.2, "p_fit_limited_by": None}
    monkeypatch.setattr(best_mod, "faster_if_it_fits", named)
    code, out, err = tuner("best", "--model", "22b", "--nodes", "4", "--cluster", "frontier")
    assert code == 0, err
    line = next(ln for ln in out.splitlines() if ln.startswith("Faster if it fits: "))
    assert f"{EDGE.key()}, predicted +7.2% samples/s, at p_fit 0.74 (59.2 GB of " in line
    command = line.split("one trial decides: ")[1].split()
    assert command[:2] == ["tuner", "search"] and command[-2:] == ["--budget", "1"]
    code, out, err = tuner(*command[1:], "--study", "one", "--format", "json")
    assert code == 0, err
    got = json.loads(out)
    assert got["ran"] == 1 and Layout.from_dict(got["top"][0]["layout"]) == EDGE
    code, out, _ = tuner("best", "--model", "22b", "--nodes", "8", "--cluster", "frontier", "--format", "json")
    assert json.loads(out)["faster_if_it_fits"]["key"] == EDGE.key()
