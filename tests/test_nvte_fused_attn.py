"""benchmarks/speed_as_ran.py's `ran_attention = "flash-attn-2"` read where a launch turned Transformer Engine's cuDNN
attention off (issue 25 / 26): NVIDIA's dgxc-benchmarking v24.11.1 (35a9aecc8d5b) exports NVTE_FUSED_ATTN=0 in
grok1/configure.sh (line 29), nemotron/configure.sh's 340b branch (line 65; its 15b branch sets 1, line 55) and
nemo_megatron/launch.sh (line 55), and 1 in llama3.1/configure.sh (line 48). Their NeMo 24.05 / 24.09 images hold a
Transformer Engine <= 1.10, whose only other backend is flash-attn's FlashAttention-2 (TE v1.10
transformer_engine/pytorch/attention.py lines 77-91: flash-attn 2.0.6-2.5.8, no FlashAttention-3 path)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import moe_accuracy  # noqa: E402
import published  # noqa: E402
import scaling_accuracy  # noqa: E402
from tuner.space import valid_layouts  # noqa: E402

DGXC = "NVIDIA/dgxc-benchmarking"


def _grok_rows() -> list[dict]:
    return [r for r in published.published() if r["source"].startswith(f"{DGXC} grok1/README_314b.md")]


def test_every_dgxc_launch_with_cudnn_attention_off_reads_flash_attn_2():
    """Every row and series of those launches reads so (held-out ones included); the llama3.1 and 15b ones do not."""
    grok = _grok_rows()
    assert len(grok) == 18 and all(r["ran_attention"] == "flash-attn-2" for r in grok)
    llama = [r for r in published.published() if r["source"].startswith(f"{DGXC} llama3.1/README_")]
    assert llama and not any("ran_attention" in r for r in llama)
    for s in scaling_accuracy.load_series():
        if s["points"][0]["source"].startswith(DGXC):
            off = any(k in s["points"][0]["source"] for k in ("nemo_megatron/README_175b", "nemotron/README_340b"))
            assert (s["points"][0].get("ran_attention") == "flash-attn-2") == off, s["name"]


def test_flash_attn_2_slows_the_grok_and_nemotron_predictions():
    """moe_accuracy reads the row's kernel (reading.tps_as_ran); scaling_accuracy the published layout's MFU."""
    r = next(r for r in _grok_rows() if r["gpus"] == 8)
    as_ran, fused = moe_accuracy.evaluate(r), moe_accuracy.evaluate({k: v for k, v in r.items() if k != "ran_attention"})
    assert as_ran["pred"] < 0.98 * fused["pred"]
    s = next(s for s in scaling_accuracy.load_series() if "340B weak, 128-2048 H100, fp8" in s["name"])
    p = s["points"][0]
    w = scaling_accuracy.workload(s, p)
    top = scaling_accuracy._best_pinned(valid_layouts(scaling_accuracy.SPACE.pinned(p["pins"]), w), w, None)
    assert scaling_accuracy._mfu_as_ran(top, p, w, None) < 0.97 * top.mfu
    assert scaling_accuracy._mfu_as_ran(top, {**p, "ran_attention": None}, w, None) == top.mfu
