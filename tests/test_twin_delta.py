"""A measured twin at another dp (issue 30 item 3): `best --nodes 2N` states a layout's p_fit from the twin's measured
peak plus what the model says the layout needs beyond it -- the model's difference between the two (negative where
ZeRO shards more) and the NCCL buffers of its larger data-parallel communicator, which no measured peak holds
(tuner.perfmodel.communicators) -- with that difference's error in the spread."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

from tuner.best import supported_fit, twin_delta, twin_predictions
from tuner.layout import Layout
from tuner.perfmodel import MEMORY_NOISE_SD, fit_probability, predict
from tuner.perfmodel.communicators import communicator_gb, new_dp_group_gb
from tuner.specs import make_workload
from tuner.trial import Status

# Megatron-Core: its ZeRO 0 (no distributed optimizer) keeps every rank's states whole at any dp, where Megatron-DeepSpeed's
# pipeline engine shards them at ZeRO 0 too (BF16_Optimizer, tuner.perfmodel.deepspeed_states; issue 30 round 33)
W2, W4 = make_workload("22b", 2, framework="megatron-core"), make_workload("22b", 4, framework="megatron-core")
CAP, RES = W4.cluster.memory_gb, W4.cluster.memory_reserved_gb
Z0 = Layout(tp=2, pp=8, dp=1, micro_batch=1, zero_stage=0, recompute="none")


def twin(layout: Layout, reserved: float):
    return SimpleNamespace(layout=layout, status=Status.OK, nodes=2, peak_memory_gb=0.6 * reserved, mfu=0.3,
                           model="gpt-22b", cluster="frontier", study=None, runner="command", global_batch=None,
                           peak_reserved_gb=reserved)


def p_at_dp2(layout: Layout, reserved: float, with_delta: bool) -> float:
    target = replace(layout, dp=2)
    delta = twin_delta(target, predict(target, W4).memory_gb, 0.05, twin_predictions(W4)) if with_delta else None
    return supported_fit(target, {replace(layout, dp=1): [twin(layout, reserved)]}, CAP, RES, delta)[0]


def test_a_new_data_parallel_communicator_is_nccl_buffers_outside_the_measured_peak():
    assert communicator_gb(1) == 0.0 and new_dp_group_gb(1, 1) == 0.0
    assert 0.5 < new_dp_group_gb(1, 2) < new_dp_group_gb(1, 8) < 1.0     # NVIDIA/nccl#964: 544 / 688 MB
    assert new_dp_group_gb(2, 4) > 0 and new_dp_group_gb(4, 8) == 0.0


def test_a_dp1_twin_near_capacity_no_longer_supports_dp2_where_the_model_says_dp2_needs_more():
    reserved = CAP - RES - 0.3           # the twin ran 0.3 GB short of the GPU, as alloc-memory 175B's did
    before = p_at_dp2(Z0, reserved, with_delta=False)
    assert before == fit_probability(CAP - 0.3, CAP, MEMORY_NOISE_SD) and before > 0.5
    after = p_at_dp2(Z0, reserved, with_delta=True)
    assert after < 0.5                   # no ZeRO: the same model states, plus dp 2's communicator (0.54 GB)


def test_zero_sharding_over_more_ranks_moves_a_twin_down_and_a_same_dp_twin_keeps_its_peak():
    z1 = replace(Z0, zero_stage=1)
    reserved = CAP - RES - 0.3
    assert p_at_dp2(z1, reserved, with_delta=True) > 0.99 > p_at_dp2(z1, reserved, with_delta=False)
    same = replace(z1, dp=2)
    delta = twin_delta(same, 1e3, 0.05, lambda r: 0.0)   # an absurd difference that must not be read at the same dp
    assert supported_fit(same, {replace(z1, dp=1): [twin(same, reserved)]}, CAP, RES, delta)[0] == \
        fit_probability(CAP - 0.3, CAP, MEMORY_NOISE_SD)
