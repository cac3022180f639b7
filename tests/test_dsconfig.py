"""The DeepSpeed config renderer (tuner.render.dsconfig): golden files and the batch-size identity DeepSpeed checks.

Regenerate the golden files after an intended change with TUNER_UPDATE_GOLDEN=1.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, strategies as st

from tuner.render.dsconfig import render_ds_config
from tuner.errors import InvalidLayout
from tuner.layout import Layout
from tuner.specs import make_workload

GOLDEN = Path(__file__).parent / "golden"

CASES = {
    # The Frontier study's 175B headline run: 128 GCDs, TP4 PP16 DP2, mb 1, GB 640, ZeRO-1, fp16.
    "ds_config_175b_tp4_pp16_dp2_fp16.json": (
        Layout(tp=4, pp=16, dp=2, micro_batch=1, zero_stage=1, recompute="full"),
        make_workload("gpt-175b", 16, "frontier"), "fp16"),
    "ds_config_175b_tp4_pp16_dp2_bf16.json": (
        Layout(tp=4, pp=16, dp=2, micro_batch=1, zero_stage=1, recompute="full"),
        make_workload("gpt-175b", 16, "frontier"), "bf16"),
    # A tiny CPU trial on 2 ranks: DP2, ZeRO-1, no checkpointing, fp32.
    "ds_config_tiny_cpu_dp2_z1_fp32.json": (
        Layout(tp=1, pp=1, dp=2, micro_batch=4, zero_stage=1, recompute="none"),
        make_workload("tiny", 1, "frontier", global_batch=16), "fp32"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_golden(name):
    layout, workload, precision = CASES[name]
    got = render_ds_config(layout, workload, precision=precision)
    path = GOLDEN / name
    if os.environ.get("TUNER_UPDATE_GOLDEN"):
        path.write_text(json.dumps(got, indent=2, sort_keys=True) + "\n")
    assert got == json.loads(path.read_text()), f"{name} changed; if intended, rerun with TUNER_UPDATE_GOLDEN=1"


def test_175b_batch_numbers():
    cfg = render_ds_config(*CASES["ds_config_175b_tp4_pp16_dp2_fp16.json"][:2], precision="fp16")
    assert (cfg["train_batch_size"], cfg["train_micro_batch_size_per_gpu"],
            cfg["gradient_accumulation_steps"]) == (640, 1, 320)
    assert cfg["zero_optimization"] == {"stage": 1}
    assert cfg["optimizer"]["params"]["betas"] == [0.9, 0.95]
    assert cfg["fp16"]["enabled"] and "bf16" not in cfg


@given(mb=st.integers(1, 16), dp=st.integers(1, 64), gas=st.integers(1, 64), extra=st.integers(0, 7),
       zero=st.integers(0, 3), precision=st.sampled_from(["fp32", "bf16", "fp16"]))
def test_batch_sizes_always_consistent(mb, dp, gas, extra, zero, precision):
    """GB = mb * gas * dp whenever it renders; a GB that mb * dp does not divide is refused."""
    gb = mb * dp * gas + extra
    workload = make_workload("tiny", 1, "frontier", global_batch=gb)
    layout = Layout(tp=1, pp=1, dp=dp, micro_batch=mb, zero_stage=zero)
    if gb % (mb * dp):
        with pytest.raises(InvalidLayout, match="not divisible"):
            render_ds_config(layout, workload, precision=precision)
        return
    cfg = render_ds_config(layout, workload, precision=precision)
    assert cfg["train_batch_size"] == gb
    assert cfg["train_micro_batch_size_per_gpu"] * cfg["gradient_accumulation_steps"] * dp == gb
    assert cfg["zero_optimization"]["stage"] == zero
    assert ("bf16" in cfg) == (precision == "bf16") and ("fp16" in cfg) == (precision == "fp16")
    json.dumps(cfg)   # serialisable as a DeepSpeed config file


@pytest.mark.parametrize("recompute, on", [("full", True), ("selective", False), ("none", False)])
def test_only_full_recompute_turns_on_deepspeed_activation_checkpointing(recompute, on):
    """DeepSpeed's activation_checkpointing checkpoints whole layers: selective recompute (the attention core,
    done by Megatron itself) has no equivalent there, so only full writes the section."""
    w = make_workload("175b", 16)
    config = render_ds_config(Layout(tp=4, pp=16, dp=2, micro_batch=1, recompute=recompute), w, precision="bf16")
    assert ("activation_checkpointing" in config) == on


def test_unknown_precision_is_refused():
    layout, workload, _ = CASES["ds_config_tiny_cpu_dp2_z1_fp32.json"]
    with pytest.raises(ValueError, match="precision must be one of"):
        render_ds_config(layout, workload, precision="fp8")


def test_renderers_are_pure():
    """Importing the renderers pulls in neither torch nor deepspeed."""
    code = ("import sys, tuner.render.dsconfig, tuner.render.megatron, tuner.render.sbatch, tuner.render.launch; "
            "print(sorted(m for m in ('torch', 'deepspeed') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[1])
    assert out.stdout.strip() == "[]"
