"""Megatron-Core's last gradient bucket (tuner/perfmodel/buckets.py, issue 26 round 2): the bucket that closes the
reverse walk over pipeline rank 0's first chunk holds the word embedding; its reduce-scatter runs after the last
backward and its all-gather before the first forward, whatever the other buckets hide
(megatron/core/distributed/param_and_grad_buffer.py and distrib_optimizer.py at d98e8a64dd)."""

from __future__ import annotations

import dataclasses

import pytest

from tuner import frameworks
from tuner.layout import Layout
from tuner.perfmodel import buckets, comm, predict
from tuner.perfmodel.memory import embedding_params, stage_params
from tuner.specs import load_model, make_workload

LLAMA8 = load_model("llama3-8b")


def test_default_bucket_size_is_megatron_cores():
    assert buckets.default_bucket_size(8) == 40_000_000          # max(40M, 1M x dp)
    assert buckets.default_bucket_size(256) == 256_000_000


def test_the_bucket_size_follows_the_group_the_gradients_reduce_over():
    """Megatron-LM sizes the default bucket by the dp x cp group (training.py resolve_ddp_bucket_size at d98e8a64dd:
    get_pg_size(dp_cp_group)), so dp 32 with cp 2 buckets as dp 64 does, not as dp 32."""
    for model, tp in ((LLAMA8, 1), (LLAMA8, 4), (load_model("llama3-70b"), 2)):
        cp2 = buckets.last_bucket_params(model, Layout(tp=tp, pp=1, dp=32, context_parallel=2, micro_batch=1))
        assert cp2 == buckets.last_bucket_params(model, Layout(tp=tp, pp=1, dp=64, micro_batch=1))
        assert cp2 == buckets.last_bucket_params(model, Layout(tp=tp, pp=1, dp=32, micro_batch=1), 64e6)
        assert cp2 != buckets.last_bucket_params(model, Layout(tp=tp, pp=1, dp=32, micro_batch=1))


def test_the_embedding_closes_the_walk():
    # Llama 3 8B at tp 1: layer 0 walked backwards closes fc2 (58.7M) and fc1 (117.4M) alone, QKV + projection
    # (42.0M) together, so the embedding (525.3M) is the last bucket by itself
    lay = Layout(tp=1, pp=1, dp=8, micro_batch=1)
    assert buckets.last_bucket_params(LLAMA8, lay) == pytest.approx(embedding_params(LLAMA8, 1))
    # a bucket larger than the chunk: one bucket, every weight of the stage (norms left out)
    whole = buckets.last_bucket_params(LLAMA8, lay, bucket_size=1e12)
    assert whole == pytest.approx(stage_params(LLAMA8, lay, 0), rel=1e-3)
    # a bucket between: the remainder holds the embedding and some of the first layers, never more than one bucket
    mid = buckets.last_bucket_params(LLAMA8, lay, bucket_size=768e6)
    assert embedding_params(LLAMA8, 1) <= mid < 768e6 + embedding_params(LLAMA8, 1)


def test_a_shared_embedding_is_a_bucket_of_its_own():
    tied = dataclasses.replace(LLAMA8, tie_embeddings=True)
    lay = Layout(tp=2, pp=4, dp=8, micro_batch=1)
    assert buckets.last_bucket_params(tied, lay) == pytest.approx(embedding_params(tied, 2))


def test_megatron_core_shows_the_last_bucket(monkeypatch):
    monkeypatch.setattr(comm, "NCCL_CTAS", 0)      # the buckets alone, without NCCL's SMs beside what hides
    w = make_workload("llama3-8b", 4, "h100", 512, "fp8", "megatron-core")
    lay = Layout(tp=2, sequence_parallel=True, pp=1, dp=16, micro_batch=2, zero_stage=1)
    pr = predict(lay, w)
    fw = frameworks.of(w)
    tail = comm.dp_time(w.cluster, 2, 16, 1, buckets.last_bucket_params(w.model, lay), 16, False, fw.grad_bytes(w))
    assert pr.time_breakdown["dp_grad_reduce"] == pytest.approx(tail["grad_reduce"]) and tail["grad_reduce"] > 0
    assert pr.time_breakdown["dp_param_gather"] == pytest.approx(tail["param_gather"]) and tail["param_gather"] > 0
    bare = dataclasses.replace(frameworks.FRAMEWORKS["megatron-core"], overlaps=frozenset())
    monkeypatch.setitem(frameworks.FRAMEWORKS, "megatron-core", bare)
    whole = predict(lay, w).time_breakdown
    assert whole["dp_grad_reduce"] > pr.time_breakdown["dp_grad_reduce"]      # the other buckets hide
