"""Megatron-Core's parameter all-gather under --fp8-param-gather moves the FP8 weights' one byte, not bf16's two
(tuner.perfmodel.quantized.gather_bytes; issue 25), and MLPerf Training v3.0 / v3.1's GPT-3 runs, on NeMo releases
without fp8_params, are read as gathering bf16 (`ran_fp8_params = false`: benchmarks/speed_as_ran.exchange_as_ran); v3.1's,
on a TransformerEngine that ran flash-attn before cuDNN's fused attention, with FlashAttention-2 (`ran_attention`)."""

from __future__ import annotations

import dataclasses
import sys
import tomllib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import published  # noqa: E402
import reading  # noqa: E402
from tuner.frameworks import of  # noqa: E402
from tuner.layout import Layout  # noqa: E402
from tuner.perfmodel import fsdp_time, predict, quantized  # noqa: E402
from tuner.perfmodel.moe_exchange import TokenExchange  # noqa: E402
from tuner.specs import load_cluster, load_model, make_workload  # noqa: E402

LAY = Layout(tp=4, pp=8, dp=16, micro_batch=1, zero_stage=1, sequence_parallel=True, virtual_pipeline=12)


def _workload(precision: str):
    return make_workload(load_model("gpt-175b"), 64, load_cluster("h100"), 2048, precision=precision,
                         framework="megatron-core")


def test_fp8_weights_gather_in_one_byte():
    w = _workload("fp8")
    fw = of(w)
    assert fw.quantized_params(LAY, w)
    n = 5.6e9
    b = quantized.gather_bytes(fw, LAY, w, n)
    assert 1.0 < b < 1.05          # the layers' FP8 data; the word embedding of the first / last stage in bf16
    assert quantized.gather_bytes(fw, LAY, w, n, experts=True) == 1.0
    assert quantized.gather_bytes(fw, LAY, _workload("bf16"), n) == 2.0
    assert quantized.gather_bytes(fw, dataclasses.replace(LAY, zero_stage=0), w, n) == 2.0   # no sharded optimizer


def test_a_run_that_kept_bf16_weights_gathers_twice_the_bytes():
    w = _workload("fp8")
    launched = predict(LAY, w).time_breakdown
    bf16 = predict(LAY, w, TokenExchange(quantized_params=False)).time_breakdown
    assert bf16["dp_param_gather"] > 1.5 * launched["dp_param_gather"] > 0.0
    assert bf16["dp_grad_reduce"] == launched["dp_grad_reduce"]


def _v3(r: dict) -> bool:
    return any(x.startswith(("mlcommons/training_results_v3.0 ", "mlcommons/training_results_v3.1 "))
               for x in r.get("sources", [r.get("source", "")]))


def test_mlperf_v3_gpt3_rows_ran_bf16_weights():
    """NeMo v1.17.0 (v3.0) and bd0b818a (v3.1) have no fp8_params: every row of those rounds, held-out ones included."""
    with open(Path(__file__).resolve().parents[1] / "benchmarks" / "data" / "framework_published.toml", "rb") as f:
        raw = [r for r in tomllib.load(f)["row"] if _v3(r)]
    assert len(raw) == 12 and all(r["ran_fp8_params"] is False for r in raw)
    rows = [r for r in published.published() if _v3(r)]
    for r in rows:
        ex = reading.exchange_as_ran(r)
        assert ex.quantized_params is False and ex.overlaps is None, r.get("source")
    later = [r for r in published.published() if r.get("source", "").startswith("mlcommons/training_results_v4.0")]
    assert later and all(reading.exchange_as_ran(r) is None for r in later)     # FP8_PARAMS=True: as tuner launches


def test_mlperf_v31_gpt3_rows_ran_flash_attention_2():
    """TE 09ba842 / 4ee8e8e (v3.1's Dockerfiles, with flash-attn 2.0.8) dispatch FlashAttention before FusedAttention on
    H100; TE v0.8 (v3.0) ran flash-attn 1.x, which tuner has no kernel for (unread); TE v1.6rc1 on (v4.0) prefers cuDNN."""
    with open(Path(__file__).resolve().parents[1] / "benchmarks" / "data" / "framework_published.toml", "rb") as f:
        rows = [r for r in tomllib.load(f)["row"] if "/gpt3/" in r.get("source", "")]
    for r in rows:
        v31 = r["source"].startswith("mlcommons/training_results_v3.1 ")
        assert (r.get("ran_attention") == "flash-attn-2") == v31, r["source"]
    r = next(r for r in published.published() if _v3(r) and r["gpus"] == 4096)
    lay, w = reading.layout_of(r), reading.workload_of(r)
    assert reading.attention_kernel_s(r, lay, w, reading.exchange_as_ran(r)) > 0.0


def test_megatron_fsdp_gathers_fp8_layer_weights_in_one_byte():
    """Megatron-FSDP (zero_stage 3 on Megatron-Core) keeps FP8 weights in a uint8 buffer and gathers that, layer by layer
    (quantized.layer_gather_bytes); the gradients' reduce-scatter is not touched."""
    w = make_workload(load_model("llama3-70b"), 8, load_cluster("h100"), 128, precision="fp8", framework="megatron-core")
    lay = Layout(tp=1, pp=1, dp=64, micro_batch=1, zero_stage=3, recompute="full")
    assert quantized.layer_gather_bytes(of(w), lay, w) == 1.0
    launched = predict(lay, w).time_breakdown
    bf16 = predict(lay, w, TokenExchange(quantized_params=False)).time_breakdown
    exposed = [b["dp_grad_reduce"] + b["dp_param_gather"] for b in (launched, bf16)]
    assert exposed[1] > 1.2 * exposed[0] > 0.0      # pp 1: a layer's gather and reduce-scatter outlast its backward
    piped = dataclasses.replace(lay, pp=2, dp=32)     # pp > 1: the gathers counted apart from the reduce-scatters
    bare = [fsdp_time(piped, w, 0.0, 1, weight_bytes=b) for b in (1.0, 2.0)]   # nothing hides
    assert bare[1]["param_gather"] > 1.8 * bare[0]["param_gather"]
    assert bare[1]["grad_reduce"] == bare[0]["grad_reduce"]
