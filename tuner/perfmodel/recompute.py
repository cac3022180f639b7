"""Megatron-Core's --recompute-modules (issue 25): what each module's recompute frees and what it runs again.

Pure. The recompute dimension's named module sets (tuner.layout.RECOMPUTE_MODULES: moe_act, norm_act, mla_up,
mla_up_mlp, as NVIDIA's recipes set them) are Megatron-Core's `--recompute-granularity selective
--recompute-modules ...` (megatron/core/transformer/transformer_config.py line 560 at d98e8a64ddf3). Per
module, against the activations tuner.perfmodel.memory / moe already count per layer and micro-batch:

- layernorm (output-discarding: the norm outputs are freed though the QKV and fc1 GEMMs saved them, and
  recomputed before their backward): frees those two inputs, 4 bytes per s*b*h element (split by tp with
  sequence parallelism); runs both norms again (8 of the layer's replicated element-wise bytes).
- moe_act (output-discarding): frees each routed (token, expert) pair's activation output, fc2's input (2 bytes
  x the expert's width); runs the activation function again (its read / write bytes).
- mla_up_proj (output-discarding): frees the up-projected query, key and value the attention saved
  (2 x (q + k + v widths) bytes per element, split by tp); runs the query and key/value up-projections'
  GEMMs again and RoPE.
- mlp (a checkpoint of the dense MLP, its input kept): frees the FFN's inner activations of a dense layer
  (6f/h with SwiGLU, 4f/h with GeLU, split by tp); runs its two GEMMs and activation again.
- moe (a checkpoint of the whole MoE layer, its input kept): frees what the MoE block keeps (the shared experts',
  the routed pairs' and the combine's activations, the routing probabilities: moe.moe_block_activation_bytes);
  runs the router, the shared and routed experts' GEMMs, their element-wise kernels and the dispatch and combine
  again (the two extra all-to-alls: moe_exchange.alltoall_seconds).
- core_attn: the attention core again (tuner.perfmodel.compute, Megatron's selective recompute); it frees only
  the s^2 scores, which a FlashAttention kernel never keeps.
"""

from __future__ import annotations

from tuner.recompute_modes import recompute_modules
from tuner.perfmodel.compute import Shape, activation_function_bytes, gemm_time
from tuner.perfmodel.moe import (experts_gemm_seconds, moe_block_activation_bytes, moe_block_elementwise_bytes,
                                  router_gemm_seconds, routed_pairs)
from tuner.specs import ClusterSpec, ModelSpec

NORM_BYTES = 8.0       # two norms' forward element-wise traffic (of compute.ELEMENTWISE_REPLICATED's 22)


def modules(shape: Shape) -> frozenset:
    """The modules whose freed activations and repeated work this file adds: a named set's, but the attention
    core (compute's selective pass); none for full recompute, which re-runs whole layers (memory, compute)."""
    if shape.recompute in _PLAIN:
        return _NONE
    return recompute_modules(shape.recompute) - {"core_attn"}


_PLAIN, _NONE = ("none", "selective", "full"), frozenset()


def _sbh(model: ModelSpec, shape: Shape) -> float:
    return model.seq_length * shape.tokens * model.hidden_size


def _qkv_width(model: ModelSpec) -> float:
    return model.q_width + model.k_width + model.v_width


def freed_bytes(model: ModelSpec, shape: Shape, moe: bool) -> float:
    """Activation bytes one layer (an MoE layer when `moe`) no longer keeps for backward, per micro-batch."""
    mods, h, t = modules(shape), model.hidden_size, shape.t
    if not mods:
        return 0.0
    per = 0.0
    if "layernorm" in mods:
        per += 4.0 / t if shape.sp else 4.0
    if "mla_up_proj" in mods and model.multi_latent_attention:
        per += 2.0 * _qkv_width(model) / h / t
    if "mlp" in mods and not moe:
        per += activation_function_bytes(model) * model.ffn_hidden_size / h / t
    n = _sbh(model, shape) * per
    if "moe_act" in mods and moe:
        n += routed_pairs(model, shape) * 2.0 * model.moe_ffn_hidden_size / shape.etp
    if "moe" in mods and moe:
        n += moe_block_activation_bytes(model, shape)
    return n


def extra_seconds(model: ModelSpec, cluster: ClusterSpec, shape: Shape, moe: bool) -> dict:
    """Seconds one layer spends per micro-batch re-running its recomputed modules: {"gemm": ..., "elementwise": ...}."""
    mods, h, t = modules(shape), model.hidden_size, shape.t
    out = {"gemm": 0.0, "elementwise": 0.0}
    if not mods:
        return out
    hbm = cluster.hbm_bandwidth_gbps * 1e9 * cluster.memory_bandwidth_efficiency
    tokens = model.seq_length * shape.tokens
    elem = 0.0
    if "layernorm" in mods:
        elem += _sbh(model, shape) * (NORM_BYTES / t if shape.sp else NORM_BYTES)
    if "moe_act" in mods and moe:
        elem += routed_pairs(model, shape) * activation_function_bytes(model) * model.moe_ffn_hidden_size / shape.etp
    if "mla_up_proj" in mods and model.multi_latent_attention:
        a = model.num_attention_heads
        q_in = model.q_lora_rank or h
        out["gemm"] += gemm_time(cluster, 2.0 * tokens * q_in * model.q_width / t, shape.fp8)
        out["gemm"] += gemm_time(cluster, 2.0 * tokens * model.kv_lora_rank * a * (model.qk_head_dim + model.v_head_dim)
                                 / t, shape.fp8)
        elem += _sbh(model, shape) * 4.0 * (a + 1) * model.qk_pos_emb_head_dim / h / t
    if "mlp" in mods and not moe:
        f = model.ffn_hidden_size * (2 if model.ffn_type == "swiglu" else 1)
        out["gemm"] += gemm_time(cluster, 2.0 * tokens * h * f / t, shape.fp8)
        out["gemm"] += gemm_time(cluster, 2.0 * tokens * model.ffn_hidden_size * h / t, shape.fp8)
        elem += _sbh(model, shape) * activation_function_bytes(model) * model.ffn_hidden_size / h / t
    if "moe" in mods and moe:
        out["gemm"] += experts_gemm_seconds(model, cluster, shape) + router_gemm_seconds(model, cluster, shape)
        elem += moe_block_elementwise_bytes(model, shape)
    out["elementwise"] = elem / hbm
    return out
