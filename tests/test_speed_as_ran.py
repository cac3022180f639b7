"""benchmarks/speed_as_ran.py (issue 25 / 26): a published row's speed as its launch ran it -- the framework overlaps its
config turned off (`tp_comm_overlap`, `overlap_grad_reduce` false) and FlashAttention-2 where tuner's framework runs the
fused attention (`ran_attention`) -- read onto FlagPerf's Megatron-Core and FlagScale rows."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import published  # noqa: E402
import reading  # noqa: E402
from tuner.perfmodel import predict  # noqa: E402
from tuner.specs import load_cluster, make_workload  # noqa: E402


def _flagperf() -> list[dict]:
    rows = [r for r in published.published() + published.hardware()
            if any("FlagOpen/FlagPerf" in s for s in r.get("sources", [r.get("source", "")]))]
    assert len({published.split_key(r) for r in rows}) == 9
    return rows


def _h800_row() -> dict:
    return next(r for r in _flagperf() if r["cluster"] == "h800" and r["tp"] == 8)


def test_every_flagperf_row_ran_without_overlaps():
    """pretrain_llama3.sh and megatron_main.sh pass no --tp-comm-overlap and no --overlap-grad-reduce: every row of the
    source reads so, held-out ones included; FlagScale's rows ran flash-attn's FlashAttention-2."""
    for r in _flagperf():
        assert reading.overlaps_off(r) == {"tp", "dp"}, r["source"]
        assert (r.get("ran_attention") == "flash-attn-2") == ("FlagScale" in r["release"]), r["source"]


def test_exchange_as_ran():
    r = _h800_row()
    assert reading.exchange_as_ran({k: v for k, v in r.items() if k not in ("tp_comm_overlap", "overlap_grad_reduce")}) is None
    ex = reading.exchange_as_ran(r)
    assert ex.overlaps == frozenset({"p2p", "ep"})
    assert reading.exchange_as_ran({**r, "tp_comm_overlap": True}).overlaps == frozenset({"p2p", "ep", "tp"})


def test_overlaps_off_slow_the_prediction():
    """TP 8 on H800's 400 GB/s NVLink: the TP collectives whole cost seconds a step that --tp-comm-overlap would hide."""
    r = _h800_row()
    w, lay = reading.workload_of(r), reading.layout_of(r)
    hidden, whole = predict(lay, w), predict(lay, w, reading.exchange_as_ran(r))
    assert whole.time_breakdown["tp_comm"] > hidden.time_breakdown["tp_comm"] + 1.0
    assert whole.step_time_s > 1.2 * hidden.step_time_s


def test_attention_kernel_s():
    r = _h800_row()
    w, lay = reading.workload_of(r), reading.layout_of(r)
    extra = reading.attention_kernel_s(r, lay, w)
    pr = predict(lay, w)
    # FA2_ON_HOPPER - 1 = 1 more attention time, over the micro-batches and the bubble's share of it
    assert pr.time_breakdown["attention"] < extra < 1.3 * pr.time_breakdown["attention"]
    assert reading.tps_as_ran(r, lay, w, pr) < reading.tps_as_ran({**r, "ran_attention": None}, lay, w, pr)
    bare = {k: v for k, v in r.items() if k != "ran_attention"}
    assert reading.attention_kernel_s(bare, lay, w) == 0.0
    a100 = dataclasses.replace(w, cluster=load_cluster("a100"))
    assert reading.attention_kernel_s(r, lay, a100) == 0.0          # no Hopper: FlashAttention-2 is the fused kernel's match
    with pytest.raises(ValueError):
        reading.attention_kernel_s({**r, "ran_attention": "sdpa"}, lay, w)


def _blackwell_torchtitan() -> list[dict]:
    return [r for r in published.hardware() if r["framework"] == "torchtitan" and r["cluster"] in ("b200", "gb200")]


def test_torchtitan_on_blackwell_ran_cudnn_attention():
    """torchtitan's SDPA puts cuDNN first on compute capability >= 10.0 from 3b85aa31f (2025-05-14): every Llama 3 row of
    Baisya's GB200 post and of torchao's B200 table reads so (held-out ones included); pith-train's Qwen3 row ran flex."""
    for r in _blackwell_torchtitan():
        sdpa = "daddyofadoggy/blog" in r["source"] or "mx_formats" in r["source"]
        assert (r.get("ran_attention") == "cudnn") == sdpa, r["source"]
    assert all("ran_attention" not in r for r in published.hardware() if r["cluster"] == "mi300x")


def test_cudnn_attention_is_what_tuner_charges_torchtitan():
    """tuner charges torchtitan's SDPA cuDNN's attention on a CUDA GPU (what its launch runs, compute.attention_kernel):
    a row that ran it needs no reading's seconds; ROCm has no cuDNN."""
    r = next(r for r in _blackwell_torchtitan() if "daddyofadoggy/blog" in r["source"] and r["pp"] == 1 and r["tp"] == 1)
    w, lay = reading.workload_of(r), reading.layout_of(r)
    assert reading.attention_kernel_s(r, lay, w) == 0.0
    mi300x = dataclasses.replace(w, cluster=load_cluster("mi300x"))
    with pytest.raises(ValueError, match="CUDA machines only"):
        reading.attention_kernel_s(r, lay, mi300x)


def _torchtitan_and_llm_foundry() -> list[dict]:
    return [r for r in published.published() if r["framework"] in ("torchtitan", "fsdp")]


def test_torchtitan_and_llm_foundry_on_hopper_ran_flash_attention_2():
    """Every torchtitan row on an FP8 GPU here is at a commit before 6a3a9da95 (cuDNN first on every CUDA GPU) and every
    llm-foundry row ran attn_impl 'flash': all read FlashAttention-2 (held-out ones included); A100 rows need no
    reading, nor DeepSeek-V3 @ 36a4b694 (its "671B" flavor ran flex, which tuner charges an MLA model). The reading keeps the charge FA2_ON_HOPPER was chosen with: one more attention time (pp 1)."""
    for r in _torchtitan_and_llm_foundry():
        hopper = r["cluster"] in ("h100", "h100-gt", "h200") and r["model"] != "deepseek-v3"   # MLA: ran flex, charged flex
        assert (r.get("ran_attention") == "flash-attn-2") == hopper, r["source"]
    r = next(r for r in _torchtitan_and_llm_foundry() if r["cluster"] == "h100" and r["framework"] == "torchtitan"
             and r["pp"] == 1)
    w, lay = reading.workload_of(r), reading.layout_of(r)
    pr = predict(lay, w)
    extra = reading.attention_kernel_s(r, lay, w)
    assert 0.99 * pr.time_breakdown["attention"] < extra < 1.01 * pr.time_breakdown["attention"]


def test_flex_reading():
    """pith-train's Qwen3-30B-A3B on B200 ran torchtitan's flex attention (qwen3 attn_backend 'flex' @ 363709fd), where
    tuner charges Qwen3's SDPA cuDNN's: FlashAttention-2's factor again; on an MLA model tuner charges flex itself."""
    r = next(r for r in published.hardware() if "mlc-ai/pith-train" in r["source"])
    assert r["ran_attention"] == "flex"
    w, lay = reading.workload_of(r), reading.layout_of(r)
    assert reading.attention_kernel_s(r, lay, w) > 0.0
    mla = make_workload("deepseek-v3", 64, "h100", framework="torchtitan")
    assert reading.attention_kernel_s(r, lay, mla) == 0.0
