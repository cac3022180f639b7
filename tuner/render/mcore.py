"""Megatron-LM (Megatron-Core) `pretrain_gpt.py` arguments from a layout. Pure: no I/O, no torch.

No DeepSpeed config: Megatron-Core builds its own optimizer and data-parallel wrapper. ZeRO maps to
Megatron-Core's distributed optimizer (`--use-distributed-optimizer`: optimizer states sharded over DP,
i.e. ZeRO-1). ZeRO-2/3 have no Megatron-Core equivalent beyond the distributed optimizer, so a layout
with zero_stage 2 or 3 is refused (never launched as something else).

Every flag was checked against NVIDIA/Megatron-LM at d98e8a64ddf3 (2026-08-22): flags written literally in
megatron/training/arguments.py, or generated there by ArgumentGroupFactory (megatron/training/
argument_utils.py: `--` + field name with `_` -> `-`; a bool defaulting to True also gets `--disable-*`)
from a config dataclass field. tests/test_launch_frameworks.py keeps the list (MCORE_FLAGS, file:line of
each) and fails on a flag that is not in it.
"""

from __future__ import annotations

from tuner.errors import UsageError
from tuner.layout import Layout
from tuner.render.megatron import PRECISIONS, run_args, shape_args
from tuner.specs import ModelSpec, Workload

# Full recompute of every layer (tuner's activation_checkpointing = the old --checkpoint-activations).
RECOMPUTE_FULL = ("--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1")


def check_zero(layout: Layout) -> None:
    """UsageError (one line) for a ZeRO stage Megatron-Core cannot express."""
    if layout.zero_stage in (2, 3):
        raise UsageError(f"--framework megatron-core cannot run zero_stage {layout.zero_stage}: Megatron-Core's only "
                         "ZeRO equivalent is the distributed optimizer (ZeRO-1); choose a layout with zero_stage "
                         "0 or 1, or use --framework megatron-deepspeed")


def architecture_args(m: ModelSpec) -> list[str]:
    """The model's architecture beyond its shape: GQA, SwiGLU, RoPE, untied embeddings, RMSNorm, no biases."""
    args: list[str] = []
    if m.num_query_groups < m.num_attention_heads:
        args += ["--group-query-attention", "--num-query-groups", str(m.num_query_groups)]
    if m.ffn_type == "swiglu":
        args.append("--swiglu")
    if m.position_embedding == "rope":
        args += ["--position-embedding-type", "rope"]
    if not m.tie_embeddings:
        args.append("--untie-embeddings-and-output-weights")
    if m.normalization == "rmsnorm":
        args += ["--normalization", "RMSNorm"]
    if not m.add_bias_linear:
        args.append("--disable-bias-linear")
    return args


def pretrain_args(layout: Layout, workload: Workload, *, precision: str = "bf16", iterations: int = 10,
                  extra: tuple[str, ...] | list[str] = ()) -> list[str]:
    """The argv (after Megatron-LM's `pretrain_gpt.py`). `extra` (data paths, tokenizer) is appended.
    UsageError for zero_stage 2/3; ValueError for a precision other than fp16/bf16."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    check_zero(layout)
    args = [*shape_args(layout, workload), *architecture_args(workload.model),
            *run_args(layout, workload, iterations, precision)]
    if layout.zero_stage >= 1:
        args.append("--use-distributed-optimizer")
    if layout.checkpointing:
        args += list(RECOMPUTE_FULL)
    return args + [str(a) for a in extra]
