"""Render a DeepSpeed config from a layout. Pure: no torch, no deepspeed, no I/O.

One rule is kept by construction: train_batch_size (the global batch) =
train_micro_batch_size_per_gpu * gradient_accumulation_steps * dp. DeepSpeed checks the same
identity at start-up; rendering it from one place means it can never disagree with the harness.
"""

from __future__ import annotations

from tuner.errors import InvalidLayout
from tuner.layout import Layout
from tuner.specs import Workload

PRECISIONS = ("fp32", "bf16", "fp16")

# Optimizer of the Frontier study (Megatron-DeepSpeed GPT recipes): Adam(W), beta2 0.95, clip 1.0.
ADAM_PARAMS = {"lr": 1.0e-4, "betas": [0.9, 0.95], "eps": 1.0e-8, "weight_decay": 0.1}
GRADIENT_CLIPPING = 1.0


def render_ds_config(layout: Layout, workload: Workload, *, precision: str = "fp32") -> dict:
    """The DeepSpeed config for one trial of `layout` on `workload`.

    Raises InvalidLayout when the global batch is not a multiple of micro_batch * dp, and
    ValueError for an unknown precision ("fp32", "bf16" or "fp16").
    """
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    gb, mb, dp = workload.global_batch, layout.micro_batch, layout.dp
    if mb < 1 or dp < 1 or gb < 1:
        raise InvalidLayout(f"micro_batch, dp and global batch must be >= 1 (got {mb}, {dp}, {gb})")
    if gb % (mb * dp):
        raise InvalidLayout(f"global batch ({gb}) is not divisible by micro_batch*dp = {mb}*{dp}; "
                            "choose a micro-batch or dp that divides it")
    if layout.zero_stage not in (0, 1, 2, 3):
        raise InvalidLayout(f"zero_stage must be 0, 1, 2 or 3 (got {layout.zero_stage})")
    config: dict = {
        "train_batch_size": gb,
        "train_micro_batch_size_per_gpu": mb,
        "gradient_accumulation_steps": gb // (mb * dp),
        "gradient_clipping": GRADIENT_CLIPPING,
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
        "optimizer": {"type": "Adam", "params": {**ADAM_PARAMS, "betas": list(ADAM_PARAMS["betas"])}},
        "zero_optimization": {"stage": layout.zero_stage},
    }
    if precision == "bf16":
        config["bf16"] = {"enabled": True}
    elif precision == "fp16":
        # Dynamic loss scaling as in the study's fp16 runs.
        config["fp16"] = {"enabled": True, "loss_scale": 0, "initial_scale_power": 16,
                          "loss_scale_window": 1000, "hysteresis": 2, "min_loss_scale": 1}
    if layout.activation_checkpointing:
        # Used by deepspeed.checkpointing (the pipeline engine's checkpoint function).
        config["activation_checkpointing"] = {"partition_activations": False,
                                              "contiguous_memory_optimization": False,
                                              "cpu_checkpointing": False}
    return config
