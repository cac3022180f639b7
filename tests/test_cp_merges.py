"""Context parallelism's merges of the ring's partial attention results (issue 26): Transformer Engine's p2p ring
merges each step's output (forward) and dq, dk, dv (backward) in element-wise kernels of their own, which a layer
without context parallelism does not run (tuner.perfmodel.compute.cp_merge_bytes)."""

import pytest

from tuner.perfmodel import compute
from tuner.specs import load_cluster, load_model


def _hbm(cluster):
    return cluster.hbm_bandwidth_gbps * 1e9 * cluster.memory_bandwidth_efficiency


def test_context_parallel_merges_are_charged_as_hbm_traffic():
    model, cluster = load_model("llama3-8b"), load_cluster("b200")
    assert compute.cp_merge_bytes(model, compute.Shape(b=1)) == (0.0, 0.0)
    two = compute.Shape(b=2, c=2)                  # the same tokens per rank as cp 1 at b 1
    fwd, bwd = compute.cp_merge_bytes(model, two)
    # 4 bytes for the first step's result, 6 per later step, 0.75 of a whole tensor per later step (causal halves)
    assert fwd == pytest.approx(model.seq_length * 8.5 * model.o_width)
    assert bwd == pytest.approx(model.seq_length * 8.5 * (model.q_width + 2 * model.kv_size))
    one = compute.layer_times(model, cluster, compute.Shape(b=1))
    assert compute.layer_times(model, cluster, two)["elementwise"] - one["elementwise"] == pytest.approx(
        (fwd + bwd) / _hbm(cluster))


def test_merges_grow_with_the_ring_and_split_with_tp():
    model = load_model("llama3-70b")
    f2, b2 = compute.cp_merge_bytes(model, compute.Shape(b=2, c=2))
    f8, b8 = compute.cp_merge_bytes(model, compute.Shape(b=8, c=8))      # one token share per rank each time
    assert f8 / f2 == pytest.approx((4 + 4.5 * 7) / (4 + 4.5))
    assert compute.cp_merge_bytes(model, compute.Shape(b=2, c=2, t=4))[1] == pytest.approx(b2 / 4)


def test_a_recomputed_attention_core_merges_again():
    model, cluster = load_model("llama3-8b"), load_cluster("h100")
    fwd, bwd = compute.cp_merge_bytes(model, compute.Shape(b=2, c=2))
    sel = compute.layer_times(model, cluster, compute.Shape(b=2, c=2, recompute="selective"))
    sel1 = compute.layer_times(model, cluster, compute.Shape(b=1, recompute="selective"))
    assert sel["elementwise"] - sel1["elementwise"] == pytest.approx((2 * fwd + bwd) / _hbm(cluster))
