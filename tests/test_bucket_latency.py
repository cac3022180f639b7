"""Megatron-Core's gradient buckets each pay NCCL's ring latency (issues 25 / 26): NCCL's own latency model for a ring
reduce-scatter / all-gather (comm.nccl_ring_latency), the buckets a step runs (buckets.bucket_count), and predict
charging every bucket but the first on NVIDIA's stacks, where its data-parallel collectives show."""

from __future__ import annotations

import dataclasses

import pytest

import tuner.perfmodel as pm
from tuner.layout import Layout
from tuner.perfmodel import buckets, comm, predict
from tuner.perfmodel.buckets import default_bucket_size
from tuner.specs import load_model, make_workload


def test_nccl_ring_latency_is_tuning_cc_s_simple_ring():
    # 8 ranks in one NVLink domain: base + 7 NVLink steps; 32 ranks over 4 nodes: 28 NVLink steps and 3 network steps
    assert comm.nccl_ring_latency(8, 1) == pytest.approx((8.4 + 7 * 3.4) * 1e-6)
    assert comm.nccl_ring_latency(32, 4) == pytest.approx((8.4 + 28 * 3.4 + 3 * 14.0) * 1e-6)
    assert comm.nccl_ring_latency(1, 1) == 0.0
    assert comm.nccl_ring_latency(256, 32) > comm.nccl_ring_latency(256, 1)      # network steps cost more
    # a ring all-reduce (Megatron-Core without the distributed optimizer) runs 2 (n - 1) steps after one base
    assert comm.nccl_ring_latency(32, 4, allreduce=True) == pytest.approx((8.4 + 2 * (28 * 3.4 + 3 * 14.0)) * 1e-6)


def test_without_the_distributed_optimizer_each_bucket_pays_an_all_reduce():
    w = make_workload("llama3-8b", 8, "b200", 32, "fp8", "megatron-core")
    z1 = Layout(tp=1, pp=1, dp=32, context_parallel=2, micro_batch=1, recompute="none", zero_stage=1)
    z0 = dataclasses.replace(z1, zero_stage=0)
    n = buckets.bucket_count(w.model, z1) - 1
    assert pm.bucket_latency(z1, w) == pytest.approx(n * comm.nccl_ring_latency(64, 8))
    assert pm.bucket_latency(z0, w) == pytest.approx(n * comm.nccl_ring_latency(64, 8, allreduce=True))


def test_bucket_count_follows_the_default_bucket_and_the_chunks():
    m = load_model("llama3-8b")
    lay = Layout(tp=1, pp=1, dp=16, micro_batch=1, recompute="none")
    params = buckets._first_chunk_params(m, lay)
    n16 = buckets.bucket_count(m, lay)
    # a bucket closes at a parameter's boundary once it holds the bucket size (fc1 alone is 117M elements), so every
    # closed bucket holds at least that; the last one is what the walk leaves
    assert (n16 - 1) * default_bucket_size(16) <= sum(params) and n16 <= len(params)
    assert n16 == 98
    assert buckets.bucket_count(m, dataclasses.replace(lay, dp=256)) < n16 / 3       # 1M x dp elements a bucket
    # interleaving: pipeline rank 0's later chunks are one bucket each
    pp = Layout(tp=1, pp=2, dp=8, micro_batch=1, recompute="none")
    assert buckets.bucket_count(m, pp, bucket_size=1e18) == 1
    assert buckets.bucket_count(m, dataclasses.replace(pp, virtual_pipeline=2), bucket_size=1e18) == 2


def _without_latency(monkeypatch):
    monkeypatch.setattr(pm, "bucket_latency", lambda layout, workload: 0.0)


def test_megatron_core_shows_the_buckets_latency_where_its_forward_is_short(monkeypatch):
    # bf16: under FP8 the parameter all-gather moves one byte a weight (quantized.gather_bytes, 6cccf3e) and hides
    # whole under this forward, so only bf16's gather still shows the buckets' latency
    w = make_workload("llama3-8b", 8, "b200", 32, "bf16", "megatron-core")
    lay = Layout(tp=1, pp=1, dp=32, context_parallel=2, micro_batch=1, recompute="none")
    with_it = predict(lay, w)
    lat = pm.bucket_latency(lay, w)
    assert lat == pytest.approx((buckets.bucket_count(w.model, lay) - 1) * comm.nccl_ring_latency(64, 8))
    _without_latency(monkeypatch)
    without = predict(lay, w)
    grew = with_it.step_time_s - without.step_time_s
    assert 0.0 < grew <= 2 * lat + 1e-12          # at most every bucket's reduce-scatter and all-gather latency
    assert with_it.time_breakdown["dp_param_gather"] > without.time_breakdown["dp_param_gather"]


def test_other_stacks_are_charged_as_before(monkeypatch):
    lay = Layout(tp=1, pp=1, dp=32, micro_batch=1, recompute="none")
    cases = [make_workload("llama3-8b", 4, "b200", 32, "fp8", "megatron-deepspeed"),
             make_workload("llama3-8b", 4, "mi300x", 32, "bf16", "megatron-core")]       # RCCL's constants not read
    before = [predict(lay, w).step_time_s for w in cases]
    _without_latency(monkeypatch)
    assert [predict(lay, w).step_time_s for w in cases] == before
