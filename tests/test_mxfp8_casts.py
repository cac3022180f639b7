"""Transformer Engine's MXFP8 quantize writes both copies of a GEMM input in one pass (issue 26, fifteenth session):
tuner.perfmodel.compute.cast_units / MXFP8_ONE_PASS_BYTES."""

from __future__ import annotations

import dataclasses

import pytest

from tuner.layout import Layout
from tuner.perfmodel import compute
from tuner.specs import make_workload

LAYOUT = Layout(tp=2, sequence_parallel=True, pp=1, dp=4, micro_batch=1, zero_stage=1, recompute="none")


def _cast_bytes(precision: str, framework: str, cluster: str = "b200") -> float:
    w = make_workload("llama3-8b", 1, cluster, 64, precision=precision, framework=framework)
    return compute.shape_of(LAYOUT, w).casts * compute.FP8_CAST_BYTES


def test_megatron_cores_mxfp8_reads_each_input_once_and_writes_two_scaled_copies():
    assert compute.MXFP8_ONE_PASS_BYTES == pytest.approx(2.0 + 2.0 + 2.0 / 32.0)
    assert _cast_bytes("mxfp8", "megatron-core") == pytest.approx(4.0625)
    # per-tensor FP8 one cast (read 2, write 1); NVFP4 and torchao's MXFP8 two casts, as before
    assert _cast_bytes("fp8", "megatron-core") == pytest.approx(3.0)
    assert _cast_bytes("nvfp4", "megatron-core") == pytest.approx(6.0)
    assert _cast_bytes("mxfp8", "torchtitan") == pytest.approx(6.0)
    # the one-pass kernel cited is CUDA Transformer Engine's: ROCm TE's MXFP8 on CDNA 4 keeps two casts
    assert _cast_bytes("mxfp8", "megatron-core", "mi355x") == pytest.approx(6.0)


def test_the_one_pass_takes_the_second_casts_traffic_off_a_layer_and_nothing_else():
    w = make_workload("llama3-8b", 1, "b200", 64, precision="mxfp8", framework="megatron-core")
    sh = compute.shape_of(LAYOUT, w)
    two = dataclasses.replace(sh, casts=2.0)
    m, t = w.model, sh.t
    saved = compute.elementwise_bytes(m, two, True) - compute.elementwise_bytes(m, sh, True)
    sbh = m.seq_length * sh.tokens * m.hidden_size
    assert saved == pytest.approx(sbh * (6.0 - 4.0625) * (3.0 + m.ffn_hidden_size / m.hidden_size) / t)
    one, both = compute.layer_times(m, w.cluster, sh), compute.layer_times(m, w.cluster, two)
    assert one["elementwise"] < both["elementwise"]
    assert one["gemm"] == both["gemm"] and one["attention"] == both["attention"]
