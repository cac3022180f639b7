"""When an OOM lets a layout it held go (issue 30 round 42, tuner/search/oom_deferral.py)."""

from __future__ import annotations

import dataclasses
import math

import pytest

from tuner import metrics
from tuner.perfmodel import RECOMMEND_AT, predict
from tuner.search.guided import GuidedSearcher
from tuner.search.oom_deferral import RESOLUTION
from tuner.space import load_space
from tuner.specs import make_workload
from tuner.trial import Status, TrialResult

W = make_workload("22b", 2, "frontier", framework="megatron-core")
CANDS = load_space("default").enumerate_layouts(W)
PREDS = {c: predict(c, W) for c in CANDS}
BY_KEY = {c.key(): c for c in CANDS}
#: the OOM'd layout: no recompute, its selective-recompute sibling predicted to need the same (FlashAttention keeps no
#: attention scores, so Megatron's selective recompute frees nothing in the model's account)
OOM = BY_KEY["tp2-sp1-pp2-dp4-mb1-z1-rcnone"]
TWIN = dataclasses.replace(OOM, recompute="selective")
NONE_RAN = ["tp2-sp1-pp4-dp2-mb1-z1-rcnone", "tp2-sp1-pp8-dp1-mb1-z1-rcnone", "tp2-sp1-pp8-dp1-mb2-z1-rcnone"]
SELECTIVE_RAN = ["tp2-sp1-pp4-dp2-mb1-z1-rcselective", "tp2-sp1-pp8-dp1-mb1-z1-rcselective"]


def world_peak(layout) -> float:
    """A machine whose activations without recompute are 1.6x the model's and the rest as the model says (a measured
    peak: the cluster's reserve is the prediction's, not the run's)."""
    p = PREDS[layout]
    return p.memory_gb - W.cluster.memory_reserved_gb + 0.6 * p.memory_breakdown["activations"] * (layout.recompute == "none")


def study(ran: list[str]) -> GuidedSearcher:
    s = GuidedSearcher(CANDS, workload=W, seed=3)
    s.tell(OOM, TrialResult(Status.OOM, message="out of memory"))
    for key in ran:
        c = BY_KEY[key]
        s.tell(c, metrics.complete(TrialResult(Status.OK, mfu=PREDS[c].mfu, peak_memory_gb=world_peak(c)), W, c))
    s.ask(1)
    return s


def test_the_twin_is_predicted_as_heavy_and_the_machine_runs_it():
    assert PREDS[TWIN].memory_gb == pytest.approx(PREDS[OOM].memory_gb)
    need = lambda c: world_peak(c) + W.cluster.memory_reserved_gb      # noqa: E731
    assert need(TWIN) < W.cluster.memory_gb < need(OOM)
    assert math.log(need(OOM) / need(TWIN)) > RESOLUTION            # apart by more than a run's spread


def test_a_twin_waits_while_no_peak_of_its_own_account_was_measured():
    """Measured peaks without recompute, 1.6x the model, explain the OOM; the selective twin's correction is set
    apart from its sibling's only by the features (each recompute mode's activations their own factor), not by a
    measurement: it waits (issue 24 round 9: such a twin let go ran out too)."""
    s = study(NONE_RAN)
    assert s.deferred[s.index[TWIN]] and not s.used[s.index[TWIN]]


def test_a_twin_set_apart_by_peaks_of_its_own_account_is_left_to_p_fit():
    """Once peaks of the twin's own account (selective recompute at the same tp and sp) ran as the model says, beside
    peaks without recompute at 1.6x, the memory learned from them puts the twin lighter than the OOM'd layout by more
    than a run's spread: the OOM no longer holds it, and expected improvement weighs it by its p_fit -- which, below
    the recommendation's RECOMMEND_AT here, held it for the whole budget before (a Frontier 1T world's fastest, the
    selective sibling of an OOM'd layout, waited so beside a measured pp-128 pair 12 % apart)."""
    s = study(NONE_RAN + SELECTIVE_RAN)
    i = s.index[TWIN]
    assert not s.deferred[i] and not s.used[i]
    assert 0.5 < s.p_fit()[i] < RECOMMEND_AT


def test_an_oom_that_does_not_speak_for_a_layout_does_not_hold_it():
    """Only an OOM that holds a layout (its own account, its twins, or one no measured peak explains) must be cleared:
    here the OOM of a full-recompute layout, unlike the twin and explained by the peaks, adds nothing to what holds it."""
    s = study(NONE_RAN + SELECTIVE_RAN)
    full = min((c for c in CANDS if c.recompute == "full" and c.tp == 1 and PREDS[c].fits
                and PREDS[c].memory_gb > 0.8 * PREDS[OOM].memory_gb and PREDS[c].memory_gb < PREDS[OOM].memory_gb),
               key=lambda c: -PREDS[c].memory_gb)
    s.tell(full, TrialResult(Status.OOM, message="out of memory"))
    s.ask(1)
    assert not s.deferred[s.index[TWIN]]
