"""FLOP counts of a GPT iteration (docs/reference/formulas.md). Pure."""

from __future__ import annotations

from tuner.specs import ModelSpec


def megatron_flops(model: ModelSpec, global_batch: int, recompute: bool) -> float:
    """FLOPs per iteration as Megatron-DeepSpeed logs them (and the Frontier study reports):
    24·c·B·s·L·h²·(1 + s/(6h) + V/(16·L·h)), c = 4 with full activation recompute, 3 without.
    For an ffn size f other than 4h the first term scales as (4h² + 2hf)/(12h²)."""
    c = 4 if recompute else 3
    B, s, L, h, V, f = (global_batch, model.seq_length, model.num_layers, model.hidden_size,
                        model.vocab_size, model.ffn_hidden_size)
    gemm = (4 * h * h + 2 * h * f) / (12 * h * h)
    return 24.0 * c * B * s * L * h * h * (gemm + s / (6.0 * h) + V / (16.0 * L * h))


def model_flops(model: ModelSpec, global_batch: int) -> float:
    """Model FLOPs per iteration (no recompute, c = 3): the numerator of MFU."""
    return megatron_flops(model, global_batch, recompute=False)


def tflops_per_gpu(model: ModelSpec, global_batch: int, recompute: bool, step_time_s: float, gpus: int) -> float:
    return megatron_flops(model, global_batch, recompute) / (step_time_s * gpus * 1e12)
