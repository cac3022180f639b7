"""`best` at a node count nobody measured states p_fit with the memory correction's sd widened away from every layout
whose memory a trial showed (tuner.correction memory_far_sd, issue 30): on the worlds that share none of the model's
formulas, the 2N layouts unlike any measured one stated p_fit above the rate at which they ran."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from tuner.best import _p_fit, corrected
from tuner.correction import Observations, features
from tuner.frameworks import ALLOCATOR_BIAS, ALLOCATOR_SD, of as framework_of
from tuner.layout import Layout
from tuner.perfmodel import predict
from tuner.specs import make_workload
from tuner.trial import Status

W2, W4 = (make_workload("llama3-8b", n, "h100", framework="megatron-core") for n in (2, 4))
A = Layout(tp=2, sequence_parallel=True, pp=1, dp=8, micro_batch=2, zero_stage=1, recompute="none")
B = replace(A, micro_batch=1)
FAR = Layout(tp=8, sequence_parallel=True, pp=2, dp=1, micro_batch=8, zero_stage=0, recompute="full")


def measured(pairs) -> Observations:
    """Observations of OK trials at 2 nodes whose peaks ran `ratio` times the prediction."""
    obs = Observations()
    for lay, ratio in pairs:
        p = predict(lay, W2)
        ft = features(lay, W2, p)
        obs.add_result(ft, Status.OK, p.mfu, ratio * p.memory_gb, W2.cluster.memory_gb)
    return obs


def test_zero_where_memory_was_shown_and_the_peaks_spread_far_from_it():
    obs = measured([(A, 1.25), (B, 0.80)])
    spread = float(np.std(obs.my))
    z = [features(lay, W2).z for lay in (A, B, FAR)]
    far = obs.memory_far_sd(z)
    assert far[0] == pytest.approx(0.0, abs=1e-12) and far[1] == pytest.approx(0.0, abs=1e-12)
    assert spread * 0.5 < far[2] <= spread
    assert not measured([(A, 1.12)]).memory_far_sd(z).any()       # one peak: no spread to carry


def test_an_oom_shows_its_layouts_memory_too():
    obs = measured([(A, 1.25), (B, 0.80)])
    z_far = [features(FAR, W2).z]
    before = obs.memory_far_sd(z_far)[0]
    p = predict(FAR, W2)
    obs.add_result(features(FAR, W2, p), Status.OOM, None, None, W2.cluster.memory_gb)
    assert before > 0.0 and obs.memory_far_sd(z_far)[0] == pytest.approx(0.0, abs=1e-12)


def test_best_states_p_fit_with_the_widened_sd_far_from_the_trials():
    obs = measured([(A, 1.25), (B, 0.80)])
    lay = replace(FAR, dp=2)
    ft = features(lay, W4, predict(lay, W4))
    mmu, msd = obs.memory_gp(framework_of(W4).memory_sd).predict([ft.z], [ft.fm])
    mu, sd, far = float(mmu[0]), float(msd[0]), float(obs.memory_far_sd([ft.z])[0])
    # a capacity where the unwidened p_fit is 0.93: inside the band where the 2N answers stated more than ran
    cap = math.exp(ft.log_mem + mu + ALLOCATOR_BIAS + 1.5 * math.hypot(sd, ALLOCATOR_SD))
    w = replace(W4, cluster=replace(W4.cluster, memory_gb=cap))
    row = corrected([lay], w, obs)[0]
    narrow = _p_fit(ft.log_mem, mu, sd, cap)
    assert narrow == pytest.approx(0.933, abs=0.001)
    assert row["p_fit"] == pytest.approx(_p_fit(ft.log_mem, mu, math.hypot(sd, far), cap))
    assert row["p_fit"] < narrow - 0.005
