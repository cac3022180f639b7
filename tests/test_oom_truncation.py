"""An OOM the memory belief already puts above its bound narrows that belief (issue 30 round 43: tuner.gp.truncation_site,
tuner.gp.RatioGP.truncated)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tuner.correction import Observations, features
from tuner.gp import GP, truncation_site
from tuner.perfmodel import predict
from tuner.space import load_space
from tuner.specs import make_workload
from tuner.trial import Status

W = make_workload("22b", 2, "frontier", framework="megatron-deepspeed")
CAP = W.cluster.memory_gb
PREDS = {c: predict(c, W) for c in load_space("default").enumerate_layouts(W)}


@pytest.mark.parametrize("a", [-2.0, -0.7, 0.0, 0.4])
def test_the_site_gives_the_truncated_normals_variance(a):
    """A belief N(0, 1) known to lie above a: observing its mean with the site's noise leaves the variance the
    truncated normal has (numerically integrated here)."""
    x = np.linspace(a, a + 12.0, 200001)
    w = np.exp(-0.5 * x * x)
    m = (w * x).sum() / w.sum()
    var = (w * (x - m) ** 2).sum() / w.sum()
    n = truncation_site(0.0, 1.0, a)
    assert 1.0 * n * n / (1.0 + n * n) == pytest.approx(var, rel=1e-3)


def test_a_bound_far_below_the_belief_says_nothing():
    assert truncation_site(0.0, 0.1, -1.0) == math.inf


def test_a_point_at_the_gps_own_mean_narrows_it_and_moves_no_mean():
    rng = np.random.default_rng(5)
    Z, F = rng.uniform(size=(6, 3)), rng.uniform(size=(6, 2))
    gp = GP(ell=0.5).fit(Z, F, rng.normal(0.0, 0.2, 6), np.full(6, 0.05))
    gp.sd_scale = 1.7
    Zq, Fq = rng.uniform(size=(4, 3)), rng.uniform(size=(4, 2))
    mu0, sd0 = gp.predict(Zq, Fq)
    more = gp.with_points(Zq[:1], Fq[:1], mu0[:1], [0.5 * sd0[0]])
    mu1, sd1 = more.predict(Zq, Fq)
    assert np.allclose(mu1, mu0, atol=1e-9)
    assert sd1[0] == pytest.approx(sd0[0] * math.sqrt(0.25 / 1.25), rel=1e-6)   # the site's noise as predict states it
    assert np.all(sd1 <= sd0 + 1e-12) and sd1[1:].min() < sd0[1:].max()
    assert gp.predict(Zq, Fq)[1] == pytest.approx(sd0)                      # the fitted GP is left as it was


def _layout(recompute: str, tp: int, lo: float, hi: float):
    """A layout with `recompute`, `tp` whose predicted peak is within [lo, hi] x the capacity."""
    return next(c for c, p in PREDS.items() if c.recompute == recompute and c.tp == tp and lo * CAP <= p.memory_gb <= hi * CAP)


def _obs(oom=None) -> Observations:
    """Two measured full-recompute peaks 1.3x the model's; `oom`: a layout that ran out of memory."""
    obs = Observations()
    for c in [_layout("full", 1, 0.4, 0.6), _layout("full", 2, 0.3, 0.5)]:
        ft = features(c, W, PREDS[c])
        obs.add_memory(ft, math.log(1.3), 0.0)
    if oom is not None:
        obs.add_result(features(oom, W, PREDS[oom]), Status.OOM, None, None, CAP)
    return obs


def test_an_oom_above_the_belief_lowers_the_p_fit_of_its_kin_above_the_capacity():
    """No peak without recompute was measured; the peaks put the OOM'd layout without recompute above the capacity
    already, so the OOM does not enter at its bound. It narrows the belief: another tp's layout without recompute that
    the belief puts above the capacity is less likely to fit than before the OOM, its believed mean unchanged."""
    oom = _layout("none", 2, 0.85, 0.95)
    kin = next(c for c in PREDS if c.recompute == "none" and c.tp == 4 and 0.85 * CAP <= PREDS[c].memory_gb <= CAP)
    before, after = _obs().memory_gp(0.06), _obs(oom).memory_gp(0.06)
    ft_o, ft_k = features(oom, W, PREDS[oom]), features(kin, W, PREDS[kin])
    assert before.predict(ft_o.z[None], ft_o.fm[None])[0][0] > math.log(CAP) - ft_o.log_mem + 0.03   # not at its bound
    (m0,), (s0,) = before.predict(ft_k.z[None], ft_k.fm[None])
    (m1,), (s1,) = after.predict(ft_k.z[None], ft_k.fm[None])
    assert ft_k.log_mem + m0 > math.log(CAP)                                  # the belief puts it above the capacity
    assert m1 == pytest.approx(m0, abs=1e-9) and s1 < s0
    fit = lambda m, s: 0.5 * math.erfc((ft_k.log_mem + m - math.log(CAP)) / s / math.sqrt(2))   # noqa: E731
    assert fit(m1, s1) < fit(m0, s0)
