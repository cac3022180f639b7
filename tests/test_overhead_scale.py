"""The time correction may read the cluster file's fixed cost per micro-batch and chunk as many times dearer
(issue 30 round 39, tuner.correction.OVERHEAD_SCALES): that constant is a guess, and a host loop can cost ten times
it, beyond what a linear term in its small share can learn. The GP's prior mean carries the multiple, chosen by
marginal likelihood."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

import tuner.correction as correction
from tuner.correction import Observations, features
from tuner.gp import GP
from tuner.perfmodel import predict
from tuner.space import load_space
from tuner.specs import make_workload
from tuner.trial import Status

W = make_workload("175b", 16, "frontier", framework="megatron-core")
#: the same machine with a host loop ten times the file's figure per micro-batch and chunk (frontier.toml: 2 ms)
DEAR = dataclasses.replace(W, cluster=dataclasses.replace(
    W.cluster, microbatch_overhead_ms=10.0 * W.cluster.microbatch_overhead_ms))
CANDS = [c for c in load_space().enumerate_layouts(W) if predict(c, W).fits]


def test_the_prior_mean_is_the_time_a_share_takes_scaled():
    F = np.array([[0.0, 0.05], [0.0, 0.0]])
    assert np.allclose(GP().mean(F), 0.0)
    assert np.allclose(GP(scale=10.0, scaled_col=1).mean(F), [-math.log(1.45), 0.0])
    mu, _ = GP(scale=10.0, scaled_col=1).predict(np.zeros((2, 3)), F)      # nothing measured: the prior mean
    assert mu[0] == pytest.approx(-math.log(1.45)) and mu[1] == 0.0


def _fit(measured: list) -> GP:
    """The time GP after `measured` layouts ran at DEAR's predicted speed."""
    obs = Observations()
    for lay in measured:
        obs.add_result(features(lay, W), Status.OK, predict(lay, DEAR).mfu, None, W.cluster.memory_gb)
    return obs.time_gp()


def _error(gp: GP, lay) -> float:
    """|log(corrected prediction / DEAR's)| of an unmeasured layout."""
    ft = features(lay, W)
    mu, _ = gp.predict(ft.z.reshape(1, -1), ft.f.reshape(1, -1))
    return abs(ft.log_pred + float(mu[0]) - math.log(predict(lay, DEAR).mfu))


def test_a_host_loop_ten_times_the_files_guess_is_learned_from_eight_trials(monkeypatch):
    rng = np.random.default_rng(3)
    picks = rng.choice(len(CANDS), 40, replace=False)
    measured, unmeasured = [CANDS[i] for i in picks[:8]], [CANDS[i] for i in picks[8:]]
    gp = _fit(measured)
    assert gp.scale == 10.0
    errors = [_error(gp, lay) for lay in unmeasured]
    monkeypatch.setattr(correction, "OVERHEAD_SCALES", (1.0,))          # the linear term alone, as before
    linear = _fit(measured)
    before = [_error(linear, lay) for lay in unmeasured]
    assert max(errors) < 0.01 < max(before), (max(errors), max(before))
    assert np.median(errors) < 0.5 * np.median(before)


def test_the_files_figure_wins_where_the_runs_agree_with_it():
    obs = Observations()
    for lay in CANDS[:8]:
        obs.add_result(features(lay, W), Status.OK, predict(lay, W).mfu, None, W.cluster.memory_gb)
    assert obs.time_gp().scale == 1.0
