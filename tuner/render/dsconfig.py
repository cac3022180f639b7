"""The DeepSpeed config (ds_config.json) of one trial. Pure: no torch, no deepspeed, no I/O.

The one renderer of it: the bundled harness (tuner.runners.harness.train) and Megatron-DeepSpeed
(tuner.render.megatron) both take their config from `render_ds_config`, so they cannot disagree on
batch sizes, ZeRO or precision settings.

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

# fp16 with dynamic loss scaling, with the settings DeepSpeed documents (docs/_pages/config-json.md,
# "FP16 training options"; each value here is its documented default): loss_scale 0 = dynamic, starting
# at 2**initial_scale_power, raised after loss_scale_window steps without overflow, lowered after
# `hysteresis` overflows, never below min_loss_scale. bf16 needs no loss scaling: {"enabled": true}.
# DeepSpeed refuses fp16 and bf16 together, so only the enabled block is written.
FP16 = {"enabled": True, "loss_scale": 0, "initial_scale_power": 16, "loss_scale_window": 1000,
        "hysteresis": 2, "min_loss_scale": 1}
BF16 = {"enabled": True}

# Used by deepspeed.checkpointing (the harness's pipeline engine; Megatron-DeepSpeed's
# --deepspeed-activation-checkpointing reads it too, its own arguments taking precedence). Written only for
# recompute "full": DeepSpeed checkpoints whole layers and has no selective mode; selective recompute (the
# attention core) is Megatron's own (--recompute-granularity selective), so it leaves this section out.
ACTIVATION_CHECKPOINTING = {"partition_activations": False, "contiguous_memory_optimization": False,
                            "cpu_checkpointing": False}

NEVER = 10**9   # steps_per_print for a caller that prints its own progress


def check_batch(layout: Layout, workload: Workload) -> int:
    """The gradient accumulation steps, or InvalidLayout when the global batch is not a multiple of
    micro_batch * dp (or the ZeRO stage is not 0-3)."""
    gb, mb, dp = workload.global_batch, layout.micro_batch, layout.dp
    if mb < 1 or dp < 1 or gb < 1:
        raise InvalidLayout(f"micro_batch, dp and global batch must be >= 1 (got {mb}, {dp}, {gb})")
    if gb % (mb * dp):
        raise InvalidLayout(f"global batch ({gb}) is not divisible by micro_batch*dp = {mb}*{dp}; "
                            "choose a micro-batch or dp that divides it")
    if layout.zero_stage not in (0, 1, 2, 3):
        raise InvalidLayout(f"zero_stage must be 0, 1, 2 or 3 (got {layout.zero_stage})")
    return gb // (mb * dp)


def render_ds_config(layout: Layout, workload: Workload, *, precision: str = "fp32", optimizer: bool = True,
                     steps_per_print: int = NEVER) -> dict:
    """The DeepSpeed config for one trial of `layout` on `workload`.

    `optimizer`: write the Adam section (the harness lets DeepSpeed build its optimizer; Megatron
    builds its own from its arguments and passes it to deepspeed.initialize, so it wants none).
    Raises InvalidLayout when the global batch is not a multiple of micro_batch * dp, and
    ValueError for an unknown precision ("fp32", "bf16" or "fp16").
    """
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    accumulation = check_batch(layout, workload)
    config: dict = {
        "train_batch_size": workload.global_batch,
        "train_micro_batch_size_per_gpu": layout.micro_batch,
        "gradient_accumulation_steps": accumulation,
        "gradient_clipping": GRADIENT_CLIPPING,
        "steps_per_print": steps_per_print,
        "wall_clock_breakdown": False,
        "zero_optimization": {"stage": layout.zero_stage},
    }
    if optimizer:
        config["optimizer"] = {"type": "Adam", "params": {**ADAM_PARAMS, "betas": list(ADAM_PARAMS["betas"])}}
    if precision == "bf16":
        config["bf16"] = dict(BF16)
    elif precision == "fp16":
        config["fp16"] = dict(FP16)
    if layout.checkpointing:
        config["activation_checkpointing"] = dict(ACTIVATION_CHECKPOINTING)
    return config
