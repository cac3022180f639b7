"""One layer's activation account per s*b*h element: what each framework's kernels keep for backward (issue 24).

Pure functions, split from tuner.perfmodel.memory (which sums them over stages and micro-batches in flight):
Korthikanti et al.'s account for fused kernels (Megatron), eager PyTorch's op by op (torchtitan without
torch.compile), torchtitan's per-op selective recompute from its own policy, FP8's saved inputs and full
recompute's checkpoint.
"""

from __future__ import annotations

from tuner.perfmodel.compute import Shape
from tuner.specs import ModelSpec

def split_activation_bytes(model: ModelSpec) -> float:
    """Bytes per s*b*h element of the activations split by t (Korthikanti et al.'s 24 for GPT):
    attention 4 + 4kv/h (Q 2, K and V 2kv/h each, the output projection's input 2) and the FFN 4f/h
    for gelu (GeLU input, fc2 input) or 6f/h for swiglu (the gate and up outputs, fc2 input). Fused
    RoPE keeps nothing more."""
    h, kv, f = model.hidden_size, model.kv_size, model.ffn_hidden_size
    ffn = (6.0 if model.ffn_type == "swiglu" else 4.0) * f / h
    return 4.0 + 4.0 * kv / h + ffn


#: Eager PyTorch (torchtitan without torch.compile) keeps what each unfused op saves, per s*b*h element:
#: replicated (outside TP's split; /t with sequence parallelism) EAGER_REPLICATED, chosen on the fake-tensor
#: measurements of torchtitan's own Llama 3 (benchmarks/data/memory_measured_torchtitan.toml, TUNING rows:
#: 54-55 bytes per element with recompute none, of which the split part below is counted op by op).
EAGER_REPLICATED = 14.0


def eager_split_bytes(model: ModelSpec) -> float:
    """What an eager Llama layer saves per s*b*h element within the TP split: RoPE's fp32 q and k (4 + 4kv/h),
    the rotated bf16 q, k, v (2 + 4kv/h), SDPA's output and its contiguous copy into wo (2 + 2), and in the
    SwiGLU FFN w1's and w3's outputs, silu's output and the product fed to w2 (4 x 2f/h). A model without RoPE
    (a learned position table, as MPT's presets) runs no rotation, so it keeps no fp32 q and k: SDPA's q, k, v
    (2 + 4kv/h) are the projections' outputs; a GeLU FFN keeps fc1's output and GeLU's (2 x 2f/h)."""
    kv, f = model.kv_size / model.hidden_size, model.ffn_hidden_size / model.hidden_size
    rope = 4.0 + 4.0 * kv if model.position_embedding == "rope" else 0.0
    return rope + 6.0 + 4.0 * kv + (8.0 if model.ffn_type == "swiglu" else 4.0) * f


#: The torchtitan tuner launches (tuner/render/torchtitan.py: 238fa9953e4a, TOML job files) projects Q, K and V with
#: three matmuls (models/llama3/model/model.py line 251); torchtitan 0.3.0's Llama 3, which the fake-tensor
#: measurements ran, with one fused wqkv (models/llama3/__init__.py: fuse_qkv=True, pytorch/torchtitan#3714).
LAUNCHED_FUSED_QKV = False


def op_sac_bytes(model: ModelSpec, shape: Shape, fused_qkv: bool = LAUNCHED_FUSED_QKV) -> float:
    """What torchtitan's per-op selective recompute keeps of one layer per s*b*h element on one rank.

    Its policy (238fa9953e4a: models/llama3/infra/parallelize.py `_op_sac_save_list`, distributed/
    activation_checkpoint.py `_apply_op_sac`; torchtitan 0.3.0: `_get_default_save_ops`, `SelectiveAC._wrap_block`)
    saves the outputs of every odd matmul of a block, of the attention kernel (SDPA / flex_attention: the output
    and its fp32 logsumexp) and of reduce_scatter_tensor, and recomputes the rest; the checkpoint keeps the block's
    input. With separate projections the matmuls are wq (1, saved), wk (2), wv (3, saved), wo (4), w1 (5, saved),
    w3 (6), w2 (7, saved); with a fused wqkv (1, saved), wo, w1 (saved), w3, w2 (saved), so K is kept too. Kept:
    the input (2; a 1/t shard with sequence parallelism); Q and V (2 + 2kv/h; K 2kv/h more when fused), the
    attention output and its logsumexp per head (2 + 4a/h) and w1's output (2f/h), all split by t; w2's output
    whole (2: under TP it is the partial sum over the rank's whole sequence, before the reduce-scatter); with
    sequence parallelism the reduce-scatters' outputs after wo and w2 (2/t each). The all-gathered GEMM inputs
    are not kept (all_gather is not saved). Checked on the selective-less-full activations measured over
    torchtitan 0.3.0 at tp 1, 2 and 8 (tests/test_op_sac.py)."""
    h, t = model.hidden_size, shape.t
    qkv = 2.0 + (4.0 if fused_qkv else 2.0) * model.kv_size / h
    split = qkv + 2.0 + (4.0 * model.num_attention_heads + 2.0 * model.ffn_hidden_size) / h
    scattered = 4.0 / t if shape.sp and t > 1 else 0.0
    return (2.0 / t if shape.sp else 2.0) + split / t + 2.0 + scattered


#: Bytes per element TransformerEngine keeps of a GEMM input it saves quantized for the backward pass (module/linear.py
#: @ d0067d0da keeps the column-wise copy alone): FP8 1; NVFP4 4 bits with an E4M3 scale per 16 elements
#: (tensor/nvfp4_tensor.py get_scale_shape: 1D blocks of 16).
SAVED_INPUT_BYTES = {"fp8": 1.0, "fp4": 0.5 + 1.0 / 16}


def fp8_saved_bytes(model: ModelSpec, fmt: str | bool = "fp8") -> tuple[float, float]:
    """Bytes per s*b*h element a low-precision GEMM format (Shape.fp8) saves of (the replicated, the split-by-t)
    activations against bf16: the QKV and fc1 inputs (replicated, 2 elements) and the projection and fc2 inputs
    (split, 1 + f/h), each kept in SAVED_INPUT_BYTES instead of 2 (FP8: 2 and 1 + f/h)."""
    cut = 2.0 - SAVED_INPUT_BYTES.get(fmt, 1.0)
    return 2.0 * cut, (1.0 + model.ffn_hidden_size / model.hidden_size) * cut


def activation_bytes_per_layer(model: ModelSpec, shape: Shape, flash_attention: bool) -> float:
    """Activations one layer stores for backward, per micro-batch on one rank:
    s*b*h*(10 + S/t + 5*a*s/(h*t)) without sequence parallelism, s*b*h*((10 + S)/t + ...) with it,
    S = split_activation_bytes (24 for GPT); the 10 replicated bytes are the two norms' inputs (4), the
    QKV and fc1 inputs (4) and two dropout masks (2). FlashAttention (or selective recompute) keeps no
    s^2 scores and drops the last term. A context-parallel rank keeps s/cp of it."""
    s, h, a, t = model.seq_length, model.hidden_size, model.num_attention_heads, shape.t
    if shape.op_sac:        # torchtitan's per-op SAC: what its policy saves (op_sac_bytes); FlashAttention-like
        return s * shape.tokens * h * op_sac_bytes(model, shape)
    replicated, split = 10.0, split_activation_bytes(model)
    if not shape.fused:     # eager: every unfused op keeps its own inputs
        replicated, split = EAGER_REPLICATED, eager_split_bytes(model)
    if shape.fp8:
        saved_r, saved_s = fp8_saved_bytes(model, shape.fp8)
        replicated, split = replicated - saved_r, split - saved_s
    per = (replicated + split) / t if shape.sp else replicated + split / t
    if shape.sp and shape.gathered_inputs:     # the attention's and the FFN's gathered bf16 inputs, whole
        per += 4.0 * (1.0 - 1.0 / t)
    if not flash_attention and shape.recompute == "none":
        per += 5.0 * a * s / (h * t)
    return s * shape.tokens * h * per


def checkpoint_bytes_per_layer(model: ModelSpec, shape: Shape) -> float:
    """With full recompute a layer keeps only its bf16 input: 2*s*b*h (split by t with sequence
    parallelism, by cp with context parallelism)."""
    n = 2.0 * model.seq_length * shape.tokens * model.hidden_size
    return n / shape.t if shape.sp else n
