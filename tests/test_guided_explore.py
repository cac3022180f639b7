"""Guided exploration that escapes a wrong prior (issue 30, tuner/search/explore.py)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from tuner import metrics
from tuner.layout import Layout
from tuner.oom_evidence import activation_account
from tuner.perfmodel import RECOMMEND_AT, predict, rank
from tuner.search.explore import FAMILY_DIMS, amplitude, family_key, model_errors, novelty
from tuner.search.guided import GuidedSearcher
from tuner.correction import FAR_REACH, layout_d2
from tuner.search.oom_deferral import RESOLUTION
from tuner.space import load_space
from tuner.specs import make_workload
from tuner.trial import Status, TrialResult

# The family worlds (test_finds_... / test_leaves_...) keep the GCD at its nameplate's 64 GB: they fit a layout up to
# its whole capacity by the model's point estimate, while the searcher prices the allocator's spread. At the 68.7 GB a
# GCD allocates (issue 24 round 9) the hidden family's only layouts within 0.95 of the fastest sit at 0.85-0.95 of the
# capacity (pp: tp1-pp4-dp4-mb1-z1 at p_fit 0.72, tp2-pp4-dp2-mb2-z1 at 0.90; micro-batch: tp4-pp4-dp1-mb4 at 0.65,
# the next 0.89 of the fastest), so those tests would measure a memory gamble, not the escape from a wrong speed prior
# they are about. The OOM test runs at the real capacity (REAL_W).
REAL_W = make_workload("22b", 2)
W = make_workload("22b", 2)
W = dataclasses.replace(W, cluster=dataclasses.replace(W.cluster, memory_gb=64.0))
CANDS = load_space("frontier-2023").enumerate_layouts(W)


def measured(layout, factor: float = 1.0, w=W) -> TrialResult:
    p = predict(layout, w)
    return metrics.complete(TrialResult(Status.OK, samples_per_second=p.samples_per_second * factor,
                                        peak_memory_gb=p.memory_gb), w, layout)


def test_model_errors_count_the_spread_and_half_the_typical_error():
    assert model_errors([]).size == 0
    assert np.allclose(model_errors([0.01, -0.01, 0.0]), 0.0)            # noise: the model was right
    e = model_errors([-0.7, -0.7, -0.7])                                 # off by 2x everywhere
    assert np.allclose(e, 0.5 * (0.7 - 0.03))
    e = model_errors([0.0, 0.0, 0.6])                                    # one trial far off, the rest right
    assert e[0] == e[1] == 0.0 and e[2] == pytest.approx(0.57)


def test_amplitude_grows_near_the_trials_where_the_model_was_wrong():
    X_obs = np.array([[0.0, 0.0], [1.0, 1.0]])
    errors = np.array([0.0, 0.5])
    sigma = amplitude(np.array([[0.0, 0.0], [1.0, 1.0], [0.5, 0.5]]), X_obs, errors)
    assert sigma[1] > sigma[2] > sigma[0]
    assert np.allclose(amplitude(np.zeros((3, 2)), np.zeros((0, 2)), np.zeros(0)), amplitude(np.zeros((1, 2)),
                       np.zeros((0, 2)), np.zeros(0))[0])


def test_first_picks_spread_over_layout_families():
    s = GuidedSearcher(CANDS, workload=W, seed=1)
    picks = []
    for _ in range(3):
        lay = s.ask(1)[0]
        picks.append(lay)
        s.tell(lay, measured(lay))
    top = next(p.layout for p in rank(CANDS, W) if s.roomy[s.index[p.layout]])
    assert picks[0] == top
    keys = [family_key(p) for p in picks]
    for k, later in enumerate(keys[1:], 1):
        assert novelty(later, keys[:k]) >= 3, (picks, FAMILY_DIMS)


def _posterior(s: GuidedSearcher):
    gp, rows = s._beliefs([])
    mu, sd = gp.predict(rows, s.F)
    return mu, sd


def test_a_trial_far_above_its_prediction_moves_its_neighbours_and_their_uncertainty():
    ok = [c for c in CANDS if predict(c, W).fits]
    kin = lambda c: (c.tp, c.pp, c.recompute, c.zero_stage)      # noqa: E731
    hero = next(c for c in ok if c.pp == 8 and c.recompute == "none" and c.zero_stage == 1
                and any(kin(o) == kin(c) and o != c for o in ok))       # (a stage with siblings that fit)
    near = [c for c in ok if kin(c) == kin(hero) and c != hero]
    base = [next(c for c in ok if c.pp == pp and c.tp != hero.tp and c.recompute == "full") for pp in (1, 2, 4)]
    far = [c for c in ok if novelty(family_key(c), [family_key(hero)]) >= 8 and c not in base]
    assert near and far
    right, wrong = GuidedSearcher(CANDS, workload=W, seed=2), GuidedSearcher(CANDS, workload=W, seed=2)
    for c in base:
        right.tell(c, measured(c)), wrong.tell(c, measured(c))
    right.tell(hero, measured(hero, 1.0))
    wrong.tell(hero, measured(hero, 1.8))                  # 80 % faster than the model said
    mu_r, sd_r = _posterior(right)
    mu_w, sd_w = _posterior(wrong)
    n = [wrong.index[c] for c in near]
    f = [wrong.index[c] for c in far]
    assert np.mean(mu_w[n] - mu_r[n]) > 0.25                # its neighbours are believed faster too
    assert np.mean(mu_w[n] - mu_r[n]) > 2 * np.mean(mu_w[f] - mu_r[f])
    assert np.all(sd_w[n] > sd_r[n])                       # and less certain: the model was wrong nearby


def _search(truth, seed: int, budget: int = 10) -> float:
    """The fastest true speed among `budget` guided trials in the world `truth` (None: out of memory)."""
    s = GuidedSearcher(CANDS, workload=W, seed=seed)
    best, ran = 0.0, 0
    rng = np.random.default_rng(seed)
    while ran < budget:
        lay = s.ask(1)[0]
        v, p = truth(lay), PREDS[lay]
        if not p.fits:                                          # the Driver's pruning
            s.tell(lay, TrialResult(Status.PRUNED, peak_memory_gb=p.memory_gb))
            continue
        res = TrialResult(Status.OOM) if v is None else \
            TrialResult(Status.OK, samples_per_second=v * math.exp(0.02 * rng.standard_normal()),
                        peak_memory_gb=p.memory_gb)
        s.tell(lay, metrics.complete(res, W, lay))
        best, ran = max(best, v or 0.0), ran + 1
    return best


PREDS = {p.layout: p for p in rank(CANDS, W)}


def _world(factor):
    """The model's own world with the speed of some layouts scaled by factor(layout). Memory: what the model is sure
    of (p_fit >= RECOMMEND_AT) runs, the rest runs out -- so the tests measure the escape from a wrong speed prior, not
    a memory gamble (since Megatron-DeepSpeed's measured account, issue 30 round 33, the point estimate at 64 GB puts
    the micro-batch world's fastest, a ZeRO-0 pipeline layout, at p_fit 0.79)."""
    def truth(lay):
        p = PREDS[lay]
        return p.samples_per_second * factor(lay) if p.p_fit >= RECOMMEND_AT else None
    return truth


def _fastest(truth) -> float:
    return max(v for c in CANDS if (v := truth(c)) is not None)


@pytest.mark.parametrize("dim", ["pp", "micro_batch", "zero_stage"])
@pytest.mark.parametrize("seed", [3, 4])
def test_finds_a_family_the_model_underrates(dim, seed):
    """One wrong term makes the model rate every layout with one value of `dim` 1.6x too slow (the best of
    them predicted at 0.55-0.8 of the top, so no first pick of the model's ranking alone): 10 trials reach
    0.95 of that world's fastest, where the best outside that family is at most 0.85."""
    top = next(iter(PREDS.values()))
    hidden = next(getattr(p.layout, dim) for p in PREDS.values() if getattr(p.layout, dim) != getattr(top.layout, dim)
                  and p.fits and 0.55 <= p.samples_per_second / top.samples_per_second <= 0.8)
    truth = _world(lambda lay: 1.6 if getattr(lay, dim) == hidden else 1.0)
    fastest = _fastest(truth)
    assert max(v for c in CANDS if getattr(c, dim) != hidden and (v := truth(c))) <= 0.85 * fastest
    assert _search(truth, seed) >= 0.95 * fastest


@pytest.mark.parametrize("seed", [3, 4])
def test_leaves_a_favourite_family_the_model_overrates(seed):
    """The model's favourite pipeline depth runs at half the speed it predicts: 10 trials still reach 0.93 of
    the fastest (the issue's worst-seed bound), outside that family."""
    favourite = next(iter(PREDS)).pp
    truth = _world(lambda lay: 0.5 if lay.pp == favourite else 1.0)
    assert _search(truth, seed) >= 0.93 * _fastest(truth)


def test_an_oom_holds_heavier_layouts_until_measured_peaks_reorder_them():
    """An OOM defers what the model predicts to need as much on that stage; once measured peaks say the model
    overstates one kind of memory (here the activations kept without recompute, at half), the layouts that
    memory made heavier are proposed again where the learned memory is sure they fit, and the layouts the
    peaks leave heavier stay deferred."""
    W, CANDS = REAL_W, load_space("frontier-2023").enumerate_layouts(REAL_W)    # the GCD's allocatable 68.7 GB
    preds = {c: predict(c, W) for c in CANDS}
    full = [c for c in CANDS if c.recompute == "full" and preds[c].fits]
    oom = min(full, key=lambda c: abs(preds[c].memory_gb - 0.8 * W.cluster.memory_gb))
    stage, bound = preds[oom].memory_stage, preds[oom].memory_gb

    def peak(c):
        return preds[c].memory_gb - 0.5 * preds[c].memory_breakdown["activations"] * (c.recompute == "none")
    s = GuidedSearcher(CANDS, workload=W, seed=3)
    s.tell(oom, TrialResult(Status.OOM, message="out of memory"))
    heavier = [c for c in CANDS if c != oom and preds[c].memory_stage == stage and preds[c].memory_gb >= bound]
    assert heavier and all(s.deferred[s.index[c]] for c in heavier)
    light = sorted((c for c in CANDS if c.recompute == "none" and preds[c].fits and preds[c].memory_gb < bound),
                   key=lambda c: preds[c].memory_gb)
    for c in light[::max(len(light) // 6, 1)][:6] + [c for c in full if preds[c].memory_gb < 0.6 * bound][:2]:
        s.tell(c, metrics.complete(TrialResult(Status.OK, mfu=preds[c].mfu, peak_memory_gb=peak(c)), W, c))
    s.ask(1)
    released = [c for c in heavier if not s.deferred[s.index[c]] and not s.used[s.index[c]]]
    assert released and all(c.recompute == "none" and peak(c) < bound for c in released)
    assert all(s.deferred[s.index[c]] for c in heavier if c.recompute == "full" and not s.used[s.index[c]])


def test_believed_fastest_is_the_trial_the_searchers_belief_puts_highest():
    """Issue 30 round 30 (GuidedSearcher.believed_fastest, printed beside the recommendation by
    benchmarks/ext_search.py): of the layouts that ran, the one whose corrected speed -- the model, every
    measurement, the family term -- is highest. It follows measurements that are far apart (the model's favourite,
    measured at half its prediction, is not it), agrees with the belief expected improvement reads, and names no
    layout that is not a candidate."""
    s = GuidedSearcher(CANDS, workload=W, seed=3)
    order = [p.layout for p in rank(CANDS, W) if p.fits]
    top, others = order[0], order[5:60:11]
    s.tell(top, measured(top, 0.5))
    for lay in others:
        s.tell(lay, measured(lay))
    told = [top, *others]
    best = s.believed_fastest(told)
    assert best in others and best == max(others, key=lambda lay: s.told[lay].mfu)
    gp, rows = s._beliefs([])
    mu, _ = gp.predict(rows, s.F)
    belief = {lay: s.log_pred[s.index[lay]] + mu[s.index[lay]] for lay in told}
    assert best == max(told, key=belief.get)
    assert s.believed_fastest([]) is None and s.believed_fastest([Layout(tp=3, pp=1, dp=1, micro_batch=1)]) is None


MCORE_W = make_workload("llama3-70b", 16, "h100", framework="megatron-core")
MCORE_CANDS = load_space("default").enumerate_layouts(MCORE_W)


def test_a_pp1_layouts_error_is_not_taught_to_the_pipelines_that_do_not_interleave():
    """vp means nothing at pp 1 (nor sp at tp 1): the family term reads it there as a value of its own. Four pp-1
    layouts measured at half their prediction and three interleaved pipelines as predicted: a pipeline that does not
    interleave is believed as its interleaved twin is, give or take the dimensions it shares with the pp-1 layouts
    (on the code before, vp = 1 carried the pp-1 layouts' error: 0.10 below its twin; now 0.04)."""
    fits = [c for c in MCORE_CANDS if predict(c, MCORE_W).fits]
    flat = [c for c in fits if c.pp == 1][:4]
    deep = [c for c in fits if c.pp > 1 and c.virtual_pipeline > 1][:3]
    target = next(c for c in fits if c.pp > 1 and c.virtual_pipeline == 1)
    twin = next(c for c in fits if c.pp > 1 and c.virtual_pipeline > 1 and c not in deep)
    assert len(flat) == 4 and len(deep) == 3
    assert (target.tp, target.pp, target.micro_batch, target.recompute) == (twin.tp, twin.pp, twin.micro_batch,
                                                                            twin.recompute)
    s = GuidedSearcher(MCORE_CANDS, workload=MCORE_W, seed=1)
    for c in flat:
        s.tell(c, measured(c, 0.5, MCORE_W))
    for c in deep:
        s.tell(c, measured(c, 1.0, MCORE_W))
    mu, _ = _posterior(s)
    assert mu[s.index[target]] > mu[s.index[twin]] - 0.06


def test_an_oom_the_measured_peaks_explain_holds_only_its_own_account():
    """Issue 30 round 34 (tuner/search/oom_deferral.py): once measured peaks of the OOM'd layout's activation account
    run 1.3x the model -- its own need past the GPU, explained -- and those of another account 0.9x, the OOM holds
    only its account and its memory twins: a heavier layout of the other account is left to p_fit (a world's fastest
    was hidden so for a whole budget behind a ZeRO-0 OOM). Before any peak it held them all (the test above), and
    one the peaks do not explain still does (tests/test_measurements_only.py)."""
    W, CANDS = REAL_W, load_space("frontier-2023").enumerate_layouts(REAL_W)    # the GCD's allocatable 68.7 GB
    preds = {c: predict(c, W) for c in CANDS}
    full = [c for c in CANDS if c.recompute == "full" and preds[c].fits]
    oom = min(full, key=lambda c: abs(preds[c].memory_gb - 0.8 * W.cluster.memory_gb))
    stage, bound = preds[oom].memory_stage, preds[oom].memory_gb
    s = GuidedSearcher(CANDS, workload=W, seed=3)
    s.tell(oom, TrialResult(Status.OOM, message="out of memory"))
    over = [c for c in CANDS if c != oom and preds[c].memory_stage == stage and preds[c].memory_gb >= bound]
    assert over and all(s.deferred[s.index[c]] for c in over)          # nothing measured yet: it holds them all
    kin = [c for c in CANDS if activation_account(c) == activation_account(oom) and c != oom
           and 1.3 * preds[c].memory_gb < 0.95 * W.cluster.memory_gb]
    other = [c for c in CANDS if c.recompute == "none" and preds[c].fits and preds[c].memory_gb < 0.7 * bound]
    assert len(kin) >= 2 and len(other) >= 2
    told = [(c, 1.3) for c in kin[:3]] + [(c, 0.9) for c in other[::max(len(other) // 4, 1)][:4]]
    for c, factor in told:
        s.tell(c, metrics.complete(TrialResult(Status.OK, mfu=preds[c].mfu, peak_memory_gb=factor * preds[c].memory_gb),
                                   W, c))
    s.ask(1)
    near = lambda c: (math.log(preds[c].memory_gb / bound) <= RESOLUTION        # noqa: E731
                      and _layout_distance(s, c, oom) <= FAR_REACH)              # a twin: as heavy, and alike
    free = [c for c in over if not s.used[s.index[c]]]
    own = [c for c in free if activation_account(c) == activation_account(oom) or near(c)]
    rest = [c for c in free if c not in own]
    largest = max(f * preds[c].memory_gb for c, f in told)               # a measured peak as large lets a twin go
    assert all(s.deferred[s.index[c]] for c in own if preds[c].memory_gb > largest)
    assert any(preds[c].memory_gb > largest for c in own)
    assert rest and not any(s.deferred[s.index[c]] and not s.oom.structural[s.index[c]] for c in rest)


def _layout_distance(s: GuidedSearcher, a: Layout, b: Layout) -> float:
    """The distance of two candidates in the correction's layout coordinates (tuner.correction.LAYOUT_DIMS)."""
    return float(np.sqrt(layout_d2(s.Z[[s.index[a]]], [s.Z[s.index[b]]])[0]))


def test_an_oom_below_a_measured_peak_holds_only_its_account_and_its_near_twins():
    """Issue 30 round 40 (tuner/search/oom_deferral.py): an OOM no measured peak explains speaks of the GPU's usable
    memory and holds every heavier layout; once a layout ran with a measured peak at least the OOM'd one's predicted
    need, the GPU held that much, and the OOM is its own layout's error: it holds only its activation account and its
    twins -- as heavy within a run's spread and within FAR_REACH in layout coordinates, where the learned memory
    cannot set them apart by evidence. A layout as heavy but unlike it is left to p_fit (a Frontier 1T world: a pp-1
    ZeRO-3 OOM at a predicted 56.5 GB held its fastest, a pp-64 layout predicted at 58.6 GB, for the whole budget
    after a pp-128 layout ran at 57.1 GB)."""
    W, CANDS = REAL_W, load_space("frontier-2023").enumerate_layouts(REAL_W)
    preds = {c: predict(c, W) for c in CANDS}
    reserve = W.cluster.memory_reserved_gb
    full = [c for c in CANDS if c.recompute == "full" and preds[c].fits]
    oom = min(full, key=lambda c: abs(preds[c].memory_gb - 0.8 * W.cluster.memory_gb))
    stage, bound = preds[oom].memory_stage, preds[oom].memory_gb
    s = GuidedSearcher(CANDS, workload=W, seed=3)
    s.tell(oom, TrialResult(Status.OOM, message="out of memory"))

    def ran(c):             # a peak as the model predicts it (the reserve is the prediction's, not the run's)
        s.tell(c, metrics.complete(TrialResult(Status.OK, mfu=preds[c].mfu, peak_memory_gb=preds[c].memory_gb - reserve),
                                   W, c))
    for c in [c for c in CANDS if preds[c].fits and preds[c].memory_gb < 0.6 * bound][:3]:
        ran(c)
    s.ask(1)
    over = [c for c in CANDS if c != oom and preds[c].memory_stage == stage and preds[c].memory_gb >= bound]
    assert over and all(s.deferred[s.index[c]] for c in over if not s.used[s.index[c]])   # unexplained: all held
    big = min((c for c in over if not s.used[s.index[c]] and preds[c].memory_gb - reserve > bound * 1.02
               and preds[c].fits), key=lambda c: preds[c].memory_gb)
    ran(big)
    s.ask(1)
    twin = lambda c: (math.log(preds[c].memory_gb / bound) <= RESOLUTION                   # noqa: E731
                      and _layout_distance(s, c, oom) <= FAR_REACH)
    free = [c for c in over if not s.used[s.index[c]]]
    own = [c for c in free if activation_account(c) == activation_account(oom) or twin(c)]
    rest = [c for c in free if c not in own]
    largest = preds[big].memory_gb - reserve                  # a measured peak as large may let a twin go (p_fit)
    assert all(s.deferred[s.index[c]] for c in own if preds[c].memory_gb > largest)
    assert any(preds[c].memory_gb > largest for c in own)
    far_twins = [c for c in rest if math.log(preds[c].memory_gb / bound) <= RESOLUTION]    # as heavy, unlike it
    assert far_twins and not any(s.deferred[s.index[c]] and not s.oom.structural[s.index[c]] for c in rest)


def test_measured_peaks_may_raise_a_deferred_layouts_p_fit_and_an_oom_never_does():
    """Issue 30 round 34 (GuidedSearcher.p_fit): an OOM's widening of the memory correction never makes a layout likelier
    to fit than the measured peaks alone say, but peaks below the model may lift a layout the OOM holds above the
    model's own prior -- round 33 capped it at that prior, so a held layout predicted past the GPU could never reach
    the p_fit its release needs, however far below the model its kind ran."""
    from tuner.correction import Observations

    W, CANDS = REAL_W, load_space("frontier-2023").enumerate_layouts(REAL_W)
    preds = {c: predict(c, W) for c in CANDS}
    full = [c for c in CANDS if c.recompute == "full" and preds[c].fits]
    oom = min(full, key=lambda c: abs(preds[c].memory_gb - 0.8 * W.cluster.memory_gb))
    s = GuidedSearcher(CANDS, workload=W, seed=3)
    s.tell(oom, TrialResult(Status.OOM, message="out of memory"))
    light = sorted((c for c in CANDS if c.recompute == "none" and preds[c].fits), key=lambda c: preds[c].memory_gb)
    for c in light[::max(len(light) // 6, 1)][:6]:
        s.tell(c, metrics.complete(TrialResult(Status.OK, mfu=preds[c].mfu, peak_memory_gb=0.7 * preds[c].memory_gb),
                                   W, c))
    s.ask(1)
    fit = s.p_fit()
    mem = s._memory_obs()
    alone = s._fit_by(Observations(mZ=mem.mZ, mF=mem.mF, my=mem.my, mnoise=mem.mnoise).memory_gp(s.memory_sd))
    assert np.all(fit <= alone + 1e-12)                                      # the OOM never raises a p_fit
    held = np.flatnonzero(s.oom.heavier & ~s.used)
    assert held.size and np.any(fit[held] > s.prior_fit[held] + 0.1)         # the peaks lift some held ones


def test_each_asked_layout_keeps_the_belief_it_was_chosen_on():
    """GuidedSearcher.beliefs_at_ask (benchmarks/ext_search.py scores the search's uncertainty with it): the first pick,
    with nothing measured, is believed at the model's own prediction; once that favourite ran at half its prediction,
    the next layout asked is believed well below its own prediction; none surer than the fit's noise; first picks are
    flagged as such and the trials expected improvement chose are not."""
    s = GuidedSearcher(CANDS, workload=W, seed=3)
    first = s.ask(1)[0]
    mean, sd, is_first = s.beliefs_at_ask[first]
    assert is_first and mean == pytest.approx(s.log_pred[s.index[first]]) and sd > 0.02
    s.tell(first, measured(first, 0.5))
    asked = [first]
    while len(asked) < 6:
        lay = s.ask(1)[0]
        asked.append(lay)
        s.tell(lay, measured(lay))
    assert set(s.beliefs_at_ask) == set(asked)
    assert [s.beliefs_at_ask[lay][2] for lay in asked] == [True] * s.n_initial + [False] * (6 - s.n_initial)
    assert s.beliefs_at_ask[asked[1]][0] < s.log_pred[s.index[asked[1]]] - 0.1
    assert all(0.025 <= s.beliefs_at_ask[lay][1] < 1.0 for lay in asked)
