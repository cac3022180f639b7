"""Compute time of one pipeline stage for one micro-batch: GEMMs, attention, element-wise work.

Pure functions (docs/reference/formulas.md). Every rate comes from the ClusterSpec:
- GEMMs run at peak * eta(F), eta(F) = matmul_efficiency * F / (F + gemm_knee_gflop), F the FLOPs of
  one GEMM on one GPU (GFLOP): small per-GPU matrices (small b*s, large t, small h) run slower.
- Attention (the s^2 part) runs at peak * attention_efficiency, measured on the FLOPs Megatron counts
  (4*b*s^2*h/t forward). Without FlashAttention the s^2 scores also stream through HBM.
- Element-wise kernels (layer norms, bias + GeLU, dropout, residual adds, the loss) are bound by HBM
  bandwidth: bytes / (hbm_bandwidth * memory_bandwidth_efficiency).
Passes per micro-batch: forward 1, backward 2 (data and weight gradients), and one more forward of
every layer with full recompute, of the attention core only with selective recompute. The LM head is
not recomputed.
Layout (Shape): context parallelism gives each rank s/cp of the sequence (its GEMMs, element-wise
work and its share of the causal attention, balanced over 2*cp chunks); sequence parallelism splits
the element-wise work outside attention and the FFN (norms, dropout, residual adds) by tp too. FP8
(Transformer Engine) runs the layers' GEMMs at the cluster's FP8 rate and casts every GEMM input
(read 2 bytes, write 1; MXFP8 and NVFP4 write two copies, which Transformer Engine's MXFP8 kernel writes in one
pass: cast_units); attention, the LM head and the element-wise kernels stay in bf16. On Hopper the
two backward GEMMs run without fast accumulation (SPLIT_ACCUMULATOR), as Transformer Engine and torchao
run them.
Architecture (ModelSpec): grouped-query attention narrows the QKV GEMM to h x (h + 2kv) and the K/V
traffic; SwiGLU's gate and up matrices run as one fc1 GEMM of width 2f (as Megatron-Core fuses them)
and its element-wise kernel reads two f-wide inputs; RoPE adds a fused rotation of Q and K.
Context parallelism's ring runs the attention in cp steps and merges each step's partial result in
element-wise kernels of its own (cp_merge_bytes).
"""

from __future__ import annotations

from dataclasses import dataclass

from tuner import precision
from tuner.specs import ClusterSpec, ModelSpec

# Element-wise HBM traffic of one layer's forward pass, in bytes per s*b*h element (fp16):
# replicated across TP ranks (no sequence parallelism): two layer norms (read + write: 4 each) and two
# fused bias-dropout-residual adds (read 2 inputs, write the sum and a 1-byte mask: 7 each) = 22;
# split by t (elementwise_split_bytes): FlashAttention reading Q, K, V and writing its output
# (4 + 4kv/h; 8 for GPT), the FFN activation (bias + GeLU: read + write f, 4f/h, 16 for GPT; SwiGLU:
# read gate and up, write their product, 6f/h) and with RoPE the rotation of Q and K (read + write,
# 4 + 4kv/h).
ELEMENTWISE_REPLICATED = 22.0
# Without FlashAttention, per score element (a*s^2*b/t) forward: write scores, softmax read + write,
# dropout read + write + mask, read for the value product (2+4+5+2 bytes).
SCORE_BYTES = 13.0
BACKWARD_TRAFFIC = 2.0          # backward kernels read saved inputs and incoming gradients, write gradients
FLASH_BACKWARD_FLOPS = 2.5      # FlashAttention's backward recomputes the scores: 2.5x forward FLOPs


FP8_CAST_BYTES = 3.0           # an FP8 cast reads bf16 (2 bytes) and writes FP8 (1) per element
# Transformer Engine's MXFP8 quantize writes both copies a GEMM input needs (rowwise and columnwise, each with an E8M0
# scale per 32 elements) in ONE pass over the bf16 input: NVIDIA/TransformerEngine @ d0067d0d,
# transformer_engine/common/cast/mxfp8/quantize_mxfp8.cuh (one kernel, ROWWISE_SCALING and COLWISE_SCALING, each input
# tile read once into shared memory), called once per tensor with both usages set (pytorch/module/linear.py lines
# 386-388 for the input, 903-905 for the output gradient): 2 + 2 x (1 + 1/32) bytes per element, where two casts of
# FP8_CAST_BYTES would move 6 (tuner.precision.CAST_COPIES' 2 copies). Issue 26, fifteenth session.
MXFP8_ONE_PASS_BYTES = 2.0 + 2.0 * (1.0 + 1.0 / 32.0)
# Eager PyTorch runs each element-wise op of a norm, SwiGLU, RoPE or residual as its own kernel: about
# 2.5 times the HBM traffic of fused kernels (RMSNorm alone: square, mean, rsqrt, two multiplies).
# Chosen after seeing torchtitan's 2024-12 eager rows (benchmarks/framework_accuracy.py says which).
UNFUSED_TRAFFIC = 2.5
# torchtitan's per-op selective recompute saves every other GEMM's output: it re-runs the others
# (K, output projection, up: ~0.37 of a Llama layer's GEMM FLOPs; 0.4 taken) and the element-wise work.
OP_SAC_GEMM = 0.4
# FlashAttention-2 (the flash-attn package, or PyTorch SDPA's FLASH_ATTENTION backend) has no Hopper-specific
# kernel: on GPUs with FP8 (Hopper and later) it takes about twice as long as the fused attention of Transformer
# Engine / cuDNN that the clusters' attention_efficiency describes (FlashAttention-3 reports 1.5-2.0x over
# FlashAttention-2 on H100). 2.0 was chosen on benchmarks/framework_accuracy.py's tuning rows (torchtitan and
# llm-foundry runs that ran FlashAttention-2; 1.6, 2.0, 2.4 tried). On GPUs without FP8 (A100) the two are alike: 1.
FA2_ON_HOPPER = 2.0
# The attention kernel each framework runs as `tuner launch` writes it (attention_kernel), and its time relative to
# the cluster's attention_efficiency (kernel_slowdown):
# - "fused": Megatron-Core / Megatron-DeepSpeed (Transformer Engine: cuDNN's fused attention; FlashAttention on ROCm).
# - "cudnn": torchtitan's SDPA on a CUDA GPU. Its launch file targets pytorch/torchtitan 238fa9953e4a
#   (tuner/render/torchtitan.py), whose ScaledDotProductAttentionWrapper (torchtitan/models/attention.py lines
#   156-197) runs F.scaled_dot_product_attention under sdpa_kernel([CUDNN_ATTENTION, FLASH_ATTENTION, MATH],
#   set_priority=True) on every GPU, so cuDNN's fused attention first (from 6a3a9da95, 2025-10-09; from 3b85aa31f,
#   2025-05-14, on compute capability >= 10.0 only); context parallelism wraps that module and keeps its choice
#   (0354f22fb). The Llama 3 flavors and Qwen3's 30B-A3B set no attn_type there (models/llama3/model/args.py line 45,
#   models/qwen3/model/args.py line 39: "sdpa"), and the rendered TOML writes none. The fused rate: 1.
# - "flash-attn-2": torchtitan's SDPA on ROCm (no cuDNN: PyTorch's FLASH_ATTENTION backend) -- FA2_ON_HOPPER where
#   the GPU has FP8, as before (no source measures it against the fused kernel the ROCm presets describe).
# - "flex": torchtitan's DeepSeek-V3 flavors (every MLA model tuner renders: models/deepseek_v3/__init__.py, "671B"
#   attn_type "flex", block_causal mask), FlexAttention compiled by Inductor (FlexAttentionWrapper). No source
#   stored here measures FlexAttention against FlashAttention-2 or cuDNN on Hopper or Blackwell, so it keeps
#   FlashAttention-2's factor, FA2_ON_HOPPER (what tuner charged it before), NOT a measured rate.
ATTENTION_KERNELS = ("fused", "cudnn", "flash-attn-2", "flex")


def attention_kernel(framework, workload) -> str:
    """The attention kernel (ATTENTION_KERNELS) `framework` (a tuner.frameworks.Framework) runs for `workload`."""
    if framework.attention == "fused":
        return "fused"
    if workload.model.multi_latent_attention:
        return "flex"
    return "cudnn" if workload.cluster.software == "cuda" else "flash-attn-2"


def kernel_slowdown(kernel: str, cluster: ClusterSpec) -> float:
    """The attention time of `kernel` relative to the cluster's attention_efficiency (ATTENTION_KERNELS)."""
    if kernel not in ATTENTION_KERNELS:
        raise ValueError(f"attention kernel {kernel!r} is none of {ATTENTION_KERNELS}")
    return FA2_ON_HOPPER if kernel in ("flash-attn-2", "flex") and cluster.peak_tflops_fp8 else 1.0
# Hopper's FP8 tensor cores accumulate in reduced precision unless the kernel promotes partial sums to FP32
# (cuBLASLt CUBLASLT_MATMUL_DESC_FAST_ACCUM = 0, "split accumulator"). Transformer Engine runs the forward GEMM
# with fast accumulation and both backward GEMMs without it (_2X_ACC_FPROP = False, _2X_ACC_DGRAD = _2X_ACC_WGRAD
# = True, transformer_engine/pytorch/module/base.py, also for GroupedLinear); torchao's float8 training does the
# same (use_fast_accum only for the output GEMM, torchao/float8/config.py). Turning fast accumulation on speeds an
# FP8 GEMM 1.1-1.2x on H100 (pytorch/ao issue #2377, a GEMM microbenchmark); 1.15, the middle, is taken: not
# fitted to any training row. Blackwell's (block-scaled) tensor cores accumulate in FP32 and have no such mode
# (TransformerEngine PR #2748 review), so the factor applies to per-tensor FP8 on Hopper-class CUDA GPUs only.
SPLIT_ACCUMULATOR = 1.15


@dataclass(frozen=True)
class Shape:
    """How one rank's share of a layer is cut: micro-batch b, tensor-parallel t (with or without
    sequence parallelism), context-parallel c, the recompute mode and the GEMM precision."""

    b: int
    t: int = 1
    c: int = 1
    sp: bool = False
    recompute: str = "none"
    fp8: bool | str = False       # the layers' GEMM format: False (bf16), "fp8" (FP8, MXFP8) or "fp4" (NVFP4)
    casts: float = 1.0            # quantisation traffic of each GEMM input, in FP8 casts (cast_units)
    op_sac: bool = False          # selective = torchtitan's per-op SAC (saves every other GEMM's output)
    fused: bool = True            # element-wise kernels fused (Transformer Engine, torch.compile) or eager
    gathered_inputs: bool = False  # DTensor TP (torchtitan) saves the all-gathered inputs of its column-parallel
                                   # GEMMs; Megatron's sequence parallelism saves the shard and gathers again
    attention_slowdown: float = 1.0   # attention kernel time relative to the cluster's attention_efficiency
    ep: int = 1                   # expert-parallel and expert tensor-parallel degrees (MoE layers)
    etp: int = 1
    backward_gemm: float = 1.0    # backward GEMMs' time over the forward's at the same FLOPs (SPLIT_ACCUMULATOR)
    probs_in_experts: bool = False  # MoE: the routing probabilities scale the experts' activation, not the combine

    @property
    def tokens(self) -> float:
        """A rank's share of a micro-batch, in sequences: b / cp (b * s / cp tokens)."""
        return self.b / self.c


def shape_of(layout, workload) -> Shape:
    """How `layout` (a tuner.layout.Layout) cuts one rank's share of a layer of `workload`."""
    from tuner.frameworks import of
    fw = of(workload)
    return Shape(b=layout.micro_batch, t=layout.tp, c=layout.context_parallel, sp=layout.sequence_parallel,
                 recompute=layout.recompute, fp8=precision.gemm_format(workload.precision),
                 casts=cast_units(workload.precision, fw, workload.cluster),
                 op_sac=fw.selective == "op" and layout.recompute == "selective", fused=fw.fused(workload.precision),
                 gathered_inputs=fw.sp_with_tp,
                 attention_slowdown=kernel_slowdown(attention_kernel(fw, workload), workload.cluster),
                 ep=layout.expert_parallel, etp=layout.expert_tensor_parallel,
                 backward_gemm=backward_gemm_factor(workload.cluster, precision.gemm_format(workload.precision)),
                 probs_in_experts=fw.moe_probs_in_experts)


def cast_units(precision_name: str, fw, cluster: ClusterSpec) -> float:
    """The quantisation traffic of one GEMM input in FP8 casts (FP8_CAST_BYTES each): tuner.precision.CAST_COPIES,
    except where Transformer Engine's CUDA kernel quantizes MXFP8 (`fw`, a tuner.frameworks.Framework, fuses with
    it: compiled "always"; `cluster` runs CUDA: the cited one-pass kernel is quantize_mxfp8.cuh, ROCm TE's is not
    cited), whose one pass writes both copies (MXFP8_ONE_PASS_BYTES); elsewhere each copy is its own cast."""
    if precision_name == "mxfp8" and fw.compiled == "always" and cluster.software == "cuda":
        return MXFP8_ONE_PASS_BYTES / FP8_CAST_BYTES
    return precision.CAST_COPIES.get(precision_name, 1.0) or 1.0


def backward_gemm_factor(cluster: ClusterSpec, fmt: bool | str) -> float:
    """How much slower the backward (data- and weight-gradient) GEMMs run than the forward one at equal FLOPs:
    SPLIT_ACCUMULATOR for per-tensor FP8 on a Hopper-class CUDA GPU (no block-scaled tensor cores), else 1."""
    return SPLIT_ACCUMULATOR if fmt == "fp8" and cluster.software == "cuda" and not cluster.block_scaled else 1.0


def gemm_efficiency(cluster: ClusterSpec, gflop: float, fp8: bool | str = False) -> float:
    """eta(F) = eta_max * F / (F + F_knee): the fraction of peak one GEMM of `gflop` GFLOP reaches.
    Low-precision GEMMs need proportionally more work to fill the GPU (the knee scales with the peak); their
    eta_max is matmul_efficiency_fp8 where the cluster measured it apart, and FP4's matmul_efficiency_fp4 (else
    the FP8 one: an ESTIMATE)."""
    knee = cluster.gemm_knee_gflop * (fp8_speedup(cluster, fp8) if fp8 else 1.0)
    top = cluster.matmul_efficiency_fp8 if fp8 and cluster.matmul_efficiency_fp8 else cluster.matmul_efficiency
    if fp8 == "fp4" and cluster.matmul_efficiency_fp4:
        top = cluster.matmul_efficiency_fp4
    return top * gflop / (gflop + knee)


def fp8_speedup(cluster: ClusterSpec, fmt: bool | str = "fp8") -> float:
    """The low-precision GEMM rate over the bf16 peak: FP8's, or FP4's for fmt "fp4"."""
    low = cluster.peak_tflops_fp4 if fmt == "fp4" else cluster.peak_tflops_fp8
    return (low or cluster.peak_tflops) / cluster.peak_tflops


def gemm_time(cluster: ClusterSpec, flops: float, fp8: bool | str = False) -> float:
    """Seconds for one GEMM of `flops` FLOPs on one GPU (at the FP8 rate when `fp8`, FP4's when "fp4")."""
    if flops <= 0:
        return 0.0
    peak = cluster.peak_tflops * (fp8_speedup(cluster, fp8) if fp8 else 1.0)
    return flops / (peak * 1e12 * gemm_efficiency(cluster, flops / 1e9, fp8))


def layer_gemm_flops(model: ModelSpec, micro_batch: float, tp: int) -> tuple[float, float, float, float]:
    """Forward FLOPs per GPU of the four GEMMs of a layer: QKV (h x (h + 2kv); MLA's down- and
    up-projections together), attention projection (h x h), fc1 (h x f; h x 2f for SwiGLU's fused gate
    and up), fc2 (f x h). Their sum is 2*b*s*(attention weights + FFN weights)/t: 2*b*s*(4h^2 + 2hf)/t
    for GPT. A fractional micro-batch is a context-parallel rank's share of one (b / cp). MLA's
    down-projections are counted split by t like the rest (Megatron-Core runs them whole on every TP
    rank: 8 % of DeepSeek-V3's attention weights, so an underestimate of its attention GEMMs below 8 %)."""
    bs2 = 2.0 * micro_batch * model.seq_length
    h, f = model.hidden_size, model.ffn_hidden_size
    return (bs2 * model.qkv_weights / tp, bs2 * model.o_width * h / tp, bs2 * h * (model.ffn_matrices - 1) * f / tp,
            bs2 * f * h / tp)


def attention_flops(model: ModelSpec, micro_batch: float, tp: int) -> float:
    """Forward FLOPs per GPU of the score and value products: 4*b*s^2*h/t (h: the attention core's
    width, ModelSpec.attention_core_width, for MLA or a head_dim other than h/a)."""
    return 4.0 * micro_batch * model.seq_length ** 2 * model.attention_core_width / tp


def attention_split_bytes(model: ModelSpec) -> float:
    """Bytes per s*b*h element of the attention's element-wise traffic split by t: the fused kernel
    reads Q, K, V and writes O (4 + 4kv/h for GPT), and RoPE rotates Q and K (read + write: 4 + 4kv/h;
    MLA rotates only its rotary dimensions, a per-head part of Q and one shared key)."""
    h = model.hidden_size
    n = 2.0 * (model.q_width + model.k_width + model.v_width + model.o_width) / h
    if model.position_embedding == "rope":
        if model.multi_latent_attention:
            n += 4.0 * (model.num_attention_heads + 1) * model.qk_pos_emb_head_dim / h
        else:
            n += 4.0 * (model.q_width + model.kv_size) / h
    return n


def activation_function_bytes(model: ModelSpec) -> float:
    """Bytes per element of an FFN's inner width that its activation function moves: gelu reads and
    writes it (4), SwiGLU reads gate and up and writes their product (6)."""
    return 6.0 if model.ffn_type == "swiglu" else 4.0


def elementwise_split_bytes(model: ModelSpec) -> float:
    """Bytes per s*b*h element of the element-wise traffic split by t (24 for GPT)."""
    return attention_split_bytes(model) + activation_function_bytes(model) * model.ffn_hidden_size / model.hidden_size


def elementwise_bytes(model: ModelSpec, shape: Shape, flash_attention: bool) -> float:
    """HBM bytes of one layer's element-wise kernels in a forward pass, per GPU. Sequence parallelism
    splits the replicated part by t; FP8 adds the casts of the four GEMM inputs."""
    t, h, f = shape.t, model.hidden_size, model.ffn_hidden_size
    sbh = model.seq_length * shape.tokens * h
    replicated = ELEMENTWISE_REPLICATED / t if shape.sp else ELEMENTWISE_REPLICATED
    n = sbh * (replicated + elementwise_split_bytes(model) / t)
    if shape.fp8:
        n += sbh * FP8_CAST_BYTES * shape.casts * (3.0 + f / h) / t
    if not flash_attention:
        n += SCORE_BYTES * model.num_attention_heads * model.seq_length ** 2 * shape.tokens / t
    return n


# Context parallelism: Transformer Engine's p2p ring (AttnFuncWithCPAndKVP2P, the ring the model charges,
# comm.cp_ring_time) runs a rank's attention in cp steps and merges their partial results in element-wise kernels
# apart from the attention kernel (NVIDIA/TransformerEngine @ d0067d0d, transformer_engine/pytorch/attention/
# dot_product_attention/context_parallel.py). Forward: the first step's output is rescaled into the result
# (flash_attn_fwd_out_correction_init: read 2, write 2 bytes per output element), every later step's is added to it
# (flash_attn_fwd_out_correction: read the step's output and the result, write the result, 6 bytes; in bf16 where the
# attention runs in bf16, as tuner charges it). Backward: dq, dk and dv are gathered the same way over the steps
# (dq.copy_ / dq.add_, dk.add_, dv.add_ in bf16). With the load-balanced causal chunks, a rank's steps after the first
# cover all its tokens (i <= rank) or half of them (the second half, i > rank): (cp - 1) / 2 of each on average over
# the ranks, 0.75 (cp - 1) whole-tensor merges. The per-token softmax statistics (fp32 per head) are left out (1/d of
# the output's). torchtitan's ring (PyTorch's _templated_ring_attention) merges each step too: the same count is taken.
CP_MERGE_FIRST = 4.0           # bytes per element: the first step's result rescaled (read 2, write 2)
CP_MERGE_STEP = 6.0            # bytes per element of each later step: read the step's and the result, write it
CP_HALF_STEPS = 0.75           # whole-tensor merges per later step, load-balanced causal chunks (see above)


def cp_merge_bytes(model: ModelSpec, shape: Shape) -> tuple[float, float]:
    """(forward, backward) HBM bytes of one layer's context-parallel merges on one GPU for one micro-batch: the
    attention output's in the forward, dq's, dk's and dv's in the backward (none without context parallelism)."""
    if shape.c <= 1:
        return 0.0, 0.0
    per = CP_MERGE_FIRST + CP_MERGE_STEP * CP_HALF_STEPS * (shape.c - 1)
    tokens = model.seq_length * shape.tokens / shape.t     # this rank's tokens, each width split by t
    return (tokens * per * model.o_width,
            tokens * per * (model.q_width + model.k_width + model.v_width))


def _passes(shape: Shape) -> tuple[float, float, float, float]:
    """(GEMM, attention-core, element-wise) forward passes repeated by recompute, and 1 when full."""
    full = 1.0 if shape.recompute == "full" else 0.0            # every layer's forward runs again
    again = 1.0 if shape.recompute in ("selective", "full") and not shape.op_sac else 0.0   # the attention core again
    gemm_again = full + (OP_SAC_GEMM if shape.op_sac else 0.0)
    elem_again = 1.0 if shape.recompute == "full" or shape.op_sac else 0.0
    return gemm_again, again, elem_again, full


def layer_times(model: ModelSpec, cluster: ClusterSpec, shape: Shape) -> dict:
    """Seconds of one dense layer on one GPU for one micro-batch (forward + backward [+ recompute])."""
    gemm_again, again, elem_again, _ = _passes(shape)
    gemm_fwd = sum(gemm_time(cluster, f, shape.fp8) for f in layer_gemm_flops(model, shape.tokens, shape.t))
    return _assemble(model, cluster, shape, gemm_fwd, elementwise_bytes(model, shape, cluster.flash_attention))


def _assemble(model: ModelSpec, cluster: ClusterSpec, shape: Shape, gemm_fwd: float, elem_bytes: float) -> dict:
    """A layer's seconds from its forward GEMM seconds and element-wise bytes, with its attention core."""
    gemm_again, again, elem_again, _ = _passes(shape)
    attn_fwd = (attention_flops(model, shape.tokens, shape.t) * shape.attention_slowdown
                / (cluster.peak_tflops * 1e12 * cluster.attention_efficiency))
    attn_bwd = attn_fwd * (FLASH_BACKWARD_FLOPS if cluster.flash_attention else 2.0)
    hbm = cluster.hbm_bandwidth_gbps * 1e9 * cluster.memory_bandwidth_efficiency
    elem_fwd = elem_bytes / hbm * (1.0 if shape.fused else UNFUSED_TRAFFIC)
    merge_fwd, merge_bwd = cp_merge_bytes(model, shape)     # run again with the attention core they merge
    return {"gemm": gemm_fwd * (1.0 + gemm_again + 2.0 * shape.backward_gemm),
            "attention": attn_fwd * (1.0 + again) + attn_bwd,
            "elementwise": (elem_fwd * (1.0 + elem_again + BACKWARD_TRAFFIC)
                            + (merge_fwd * (1.0 + again) + merge_bwd) / hbm)}


def lm_head_times(model: ModelSpec, cluster: ClusterSpec, micro_batch: float, tp: int) -> dict:
    """Seconds of the last stage's extra work per micro-batch: the LM head GEMM (2*b*s*h*V/t forward,
    backward twice that, never recomputed), the final layer norm and the fp32 cross-entropy
    (about 20 bytes per logit forward + backward)."""
    s, b, h, V = model.seq_length, micro_batch, model.hidden_size, model.vocab_size
    head = gemm_time(cluster, 2.0 * b * s * h * V / tp) * 3.0
    hbm = cluster.hbm_bandwidth_gbps * 1e9 * cluster.memory_bandwidth_efficiency
    loss = (20.0 * s * b * V / tp + 3 * 4.0 * s * b * h) / hbm
    return {"gemm": head, "elementwise": loss}


def embedding_times(model: ModelSpec, cluster: ClusterSpec, micro_batch: float) -> dict:
    """Seconds of the first stage's extra work per micro-batch: embedding lookup, position add and
    dropout forward, and the gradient scatter-add backward (about 12 bytes per s*b*h element; kept for
    RoPE models too, whose rotation is counted in each layer)."""
    hbm = cluster.hbm_bandwidth_gbps * 1e9 * cluster.memory_bandwidth_efficiency
    return {"elementwise": 12.0 * model.seq_length * micro_batch * model.hidden_size / hbm}


def optimizer_time(cluster: ClusterSpec, params_owned: float) -> float:
    """Fused Adam over the parameters this GPU updates; memory-bound: about 32 bytes per parameter
    (read and write fp32 master, momentum and variance, read the gradient, write the fp16 copy)."""
    hbm = cluster.hbm_bandwidth_gbps * 1e9 * cluster.memory_bandwidth_efficiency
    return 32.0 * params_owned / hbm
