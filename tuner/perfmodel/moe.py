"""Mixture-of-experts layers: their compute, activations and parameters. Pure. The token all-to-all between
the EP ranks, and where an EP group lies: tuner.perfmodel.moe_exchange.

An MoE layer (Megatron-Core's MoELayer; torchtitan's MoE) is a dense layer's attention, then a router
(h x E, run on every token), `moe_top_k` of E routed experts per token and the shared experts every token
runs (one FFN num_shared_experts x moe_ffn_hidden_size wide, split by TP like a dense FFN).

Where the experts live (tuner.layout.why_invalid_experts): each pipeline stage's tp*cp*dp GPUs are
regrouped for the MoE layers as etp x ep x expert-dp, etp fastest in rank order, so an EP group is ep
ranks `etp` apart, spanning ep*etp consecutive ranks (inside a node when that block fits in one). A rank
holds E/ep experts, each split etp ways. With sequence parallelism (Megatron-Core needs it with EP and
TP; torchtitan always shards the sequence) a rank routes its T = b*s/(cp*tp) tokens: the dispatch
all-to-all sends each token's hidden state to the EP ranks of its top_k experts, (ep - 1)/ep of them
elsewhere, the combine all-to-all brings the expert outputs back; the etp ranks of an expert then
all-gather the tokens they share and reduce-scatter the outputs. Per GPU the routed experts do
2*T*top_k*(expert weights) FLOPs forward whatever ep and etp are, as a grouped GEMM of E/ep local
experts, each on T*top_k*ep*etp/E tokens, run as one kernel (tuner.perfmodel.compute.gemm_time of
their total).

Routing is taken as balanced: every expert gets its fair share of tokens (MOE_LOAD = 1), as NVIDIA's
published MoE benchmarks force (Megatron-Bridge performance summary: "we force-balance the token
distribution among experts"; Megatron-Core --moe-router-force-load-balancing). A capacity factor below 1
drops the excess (the load is the factor); a dropless router in real training runs its busiest rank
slower than this, which the model does not see.
"""

from __future__ import annotations

from tuner.perfmodel.compute import (ELEMENTWISE_REPLICATED, FP8_CAST_BYTES, SCORE_BYTES, Shape, _assemble,
                                     activation_function_bytes, attention_split_bytes, gemm_time)
from tuner.specs import ClusterSpec, ModelSpec

MOE_LOAD = 1.0          # tokens an expert gets / its fair share (balanced routing; see the module's docstring)
PERMUTE_BYTES = 8.0     # per routed token copy and h: permute before dispatch and unpermute after combine,
                        # each reads and writes a bf16 hidden state (2 x 2 x 2 bytes)
# A fixed cost per MoE layer and micro-batch (forward + backward) beyond its FLOPs and bytes: the dropless
# router's device-to-host sync of the tokens per expert (Megatron-Core's alltoall dispatcher sizes its
# buffers from it every layer), which drains the launch queue, and the many small kernels of routing,
# permutation and the load-balancing loss that then run launch-bound. Chosen after seeing rows:
# benchmarks/moe_accuracy.py's tuning rows of current releases (0, 1, 1.5, 2, 2.5 and 3 ms tried; 2.5 gives
# the smallest median error: without it every MoE row was predicted 17-55 % too fast, the dense H100 rows
# of the same tables 0-20 %). Independent of the layer's size: it fits Qwen3-30B-A3B (h 2048) and
# Qwen3-235B-A22B (h 4096) alike. The sync is not all of it: the alltoall dispatcher runs none when it drops and
# pads to capacity (token_dispatcher.py preprocess, core_v0.9.0 to d98e8a64ddf3), yet without this cost moe_accuracy's
# 25 drop-and-pad rows (Grok-1, DeepSeek-V3 v25.05, Llama 4, Megatron-Bridge 25.09 token-drop) predict 6-21 points
# faster, the 18 Grok-1 rows +14 to +28 % (issue 25 round 4, at 9d58919: printed, not applied).
# Both parts are host-side: neither is there when the whole iteration replays as one CUDA graph (layer_overhead).
MOE_LAYER_OVERHEAD_MS = 2.5
ROUTER_BYTES = 12.0     # per token and expert: fp32 router logits written, read by the softmax/top-k, probs written


def load(model: ModelSpec) -> float:
    """Tokens per expert relative to a fair share: MOE_LOAD, or the capacity factor when it is lower."""
    cf = model.moe_capacity_factor
    return min(MOE_LOAD, cf) if cf else MOE_LOAD


def layer_overhead(graphed: bool = False) -> float:
    """Seconds of MOE_LAYER_OVERHEAD_MS per MoE layer and micro-batch; none for a run that replays its whole iteration as
    one CUDA graph with a sync-free token dispatch (TokenExchange.graphed). A captured stream cannot synchronize with the
    host, so a dropless run captured whole (Megatron-Core's full-iteration graph, megatron/core/full_cuda_graph.py,
    NVIDIA/Megatron-LM @ ed870628) sizes its exchange buffers beforehand and keeps the token counts on the GPU: HybridEP's
    non-blocking dispatch (deepseek-ai/DeepEP docs/Hybrid-EP_Implementation.md, 'Non-blocking Mode': "stream
    synchronizations are skipped", the buffer sized by num_permuted_tokens) with a rank capacity and paged stashing (the
    dropless spill-over); and a replay launches
    the captured kernels from the device, so routing's small kernels no longer wait on the host. What those kernels move
    stays charged (moe_block_elementwise_bytes). MLPerf Training v6.0's DeepSeek-V3 configs run so (config_GB300_*
    _full_cg.sh: CUDA_GRAPH_SCOPE=full_iteration, MOE_FLEX_DISPATCHER_BACKEND=hybridep, MOE_PAGED_STASH=True,
    MOE_EXPERT_RANK_CAPACITY_FACTOR=4; Richardyu114/training_results_v6.0 @ eabf23a)."""
    return 0.0 if graphed else MOE_LAYER_OVERHEAD_MS * 1e-3


def rank_tokens(model: ModelSpec, shape: Shape) -> float:
    """Tokens a rank routes per micro-batch: b*s/cp, split by tp with sequence parallelism."""
    n = model.seq_length * shape.tokens
    return n / shape.t if shape.sp else n


def routed_pairs(model: ModelSpec, shape: Shape) -> float:
    """(token, expert) pairs one GPU's experts process per micro-batch: T * top_k * load * etp (the etp
    ranks of an expert each see every token sent to it, and hold 1/etp of its width)."""
    return rank_tokens(model, shape) * model.moe_top_k * load(model) * shape.etp


def moe_gemm_seconds(model: ModelSpec, cluster: ClusterSpec, shape: Shape) -> float:
    """Forward seconds of an MoE layer's GEMMs on one GPU for one micro-batch: QKV and projection (as a
    dense layer's), the router, the shared experts (split by tp) and the routed experts' fc1 and fc2 as
    grouped GEMMs: all local experts in one kernel (Megatron-Core --moe-grouped-gemm; torchtitan's
    grouped_mm), at the efficiency of a GEMM of their total FLOPs."""
    return pre_dispatch_gemm_seconds(model, cluster, shape) + experts_gemm_seconds(model, cluster, shape)


def experts_gemm_seconds(model: ModelSpec, cluster: ClusterSpec, shape: Shape) -> float:
    """Forward seconds of the shared experts' GEMMs (split by tp) and the routed experts' fc1 and fc2 as grouped
    GEMMs (all local experts in one kernel), on one GPU for one micro-batch."""
    h, m, fp8 = model.hidden_size, model.ffn_matrices, shape.fp8
    pairs2, width = 2.0 * routed_pairs(model, shape), model.moe_ffn_hidden_size / shape.etp   # one kernel
    return (sum(shared_gemm_seconds(model, cluster, shape)) + gemm_time(cluster, pairs2 * h * (m - 1) * width, fp8)
            + gemm_time(cluster, pairs2 * width * h, fp8))


def shared_gemm_seconds(model: ModelSpec, cluster: ClusterSpec, shape: Shape) -> tuple[float, float]:
    """Forward seconds of the shared experts' fc1 (gate and up) and fc2 GEMMs (split by tp), one GPU, one
    micro-batch; (0, 0) without shared experts."""
    f_sh, h, t = model.shared_expert_width, model.hidden_size, shape.t
    if not f_sh:
        return 0.0, 0.0
    bs2 = 2.0 * model.seq_length * shape.tokens
    return (gemm_time(cluster, bs2 * h * (model.ffn_matrices - 1) * f_sh / t, shape.fp8),
            gemm_time(cluster, bs2 * f_sh * h / t, shape.fp8))


def router_gemm_seconds(model: ModelSpec, cluster: ClusterSpec, shape: Shape) -> float:
    """Forward seconds of the router's h x E GEMM over the rank's tokens (bf16)."""
    return gemm_time(cluster, 2.0 * rank_tokens(model, shape) * model.hidden_size * model.num_experts)


def pre_dispatch_gemm_seconds(model: ModelSpec, cluster: ClusterSpec, shape: Shape) -> float:
    """Forward seconds of the GEMMs an MoE layer runs before its dispatch (Megatron-Core's
    pre_dispatch_computation): attention's QKV and projection, and the router (bf16)."""
    h, t, fp8 = model.hidden_size, shape.t, shape.fp8
    bs2 = 2.0 * model.seq_length * shape.tokens
    seconds = gemm_time(cluster, bs2 * model.qkv_weights / t, fp8) + gemm_time(cluster, bs2 * model.o_width * h / t, fp8)
    return seconds + router_gemm_seconds(model, cluster, shape)


def moe_elementwise_bytes(model: ModelSpec, shape: Shape, flash_attention: bool) -> float:
    """HBM bytes of an MoE layer's element-wise kernels in a forward pass, per GPU: a dense layer's
    norms, residuals and attention; the shared experts' activation; the routed experts' activation on
    this GPU's pairs; the permutation around the all-to-alls; the router's softmax and top-k."""
    t, h = shape.t, model.hidden_size
    sbh = model.seq_length * shape.tokens * h
    replicated = ELEMENTWISE_REPLICATED / t if shape.sp else ELEMENTWISE_REPLICATED
    n = sbh * (replicated + attention_split_bytes(model) / t) + moe_block_elementwise_bytes(model, shape)
    pairs = routed_pairs(model, shape)
    if shape.fp8:
        n += shape.casts * (sbh * FP8_CAST_BYTES * (2.0 + model.shared_expert_width / h) / t + pairs * FP8_CAST_BYTES * (
            h + model.moe_ffn_hidden_size / shape.etp))
    if not flash_attention:
        n += SCORE_BYTES * model.num_attention_heads * model.seq_length ** 2 * shape.tokens / t
    return n


def moe_block_elementwise_bytes(model: ModelSpec, shape: Shape) -> float:
    """The MoE block's share of moe_elementwise_bytes (what Megatron-Core's `moe` recompute module runs again):
    the shared experts' and the routed pairs' activation, the permutation around the all-to-alls, the router."""
    h, t = model.hidden_size, shape.t
    act, tokens = activation_function_bytes(model), rank_tokens(model, shape)
    n = model.seq_length * shape.tokens * act * model.shared_expert_width / t
    n += routed_pairs(model, shape) * act * model.moe_ffn_hidden_size / shape.etp
    return n + tokens * model.moe_top_k * load(model) * h * PERMUTE_BYTES + tokens * model.num_experts * ROUTER_BYTES


def moe_block_activation_bytes(model: ModelSpec, shape: Shape) -> float:
    """What one MoE layer keeps for backward inside its MoE block (moe_activation_bytes' share of the shared experts,
    the routed pairs, the combine and the routing probabilities), per micro-batch: what Megatron-Core's `moe`
    recompute module (a checkpoint of the whole MoE layer, transformer_config.py line 570 at d98e8a64ddf3) frees,
    keeping only the block's input."""
    h, t, fp8 = model.hidden_size, shape.t, shape.fp8
    f_sh, inner = model.shared_expert_width, activation_function_bytes(model)
    pairs, tokens = routed_pairs(model, shape), rank_tokens(model, shape)
    shared = model.seq_length * shape.tokens * (inner * f_sh - (f_sh if fp8 else 0.0)) / t
    routed = pairs * ((1.0 if fp8 else 2.0) * h + (inner - (1.0 if fp8 else 0.0)) * model.moe_ffn_hidden_size / shape.etp)
    combine = 0.0 if shape.probs_in_experts else tokens * model.moe_top_k * load(model) * 2.0 * h
    return shared + routed + combine + tokens * model.num_experts * 4.0


def moe_layer_times(model: ModelSpec, cluster: ClusterSpec, shape: Shape) -> dict:
    """Seconds of one MoE layer on one GPU for one micro-batch (forward + backward [+ recompute]),
    without its all-to-all (tuner.perfmodel.moe_exchange.alltoall_seconds)."""
    return _assemble(model, cluster, shape, moe_gemm_seconds(model, cluster, shape),
                     moe_elementwise_bytes(model, shape, cluster.flash_attention))


# ----------------------------------------------------------------------------------------- memory
def moe_layer_params(model: ModelSpec, tp: int, ep: int, etp: int) -> tuple[float, float]:
    """(parameters outside the routed experts, routed-expert parameters) of one MoE layer on one GPU:
    attention, QKV biases and shared experts split by tp, the router, norms and projection bias whole;
    the routed experts split over ep (whole experts) and etp (each one's width)."""
    h = model.hidden_size
    split = model.attention_weights + model.attention_biases_split + model.shared_expert_parameters
    whole = model.router_parameters + model.layer_norm_params + (h if model.add_bias_linear else 0)
    return split / tp + whole, model.num_experts * model.expert_parameters / (ep * etp)


def moe_activation_bytes(model: ModelSpec, shape: Shape, flash_attention: bool) -> float:
    """Activations one MoE layer stores for backward, per micro-batch on one GPU: a dense layer's 10
    replicated bytes per s*b*h element and its attention's (split by t), the shared experts' FFN inputs
    (as a dense FFN's), and per routed pair the dispatched hidden state (2h bytes), the expert's inner
    activations ((6 or 4)*f/etp: SwiGLU keeps gate and up and fc2's input), the combine's input (2h per
    token copy) and the fp32 routing probabilities (4 per token and expert). Per-op selective recompute
    (torchtitan) keeps every other GEMM output: half the inner activations.

    The combine's input is kept where the probabilities scale the experts' outputs there (torchtitan; Megatron-Core
    up to 0.12, unpermute(probs=...)). Megatron-Core from 0.13 scales the activation instead (experts.py
    TEGroupedMLP / SequentialMLP: activation_func_with_probs, weighted_bias_swiglu_impl; token_dispatcher.py
    combine: unpermute without probs, keeping only its index map -- core_v0.14.0, core_v0.15.0, core_v0.16.1):
    Shape.probs_in_experts, no combine term."""
    if shape.op_sac:
        return op_sac_moe_bytes(model, shape)
    s, h, t = model.seq_length, model.hidden_size, shape.t
    attention = 2.0 * (model.q_width + model.k_width + model.v_width + model.o_width) / h
    replicated, split = 10.0, attention + activation_function_bytes(model) * model.shared_expert_width / h
    inner = activation_function_bytes(model)
    fp8 = shape.fp8                               # GEMM inputs saved in FP8 (1 byte): QKV, projection, fc1, fc2
    if fp8:
        replicated, split = replicated - 1.0, split - 1.0 - model.shared_expert_width / h
    per = (replicated + split) / t if shape.sp else replicated + split / t
    n = s * shape.tokens * h * per
    if not flash_attention and shape.recompute == "none":
        n += s * shape.tokens * h * 5.0 * model.num_attention_heads * s / (h * t)
    pairs, tokens = routed_pairs(model, shape), rank_tokens(model, shape)
    width = model.moe_ffn_hidden_size / shape.etp
    n += pairs * ((1.0 if fp8 else 2.0) * h + (inner - (1.0 if fp8 else 0.0)) * width)
    combine = 0.0 if shape.probs_in_experts else tokens * model.moe_top_k * load(model) * 2.0 * h
    return n + combine + tokens * model.num_experts * 4.0


def op_sac_moe_bytes(model: ModelSpec, shape: Shape) -> float:
    """What torchtitan's per-op selective recompute keeps of one MoE layer per micro-batch on one rank. Its save
    ops (torchtitan 0.3.0 distributed/activation_checkpoint.py `_get_default_save_ops`: every other mm / linear,
    the attention kernels, topk, max, reduce_scatter, device-to-host copies) hold no aten._grouped_mm, so the
    routed experts and the combine's score multiply are recomputed in the backward and keep nothing; the linears
    counted are wq (1, saved), wk, wv (3, saved), wo, the router's gate (5, saved; 3 with a fused wqkv), the shared
    experts' w1, w3 (saved), w2. Kept per token: the block's input (2h; a 1/t shard with sequence parallelism), Q
    and V (2*(a*d + kv)), the attention output and its fp32 logsumexp (2*a*d + 4a), the shared experts' w3
    output (2*f_sh), all split by t; the gate's fp32 logits (4 per expert) and topk's values and indices (4 + 8
    per choice)."""
    s, h, t = model.seq_length, model.hidden_size, shape.t
    split = (2.0 * (2 * model.q_width + model.kv_size + model.shared_expert_width)
             + 4.0 * model.num_attention_heads) / h
    per = (2.0 + split) / t if shape.sp else 2.0 + split / t
    tokens = rank_tokens(model, shape)
    return s * shape.tokens * h * per + tokens * (4.0 * model.num_experts + 12.0 * model.moe_top_k)


#: torchtitan's per-op SAC recomputes an MoE block in its backward (op_sac_moe_bytes keeps nothing of the routed
#: experts), so that block's backward holds, beside every layer's kept activations, (1) per routed pair the recomputed
#: routed experts and their gradients: 16 bytes per hidden element and 6 per expert-FFN element, and 20 bytes of
#: argsort indices and sorted scores -- peak live bytes in the backward of torchtitan 0.3.0's own RoutedExperts
#: (models/common/moe.py: LocalTokenDispatcher._local_reorder / combine's fp32 score multiply, GroupedExperts' three
#: _grouped_mm and silu * w3) under a recompute-everything checkpoint, counted by storage on the CPU at four shapes
#: (h 256 / 512, f 128 / 256, top-k 4 / 8, 16 / 32 experts: exactly 16h + 6f + 20 per pair, nothing per expert);
#: (2) per token the rest of the block recomputed and its gradients (norms' fp32 statistics, QK-norm, RoPE, the
#: router's scores): OP_SAC_MOE_BLOCK_REST x h, MEASURED -- the fake-tensor tracker's Temp at the peak (the routed
#: experts' backward of layer 46) of torchtitan 0.3.0's Qwen3-30B-A3B under FSDP2 and per-op SAC, 437,820 bytes per
#: token at both 8,192 and 65,536 tokens (benchmarks/data/memory_measured_torchtitan.toml, _rows.toml), less (1);
#: checked on a second shape no choice saw, Qwen3-235B-A22B (h 4096, f 1536, 64 heads; 2 layers built, same method):
#: 868,018 bytes per token measured at 16,384 tokens, 875,475 stated (+0.9 %); at 8,192 tokens its peak is inside the
#: grouped GEMMs' backward (Temp 7.56 GiB, 6.68 stated: the experts' bf16 weight gradients, which fsdp_buffers' 10 bytes
#: per layer parameter already hold).
OP_SAC_MOE_PAIR_H, OP_SAC_MOE_PAIR_F, OP_SAC_MOE_PAIR_FIXED = 16.0, 6.0, 20.0
OP_SAC_MOE_BLOCK_REST = 67.7


def op_sac_moe_backward_bytes(model: ModelSpec, shape: Shape) -> float:
    """The working bytes of one MoE block's backward under torchtitan's per-op SAC (see OP_SAC_MOE_BLOCK_REST), per
    micro-batch on one rank; 0 for any other recompute or a dense model."""
    if not (shape.op_sac and model.num_moe_layers):
        return 0.0
    h, f = model.hidden_size, model.moe_ffn_hidden_size / shape.etp
    pair = OP_SAC_MOE_PAIR_H * h + OP_SAC_MOE_PAIR_F * f + OP_SAC_MOE_PAIR_FIXED
    return routed_pairs(model, shape) * pair + rank_tokens(model, shape) * OP_SAC_MOE_BLOCK_REST * h


def moe_flops_per_token(model: ModelSpec) -> float:
    """Forward GEMM FLOPs per token of the layers (2 x ModelSpec.gemm_weights_per_token): the MoE layers
    count the router, top_k routed experts and the shared experts, as Megatron-Core's
    num_floating_point_operations does (training.py, moe_layer_flops) plus the router it leaves out."""
    return 2.0 * model.gemm_weights_per_token
