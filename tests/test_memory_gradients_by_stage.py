"""The memory correction reads the gradients' share under its ZeRO stage's name (tuner.correction.memory_features,
issue 30 round 46): each stage's gradients are another optimizer's buffers, so a buffer the model's account lacks at
one stage (an fp32 accumulation buffer beside DeepSpeed ZeRO-1's bf16 gradients) is learned as that stage's factor and
carried to the data-parallel sizes nobody measured, where the sharded states shrink and the whole buffer does not."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from tuner.correction import FM_DIM, Observations, features, memory_features
from tuner.frameworks import ALLOCATOR_SD, of as framework_of
from tuner.layout import Layout
from tuner.perfmodel import memory_prior_sd, memory_shares, predict
from tuner.specs import make_workload
from tuner.trial import Status

W16, W32 = (make_workload("175b", n, "frontier", framework="megatron-deepspeed") for n in (16, 32))
Z1 = Layout(tp=4, sequence_parallel=False, pp=16, dp=2, micro_batch=1, zero_stage=1, recompute="full")
MEASURED = [replace(Z1, pp=32, dp=1), Z1, replace(Z1, tp=8, pp=8), replace(Z1, zero_stage=0),
            replace(Z1, tp=2, pp=32, zero_stage=0), replace(Z1, micro_batch=2)]
ASKED = replace(Z1, pp=8, dp=8)          # 32 nodes: twice the layers a stage and four times the data-parallel group


def true_gb(layout: Layout, workload) -> float:
    """What the GPU needs where ZeRO-1 keeps an fp32 gradient buffer the account lacks: 4 more bytes a parameter, twice
    its 2-byte gradients; ZeRO-0 (BF16_Optimizer under the pipeline) as the account has it."""
    p = predict(layout, workload)
    extra = 2.0 * p.memory_breakdown["gradients"] if layout.zero_stage == 1 else 0.0
    return p.memory_gb + extra


def test_the_gradients_share_sits_in_its_stages_slot_and_the_prior_is_unchanged():
    w = make_workload("22b", 8, "frontier", framework="megatron-deepspeed")
    base = Layout(tp=2, sequence_parallel=False, pp=4, dp=8, micro_batch=1, zero_stage=0, recompute="full")
    for stage in range(4):
        lay = replace(base, zero_stage=stage)
        bd = {k: v for k, v in predict(lay, w).memory_breakdown.items() if k not in ("total", "params_billion")}
        fm = memory_features(bd, lay.recompute, stage)
        grads = memory_shares(bd)[1]
        assert len(fm) == FM_DIM and grads > 0.0
        slot = 1 if stage == 0 else FM_DIM - 4 + stage           # MEMORY_KEYS' gradients; after the modes
        assert fm[slot] == pytest.approx(grads)
        assert fm[[1, FM_DIM - 3, FM_DIM - 2, FM_DIM - 1]].sum() == pytest.approx(grads)     # in that slot alone
        # the same shares, one moved: the correction's prior (no data) is the account's prior p_fit reads
        ft = features(lay, w)
        _, sd = Observations().memory_gp(framework_of(w).memory_sd).predict(ft.z[None], ft.fm[None])
        assert math.hypot(float(sd[0]), ALLOCATOR_SD) == pytest.approx(
            memory_prior_sd(framework_of(w).memory_sd, memory_shares(bd)), rel=1e-9)


def test_a_buffer_only_zero_1_keeps_carries_to_a_larger_data_parallel_group():
    obs = Observations()
    for lay in MEASURED:
        p = predict(lay, W16)
        obs.add_result(features(lay, W16, p), Status.OK, p.mfu, true_gb(lay, W16) - W16.cluster.memory_reserved_gb,
                       W16.cluster.memory_gb)
    ft = features(ASKED, W32)
    (mu,), (sd,) = obs.memory_gp(framework_of(W32).memory_sd).predict(ft.z[None], ft.fm[None])
    truth = math.log(true_gb(ASKED, W32)) - ft.log_mem
    seen = max(y for y in obs.my)
    assert truth > seen + 0.05              # the asked layout's buffer is a larger share than any measured one's
    assert abs(mu - truth) < 0.05 and abs(mu - truth) < 1.5 * sd + 0.01
