"""benchmarks/scaling_accuracy.py's given series (issue 25 item 4): a series states the gradient and Adam-moment
dtypes its run's configuration sets, and both columns (tuner's answer and the published layout) predict that
workload; a series whose reading was set after its points had been printed names the choice in `seen`."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

sys.path.insert(0, str(ROOT / "benchmarks"))
import scaling_accuracy as mod  # noqa: E402


def _given(name: str) -> dict:
    got = [s for s in mod.load_series() if s["name"] == name]
    assert len(got) == 1, name
    return got[0]


def test_a_series_states_its_runs_gradient_and_moment_dtypes():
    s = _given("dgxc NeMo 24.11 Nemotron-4 340B weak, 128-2048 H100, bf16")
    w = mod.workload(s, s["points"][0])
    # NeMo 24.11's nemotron4-340b-synth.yaml: optim.grad_sync_dtype bf16, distributed_fused_adam dtype bf16,
    # activations_checkpoint_granularity selective
    assert w.gradient_dtype == "bf16"               # Megatron-Core's own default is fp32
    assert w.optimizer_moments == "bf16"
    assert s["points"][0]["pins"]["recompute"] == "selective"
    assert s["seen"], "its reading was set after its points had been printed"


def test_a_series_that_states_nothing_keeps_the_frameworks_defaults():
    s = _given("Llama 3 405B strong (Meta, 2024), 8192-16384 H100 (16M tokens per batch)")
    w = mod.workload(s, s["points"][0])
    assert (w.gradient_dtype, w.optimizer_moments) == ("fp32", "")
    # no configuration read onto it: only the choices that saw every Megatron-Core series (the step floor, the buckets'
    # NCCL latency)
    assert all("CI step floor" in n or "NCCL" in n for n in s["seen"])
    assert [p["gpus"] for p in s["points"]] == [8192, 16384]
    assert {p["global_batch"] for p in s["points"]} == {2048}      # strong: one batch


def test_sc21_table_2_strong_series_read_as_megatron_lm_of_2021():
    # Narayanan et al. SC21 Table 2: one batch per model at 1x, 2x, 4x the GPUs; Megatron-LM @ aed2f75e20 (2021-04)
    # has no overlaps, no distributed optimizer and no sequence parallelism; committed before the model ran on them
    ptdp = _given("Megatron-LM 2021 strong (Narayanan et al., SC21 Table 2), GPT 175B, 384-1536 A100 (batch 1536)")
    assert [p["gpus"] for p in ptdp["points"]] == [384, 768, 1536]
    assert {p["global_batch"] for p in ptdp["points"]} == {1536}
    assert ptdp["overlaps"] == [] and mod.as_run(ptdp).overlaps == frozenset()
    assert ptdp["points"][0]["pins"] == {"tp": 8, "pp": 12, "micro_batch": 1, "sequence_parallel": False,
                                         "zero_stage": 0, "recompute": "full"}
    assert not ptdp["seen"]                          # no choice saw it: its points count as held out
    zero3 = _given("ZeRO-3 strong (Narayanan et al., SC21 Table 2), GPT 175B, 384-1536 A100 (batch 1536)")
    assert [p["pins"]["micro_batch"] for p in zero3["points"]] == [4, 2, 1]     # each point's own micro-batch
    assert mod.workload(zero3, zero3["points"][0]).framework == "megatron-deepspeed"
    # its points' errors were printed before DeepSpeed's per-collective latency was charged (issue 25 item 4): seen
    assert zero3["seen"] and all("NCCL's ring latency" in n for n in zero3["seen"])


def test_megascale_530b_weak_series_reads_megatron_lm_285068c8_as_the_strong_ones():
    # arXiv 2402.15627 Figure 9: batch = GPUs, TP 8 x PP 35 x 3 interleaved stages, the same no-overlap Megatron-LM
    s = _given("MegaScale's Megatron-LM baseline weak, GPT 530B, 2240-11200 A100 (batch = GPUs)")
    assert [(p["gpus"], p["global_batch"]) for p in s["points"]] == [(2240, 2240), (4480, 4480), (11200, 11200)]
    assert s["overlaps"] == [] and s["points"][0]["pins"] == {"tp": 8, "pp": 35, "virtual_pipeline": 3}
    assert s["points"][0]["model"].num_attention_heads == 160      # Table 1
    assert not s["seen"]
