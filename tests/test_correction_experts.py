"""The correction tells expert-parallel layouts apart (issue 30 round 11): its layout coordinates carry the expert
degrees (ep, etp), so a model error measured on one expert split is carried to that split at another node count and
not to a neighbour that differs only in how its experts are split. Traced on the MoE world: two ep-8 trials ran at
0.71 of their prediction, an ep-4 etp-2 one at 0.94; `best --nodes 2N` recommended the unmeasured ep-8 sibling of the
ep-4 etp-2 trial, rated as that trial, at 0.74 of the fastest."""

from __future__ import annotations

import math
from dataclasses import replace

from tuner.correction import Observations, features
from tuner.layout import Layout
from tuner.specs import make_workload
from tuner.trial import Status

W8, W16 = (make_workload("mixtral-8x7b", n, "h100", framework="megatron-core") for n in (8, 16))
SPLIT = Layout(tp=2, sequence_parallel=True, pp=4, virtual_pipeline=8, dp=8, expert_parallel=4,
               expert_tensor_parallel=2, micro_batch=2, zero_stage=1, recompute="none")
EP8 = replace(SPLIT, expert_parallel=8, expert_tensor_parallel=1)


def observed(pairs) -> Observations:
    obs = Observations()
    for lay, ratio in pairs:
        ft = features(lay, W8)
        obs.add_result(ft, Status.OK, ratio * math.exp(ft.log_pred), None, None)
    return obs


def test_an_expert_split_error_carries_to_that_split_not_to_its_sibling():
    obs = observed([(SPLIT, 0.94), (EP8, 0.71)])
    gp = obs.time_gp()
    rows = [features(replace(lay, dp=16), W16) for lay in (SPLIT, EP8)]
    mu, _ = gp.predict([f.z for f in rows], [f.f for f in rows])
    assert mu[1] < mu[0] - 0.1          # the ep-8 layout at 2N keeps the ep-8 trial's error


def test_an_unmeasured_expert_split_is_far_from_a_measured_one():
    obs = observed([(SPLIT, 0.94), (replace(SPLIT, micro_batch=1), 0.80)])
    far = obs.far_sd([features(replace(lay, dp=16), W16).z for lay in (SPLIT, EP8)])
    assert far[1] > far[0] + 0.01
