"""The time correction tells apart an expert group inside a node from one that leaves it (issue 30 round 21): the
token all-to-all of ep x etp consecutive ranks runs over the node's links or over the NIC, another transport, so a
model error measured where the expert group leaves the node is not carried to an expert split that stays inside it
(traced on the MoE world: splits of 16 or more ranks ran at 0.67-0.74 of their prediction, splits of 8 or fewer at
0.84-0.97, and the correction carried the first to ep-8 splits inside a node). The memory correction does not read
it."""

from __future__ import annotations

import math
from dataclasses import replace

import tuner.correction as correction
from tuner.correction import Observations, expert_leaves_node, features
from tuner.layout import Layout
from tuner.specs import make_workload
from tuner.trial import Status

W = make_workload("mixtral-8x7b", 8, "h100", framework="megatron-core")
BASE = Layout(tp=1, pp=2, virtual_pipeline=8, dp=32, expert_parallel=2, expert_tensor_parallel=2, micro_batch=1,
              zero_stage=1, recompute="none")
INSIDE = [(2, 2, 0.96), (2, 4, 0.97), (4, 1, 0.95), (1, 1, 0.98)]           # (ep, etp, measured / predicted)
LEAVING = [(8, 2, 0.70), (4, 4, 0.72), (8, 4, 0.68), (4, 8, 0.71)]
QUERY = replace(BASE, expert_parallel=8, expert_tensor_parallel=1)             # 8 ranks: inside an 8-GPU node


def _residual() -> float:
    obs = Observations()
    for ep, etp, ratio in INSIDE + LEAVING:
        ft = features(replace(BASE, expert_parallel=ep, expert_tensor_parallel=etp), W)
        obs.add_result(ft, Status.OK, ratio * math.exp(ft.log_pred), None, None)
    ft = features(QUERY, W)
    mu, _ = obs.time_gp().predict(ft.z.reshape(1, -1), ft.f.reshape(1, -1))
    return float(mu[0])


def test_the_expert_group_leaves_the_node_beyond_its_ranks():
    assert expert_leaves_node(QUERY, W) == 0.0
    assert expert_leaves_node(replace(QUERY, expert_tensor_parallel=2), W) == 1.0
    assert expert_leaves_node(replace(QUERY, expert_parallel=1), W) == 0.0


def test_an_error_where_experts_leave_the_node_does_not_carry_inside_it(monkeypatch):
    apart = _residual()
    monkeypatch.setattr(correction, "expert_leaves_node", lambda layout, workload: 0.0)   # as before: one coordinate less
    together = _residual()
    assert apart > math.log(0.9) > together, (apart, together)
