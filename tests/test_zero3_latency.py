"""DeepSpeed ZeRO-3's collectives each pay NCCL's ring latency (issue 25 item 4): DeepSpeed gathers a prefetch group
and reduce-scatters a reduce bucket at a time (buckets.zero3_collectives), so a Megatron-DeepSpeed ZeRO-3 step pays
comm.nccl_ring_latency once per group and bucket, each pass, each micro-batch -- not once per pass."""

from __future__ import annotations

import dataclasses

import pytest

import tuner.perfmodel as pm
from tuner.layout import Layout
from tuner.perfmodel import buckets, comm, predict
from tuner.specs import load_model, make_workload


def test_zero3_counts_deepspeed_s_groups_and_buckets():
    lay = Layout(tp=1, pp=1, dp=64, micro_batch=1, recompute="full", zero_stage=3)
    # GPT-3 175B: every weight holds >= 5e7 elements, so each is its own gather (DeepSpeed v0.3.14: one per parameter,
    # the same count) and each its own reduce bucket (none two fit in 5e8): 4 a layer and the word embedding
    big = load_model("gpt-175b")
    assert buckets.zero3_collectives(big, lay) == (4 * big.num_layers + 1, 4 * big.num_layers + 1)
    # a small model's weights coalesce: each gather holds >= 5e7 elements, each bucket <= 5e8
    small = load_model("llama3-8b")
    params = buckets._first_chunk_params(small, lay)
    gathers, reduces = buckets.zero3_collectives(small, lay)
    assert gathers < len(params) and (gathers - 1) * buckets.DS_PREFETCH_BUCKET <= sum(params)
    assert reduces * buckets.DS_REDUCE_BUCKET >= sum(params) and reduces < gathers


def test_megatron_deepspeed_zero3_pays_each_collective_s_latency(monkeypatch):
    w = make_workload("gpt-175b", 192, "a100", 1536, "bf16", "megatron-deepspeed")
    lay = Layout(tp=1, pp=1, dp=1536, micro_batch=1, recompute="full", zero_stage=3)
    gathers, reduces = buckets.zero3_collectives(w.model, lay)
    lat = comm.nccl_ring_latency(1536, 192)
    assert pm.zero3_latency(lay, w) == pytest.approx((3 * (gathers - 1) * lat, (reduces - 1) * lat))
    with_it = predict(lay, w)
    monkeypatch.setattr(pm, "zero3_latency", lambda layout, workload: (0.0, 0.0))
    without = predict(lay, w)
    # one micro-batch a step: 385 gathers in each of three passes and 385 reduce-scatters, ~7 ms each over 192 nodes
    grew = with_it.step_time_s - without.step_time_s
    assert grew == pytest.approx((3 * (gathers - 1) + reduces - 1) * lat) and grew > 10.0
    assert with_it.time_breakdown["dp_param_gather"] > without.time_breakdown["dp_param_gather"]


def test_other_stages_and_stacks_are_charged_as_before(monkeypatch):
    z3 = Layout(tp=1, pp=1, dp=32, micro_batch=1, recompute="full", zero_stage=3)
    cases = [(make_workload("llama3-8b", 4, "a100", 32, "bf16", "megatron-deepspeed"), dataclasses.replace(z3, zero_stage=1)),
             (make_workload("llama3-8b", 4, "mi300x", 32, "bf16", "megatron-deepspeed"), z3),   # RCCL's constants not read
             (make_workload("llama3-8b", 4, "a100", 32, "bf16", "megatron-core"), z3)]          # Megatron-FSDP: its own rule
    before = [predict(lay, w).step_time_s for w, lay in cases]
    monkeypatch.setattr(pm, "zero3_latency", lambda layout, workload: (0.0, 0.0))
    assert [predict(lay, w).step_time_s for w, lay in cases] == before
