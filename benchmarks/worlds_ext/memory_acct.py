"""Peak memory per GPU: tensors saved op by op, in-flight micro-batches per the framework's own schedule,
model states as each framework keeps them, and the caching allocator's rounding and fragmentation.

- Saved tensors of one layer for one micro-batch, walked op by op through the layer (what each autograd
  function keeps for its backward): norm inputs and fp32 row statistics, each linear's input (sharded with
  sequence parallelism: Megatron re-gathers it in the backward), FlashAttention's q, k, v, output and fp32
  log-sum-exp, 1-byte dropout masks (GPT), GELU's input and output, or SwiGLU's gate, up and silu(gate) in
  eager PyTorch (two of them where fused). Drawn per world: whether the attention kernel keeps contiguous
  copies of q, k, v (a layout transpose before the kernel), whether the stack casts the logits to fp32
  for the loss (Megatron's vocab-parallel cross entropy does: `vocab_parallel_logits.float()`), and in
  eager Llama code whether the RMSNorm runs on an fp32 copy (`self._norm(x.float())`, keeping x.float() and
  its normalised copy) and the rotary embedding on complex fp32 copies of q and k (view_as_complex).
- Recompute: full keeps each layer's input and, during a layer's backward, that one layer's whole set;
  selective drops what the framework recomputes (Megatron: the attention core's tensors; torchtitan's
  per-op policy: the element-wise outputs, keeping the matmul outputs).
- In flight on a pipeline rank: DeepSpeed's pipeline engine allocates max(2, min(stages - stage, m))
  buffers (deepspeed/runtime/pipe/schedule.py, TrainSchedule.num_pipe_buffers); Megatron-Core's 1F1B holds
  min(pp - rank, m) micro-batches and its interleaved schedule (pp - rank - 1) * 2 + (vp - 1) * pp + 1
  chunks (schedules.py, get_pp_rank_microbatches' warm-up count).
- Model states, bytes per parameter on this GPU: Megatron-Core keeps bf16 weights and an fp32 main-grad
  buffer, its distributed optimizer shards fp32 master weights and Adam moments over dp; DeepSpeed's bf16
  optimizer keeps a drawn gradient accumulation width and shards its fp32 master weights and moments over dp even at
  ZeRO stage 0 (BF16_Optimizer); torchtitan's FSDP2 shards fp32 parameters,
  gradients and moments, gathering one layer's bf16 parameters plus a prefetched one -- under pipeline
  parallelism the whole stage's, with its unsharded fp32 gradients accumulated over the micro-batches
  (torchtitan's default reshard policy, PyTorch's pipeline stage).
- CPU activation offloading (Megatron-Core, pp 1): the offloaded layers' saved tensors leave the GPU but for a drawn
  number of layers in flight (copy and reload buffers; resident_layers).
- Allocator: every block rounded to 512 bytes, blocks over 1 MB to 2 MB, then a drawn fragmentation share
  of the allocated peak that grows with the in-flight micro-batches (blocks of different lifetimes), plus
  the CUDA context, communicator buffers per process group and workspaces (drawn).
  A trial runs out of memory when all of it exceeds the usable capacity; one that ran reports its allocated
  bytes (peak_allocated_gb), as a GPU run's max_memory_allocated and every tuner runner do.
"""

from __future__ import annotations

import math

from tuner.layout import Layout
from tuner.specs import Workload
from worlds_ext import geometry

GB = 1e9
MB = 1 << 20


def _round(nbytes: float) -> float:
    """The caching allocator's block size for a request."""
    if nbytes <= MB:
        return math.ceil(nbytes / 512) * 512
    return math.ceil(nbytes / (2 * MB)) * 2 * MB


def layer_saved(ph, c: geometry.Cut, w: Workload, recompute: str, selective: str, eager_swiglu: bool) -> list[float]:
    """Blocks (bytes) one layer keeps for its backward per micro-batch."""
    T, m = c.tokens, w.model
    H = c.hidden / (c.tp if c.sp else 1)
    q, kv = c.heads * c.head_dim, c.kv_heads * c.head_dim
    llama = m.ffn_type == "swiglu"
    norm = [2 * H * T, 8 * T]                                   # input, fp32 mean / rstd (or rstd)
    if ph.get("norm_fp32") and eager_swiglu:     # eager RMSNorm in fp32: x.float() and its normalised copy
        norm += [4 * H * T, 4 * H * T]
    attn_core = [2 * (q + 2 * kv) * T, 2 * q * T, 4 * c.heads * T]
    if ph["qkv_copy"]:
        attn_core.append(2 * (q + 2 * kv) * T)
    if ph.get("rope_fp32") and llama:            # rotary in complex fp32: float copies of q and k
        attn_core.append(4 * (q + kv) * T)
    blocks = norm + [2 * H * T] + attn_core + norm + [2 * H * T]
    if m.is_moe:                                 # the experts' tensors are counted per routed token (rank_breakdown)
        ffn_elementwise = []
    elif not llama:
        blocks += [H * T, H * T, 2 * c.ffn_in * T, 2 * c.ffn * T]   # two dropout masks, GELU in and out
        ffn_elementwise = [2 * c.ffn_in * T]
    else:
        act = [2 * c.ffn_in * T] + ([2 * c.ffn * T] if eager_swiglu else [])
        blocks += act + [2 * c.ffn * T]
        ffn_elementwise = act
    if recompute == "selective":
        drop = attn_core[1:] if selective == "core-attention" else ffn_elementwise + norm[1:]
    else:                                        # Megatron-Core's module sets: norms, the activation, the MLP
        drop = (norm * 2 if "norm" in recompute else []) + (ffn_elementwise if "act" in recompute else []) \
            + (ffn_elementwise + [2 * c.ffn * T] if "mlp" in recompute and not m.is_moe else [])
    for b in drop:
        if b in blocks:
            blocks.remove(b)
    return [_round(b) for b in blocks]


def resident_layers(ph, layout: Layout, layers: int) -> float:
    """Layers of a stage whose activations are on the GPU at its peak: all of them, less those Megatron-Core's CPU
    offloading copied to the host (offload_layers, pp 1), of which the world's off_buffers stay while in flight."""
    n = min(layout.offload_layers, layers)
    return layers - n + min(n, int(ph["off_buffers"]))


def saved_layer_bytes(ph, layout: Layout, w: Workload) -> float:
    """Bytes one layer keeps for its backward per micro-batch (what an offloaded layer copies to the host and back)."""
    return sum(layer_blocks(ph, layout, w)[1])


def in_flight(layout: Layout, w: Workload, rank: int) -> float:
    """Micro-batches (in whole-stage units) whose activations a pipeline rank holds at its peak."""
    pp, vp, m = layout.pp, layout.virtual_pipeline, geometry.micro_batches(layout, w)
    if pp == 1:
        return 1.0
    if w.framework == "megatron-deepspeed":
        return float(max(2, min(pp - rank, m)))
    if vp == 1:
        return float(min(pp - rank, m))
    chunks = min((pp - rank - 1) * 2 + (vp - 1) * pp + 1, m * vp)
    return chunks / vp


def state_bytes_per_param(ph, layout: Layout, w: Workload) -> tuple[float, float]:
    """(bytes per parameter kept whole on this GPU, bytes per parameter sharded over dp)."""
    z, fw = layout.zero_stage, w.framework
    if fw == "torchtitan":
        return 0.0, 4 + 4 + 8
    if fw == "megatron-core":    # distributed optimizer (1); Megatron-FSDP optim_grads (2), optim_grads_params (3)
        return {0: (2 + 4 + 12, 0.0), 1: (2 + 4, 12.0), 2: (2.0, 4 + 12.0), 3: (0.0, 2 + 4 + 12.0)}[z]
    grad = ph["ds_grad_bytes"]                       # DeepSpeed: bf16 grads plus its accumulation buffer
    # bf16 at stage 0 runs DeepSpeed's BF16_Optimizer, which partitions its fp32 master weights (and so the optimizer's
    # moments) over the data-parallel group and keeps its fp32 gradient buffer whole (deepspeed/runtime/bf16_optimizer.py
    # lines 174-192 at v0.19.8), as stage 1 keeps them here; FP16_Optimizer would keep everything whole
    if z in (0, 1):
        return 2 + grad, 12.0
    if z == 2:
        return 2.0, grad + 12
    return 0.0, 2 + grad + 12


def rank_params(layout: Layout, w: Workload, rank: int) -> tuple[float, float]:
    """(dense parameters, expert parameters) held by one GPU of pipeline rank `rank`."""
    m = w.model
    layers = geometry.stage_layers(layout, w)[rank]
    split, whole = geometry.layer_params(w)
    dense = layers * (split / layout.tp + whole)
    emb = m.vocab_size * m.hidden_size / layout.tp
    if rank == 0:
        dense += emb + (geometry.embedding_params(w) - m.vocab_size * m.hidden_size)
    if rank == layout.pp - 1 and (layout.pp > 1 or not m.tie_embeddings):
        dense += emb
    moe_layers = layers if m.is_moe else 0
    experts = moe_layers * geometry.expert_params(w) / (layout.expert_parallel * layout.expert_tensor_parallel)
    return dense, experts


def layer_blocks(ph, layout: Layout, w: Workload) -> tuple[list[float], list[float]]:
    """(blocks a layer without recompute keeps, blocks it keeps under the layout's recompute) per micro-batch, an MoE
    layer's routed tokens included."""
    c, fw = geometry.cut(layout, w), w.framework
    selective = "op" if fw == "torchtitan" else "core-attention"
    full = layer_saved(ph, c, w, "none", selective, fw == "torchtitan")
    layer = [_round(2 * c.hidden / (c.tp if c.sp else 1) * c.tokens)] if layout.recompute == "full" else \
        layer_saved(ph, c, w, layout.recompute, selective, fw == "torchtitan")
    act_recomputed = "act" in layout.recompute or "mlp" in layout.recompute
    if w.model.is_moe:
        # this GPU's routed tokens, gathered over the expert-TP group, each at 1/etp of the expert's width:
        # the permuted input and the output (h wide), fc1's output and the activation's (3 f / etp wide)
        etp = layout.expert_tensor_parallel
        routed = c.tokens * w.model.moe_top_k / (layout.tp if layout.sequence_parallel else 1) * etp
        f_e = w.model.moe_ffn_hidden_size // etp
        moe = [_round(2 * routed * w.model.hidden_size * 2), _round(2 * routed * f_e * (2 if act_recomputed else 3))]
        full = full + moe
        if layout.recompute != "full":           # full recompute keeps only each layer's input
            layer = layer + moe
    return full, layer


def rank_breakdown(ph, layout: Layout, w: Workload, rank: int) -> dict[str, float]:
    """Bytes of one GPU of pipeline rank `rank` at its peak, by component (allocated), plus the allocator's."""
    c, fw = geometry.cut(layout, w), w.framework
    dense, experts = rank_params(layout, w, rank)
    shard = layout.dp * layout.context_parallel
    whole_b, shard_b = state_bytes_per_param(ph, layout, w)
    expert_dp = max(1, layout.tp * layout.context_parallel * layout.dp
                    // (layout.expert_parallel * layout.expert_tensor_parallel))
    out = {"states": dense * (whole_b + shard_b / shard) + experts * (whole_b + shard_b / expert_dp)}
    split, _ = geometry.layer_params(w)
    if fw == "torchtitan" and layout.pp > 1 and shard > 1:
        # torchtitan under PP does not reshard after forward (distributed/fsdp.py, the "default" policy:
        # `not pp_enabled`) and PyTorch's pipeline stage turns off resharding after backward and gradient
        # sync for every micro-batch but the last (pipelining/stage.py, backward_maybe_with_nosync): the
        # stage's bf16 parameters stay gathered for the whole step and its unsharded gradients accumulate
        # in the reduce dtype, fp32 (FSDPParam.to_accumulated_grad_if_needed; mixed_precision_reduce)
        out["gathered"] = (dense + experts) * (2.0 + 4.0)
    elif fw == "torchtitan" or layout.zero_stage == 3:     # the gathered unit, the prefetched one, its grads
        unit = max(split, w.model.vocab_size * w.model.hidden_size) / layout.tp   # a layer, or the LM head
        out["gathered"] = 2 * 2.0 * unit + 4.0 * unit
    full, layer = layer_blocks(ph, layout, w)
    layers = geometry.stage_layers(layout, w)[rank]
    out["activations"] = in_flight(layout, w, rank) * resident_layers(ph, layout, layers) * sum(layer)
    out["working"] = sum(full) * ph["bwd_ws"]                      # one layer's backward working set
    if rank == layout.pp - 1:
        out["logits"] = c.tokens * w.model.vocab_size / layout.tp * (2 + (4 if ph["logits_fp32"] else 0)) * 2
    allocated = sum(out.values())
    out["fragmentation"] = allocated * (ph["frag0"] + ph["frag1"] * math.log2(1 + in_flight(layout, w, rank)))
    groups = sum(d > 1 for d in (layout.tp, layout.pp, layout.dp, layout.context_parallel, layout.expert_parallel))
    out["context"] = (ph["context_gb"] + groups * ph["comm_gb"]) * GB
    return out


def rank_peak_gb(ph, layout: Layout, w: Workload, rank: int) -> float:
    """Reserved memory (GB) of one GPU of pipeline rank `rank` at its peak."""
    return sum(rank_breakdown(ph, layout, w, rank).values()) / GB


def _ranks(layout: Layout) -> range | tuple:
    return range(layout.pp) if layout.pp <= 4 else (0, 1, layout.pp // 2, layout.pp - 2, layout.pp - 1)


def peak_gb(ph, layout: Layout, w: Workload) -> float:
    """The highest reserved memory over the pipeline ranks (GB)."""
    return max(rank_peak_gb(ph, layout, w, r) for r in _ranks(layout))


def peak_allocated_gb(ph, layout: Layout, w: Workload) -> float:
    """The highest bytes allocated over the pipeline ranks (GB): the tensors alone, without the allocator's
    fragmentation, the context and the communicator buffers -- what a GPU run's max_memory_allocated, and so every
    tuner runner, reports as its peak."""
    return max(sum(v for k, v in rank_breakdown(ph, layout, w, r).items() if k not in ("fragmentation", "context"))
               for r in _ranks(layout)) / GB


def peak_reserved_gb(ph, layout: Layout, w: Workload) -> float:
    """The highest bytes the caching allocator holds over the pipeline ranks (GB): the tensors and its
    fragmentation, without the context and the communicator buffers -- what a GPU run's max_memory_reserved
    reports (issue 24 round 7)."""
    return max(sum(v for k, v in rank_breakdown(ph, layout, w, r).items() if k != "context")
               for r in _ranks(layout)) / GB
