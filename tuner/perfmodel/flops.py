"""FLOP counts of a training iteration (docs/reference/formulas.md). Pure.

Per layer and token, the forward GEMMs do 2 * (attention weights + FFN weights) FLOPs: 2(4h^2 + 2hf)
for GPT; with grouped-query attention K and V are h x kv (kv = num_query_groups * head size) instead
of h x h, and SwiGLU has three h x f matrices instead of two (ModelSpec.attention_weights,
ModelSpec.ffn_weights). The attention core (QK^T and the value product) does 4*s*h per token whatever
the number of key/value heads. The LM head does 2*h*V per token, tied or not: tying changes the
parameters, not the work. Position embeddings (learned or RoPE) and normalizations are not counted.

Mixture of experts: a token's FLOPs are those of the weights it is multiplied by (its ACTIVE parameters,
ModelSpec.gemm_weights_per_token): in an MoE layer the router, its top_k routed experts and the shared
experts, never the experts it is not sent to. This is the convention of Megatron-Core's
num_floating_point_operations (megatron/training/training.py: routed FLOPs x moe_router_topk plus the
shared experts; NVIDIA's Megatron-Bridge tables report "Model TFLOP/s/GPU" with it) and of DeepSeek-V3's
report (MFU on 37B activated parameters), plus the router's h x E GEMM, which Megatron-Core leaves out
(0.3 % of DeepSeek-V3's layer FLOPs). So MoE MFU is active-parameter MFU. Multi-latent attention counts
its down- and up-projections (ModelSpec.qkv_weights) and its core at Q/K width a*(qk + rope) and V width
a*v (ModelSpec.attention_core_width). Attention keeps this tool's full-s^2 count (Megatron-Core now
halves it for the causal mask), so MFU here is not Megatron-Bridge's "Model TFLOP/s" over peak.
"""

from __future__ import annotations

from tuner.specs import ModelSpec


def megatron_flops(model: ModelSpec, global_batch: int, recompute: str | bool) -> float:
    """FLOPs per iteration as Megatron-DeepSpeed logs them (and the Frontier study reports):
    24·c·B·s·L·h²·(G + s/(6h) + V/(16·L·h)), c = 4 with full recompute ("full" or True), 3 without
    ("none" or False); selective recompute re-runs only the attention core: c = 4 on its s/(6h) term
    and 3 on the rest. And
    G = (attention weights + FFN weights) / (12h²) of one layer: 1 for GPT with f = 4h,
    (2h² + 2h·kv + 3hf)/(12h²) for a GQA + SwiGLU model. The G term is the one Megatron-Core counts
    for GQA and SwiGLU (its `num_floating_point_operations`: (1 + g/a)·h² + 1.5·f·h per 6 FLOPs).
    The LM-head term keeps the study formula's V/(16Lh) in both cases: exact (6·s·h·V per sample) for
    c = 4, where the head is not recomputed, and 3/4 of that for c = 3 — what Megatron-DeepSpeed logs
    and what every MFU figure of this tool uses, so GPT figures stay comparable across versions."""
    mode = ("full" if recompute else "none") if isinstance(recompute, bool) else recompute
    c = 4 if mode == "full" else 3
    c_attn = 4 if mode in ("selective", "full") else 3     # a recompute module set re-runs no attention core
    B, s, L, h, V = (global_batch, model.seq_length, model.num_layers, model.hidden_size, model.vocab_size)
    if model.is_moe or model.multi_latent_attention:     # per-layer weights differ: their sum over the layers
        gemm = model.gemm_weights_per_token / (12 * L * h * h)
    else:
        gemm = (model.attention_weights + model.ffn_weights) / (12 * h * h)
    core = model.attention_core_width / h          # 1 unless MLA or head_dim * heads != h
    return 24.0 * B * s * L * h * h * (c * gemm + c_attn * core * s / (6.0 * h) + c * V / (16.0 * L * h))


def model_flops(model: ModelSpec, global_batch: int) -> float:
    """Model FLOPs per iteration (no recompute, c = 3): the numerator of MFU."""
    return megatron_flops(model, global_batch, recompute="none")


def tflops_per_gpu(model: ModelSpec, global_batch: int, recompute: str | bool, step_time_s: float, gpus: int) -> float:
    return megatron_flops(model, global_batch, recompute) / (step_time_s * gpus * 1e12)
