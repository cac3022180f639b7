"""A training step's seconds in an extended world: per-chunk op times, the simulated pipeline, the data-
parallel and optimizer tail.

- A layer pass: compute.layer_compute (measured GEMM and attention speeds, counted element-wise bytes),
  bounded below by its kernel launches; tensor-parallel collectives (two all-reduces per pass, or with
  sequence parallelism two all-gathers and two reduce-scatters) at network.py's measured speeds, a drawn
  share hidden under the GEMMs only where the stack overlaps them (Megatron-Core with sequence
  parallelism); the context-parallel ring's K/V sends beyond a drawn share of the attention; an MoE layer's
  token all-to-all (dispatch and combine, twice in the backward) and its experts' GEMMs on the busiest
  expert-parallel rank (the drawn expert load), each expert's (tokens, f, h) at the measured speed of
  that small shape.
- Recompute re-runs the forward of what it dropped: the whole layer (full), the attention core (Megatron's
  selective), the element-wise ops and a drawn share of the matmuls (torchtitan's per-op policy).
- The first chunk adds the embedding, the last the LM head GEMM and the loss; stages are the framework's
  split (geometry.stage_chunks) and the pipeline is schedule.pipeline_time with the framework's host cost
  per op, the straggler GPU's stage slowed and log-normal jitter.
- Tail: gradient reduce-scatter / all-reduce and parameter all-gather over dp x cp at their byte widths
  (fp32 main grads in Megatron-Core, bf16 in DeepSpeed), hidden by a drawn share of the last backward where
  the stack overlaps them; an MoE's expert weights over their own expert-data-parallel group (ep x etp ranks
  apart), as Megatron-Core's expert buffers; ZeRO-2 reduce-scatters every micro-batch and ZeRO-3 / FSDP2
  gathers every layer pass (partly prefetched); tied-embedding all-reduce between the first and last stage; the optimizer's
  drawn bytes per local parameter over HBM; a fixed host cost per step.
- CPU activation offloading (Megatron-Core, pp 1): the offloaded layers' saved tensors cross the host link once each
  way per micro-batch, a drawn share hidden under the pass (offload_s); they leave the GPU's memory but for the
  drawn buffers in flight (memory_acct.resident_layers).
"""

from __future__ import annotations

import zlib

import numpy as np

from tuner.layout import Layout
from tuner.specs import Workload
from worlds_ext import compute, geometry, network
from worlds_ext.memory_acct import rank_params, saved_layer_bytes
from worlds_ext.schedule import pipeline_time

FUSED = {"megatron-core": True, "megatron-deepspeed": True, "torchtitan": False}
KERNEL = {"megatron-core": "cudnn", "megatron-deepspeed": "fa2", "torchtitan": "fa2"}


def _layer(ph, layout: Layout, w: Workload, moe: bool) -> tuple[float, float]:
    """(forward, backward) seconds of one layer pass for one micro-batch, communication included."""
    c, fw, gpn = geometry.cut(layout, w), w.framework, w.cluster.gpus_per_node
    llama = w.model.ffn_type == "swiglu"
    gemms = geometry.attention_gemms(c) if moe else geometry.dense_gemms(c)
    t = compute.layer_compute(ph, c, llama, FUSED[fw], KERNEL[fw], gemms)
    kernels = ph["kernels"] * (1.0 if FUSED[fw] else ph["eager_kernels"])
    if fw == "torchtitan" and layout.tp > 1:        # DTensor's dispatch on every sharded op, on the host
        kernels *= 1 + ph["dtensor_us"] / ph["launch_us"]
    if fw == "torchtitan" and layout.context_parallel > 1:     # SDPA on load-balanced shards of the sequence
        t["attn_f"], t["attn_b"] = t["attn_f"] / ph["tt_cp_eff"], t["attn_b"] / ph["tt_cp_eff"]
    fwd = compute.host_bound(t["gemm_f"] + t["attn_f"] + t["ew_f"], kernels, ph)
    bwd = compute.host_bound(t["gemm_b"] + t["attn_b"] + t["ew_b"], 2 * kernels, ph)
    act = 2.0 * c.tokens * c.hidden
    if layout.tp > 1:
        if layout.sequence_parallel:
            tp = 2 * (network.collective(ph, "all-gather", act, layout.tp, 1, gpn)
                      + network.collective(ph, "reduce-scatter", act, layout.tp, 1, gpn))
        else:
            tp = 2 * network.collective(ph, "all-reduce", act, layout.tp, 1, gpn)
        hidden = ph["tp_overlap"] if (fw == "megatron-core" and layout.sequence_parallel) else 0.0
        fwd += tp * (1 - hidden)
        bwd += tp * (1 - hidden)
    if layout.context_parallel > 1:
        cp, kv = layout.context_parallel, 2.0 * 2 * c.kv_heads * c.head_dim * c.tokens
        if fw == "torchtitan":      # torchtitan's parallelism.context_parallel_rotate_method, default "allgather":
            # every K/V shard gathered after the first sub-SDPA (a drawn share hidden), dK/dV scattered back
            ag = network.collective(ph, "all-gather", kv * cp, cp, layout.tp, gpn)
            ring_f, ring_b = ag, ag + network.collective(ph, "reduce-scatter", kv * cp, cp, layout.tp, gpn)
        else:                       # Megatron-Core's ring: cp - 1 K/V sends under the attention blocks
            ring_f = (cp - 1) * network.p2p(ph, kv, layout.tp * cp > gpn, gpn)
            ring_b = 2 * ring_f
        fwd += max(0.0, ring_f - ph["cp_overlap"] * t["attn_f"])
        bwd += max(0.0, ring_b - ph["cp_overlap"] * t["attn_b"])
    if moe:
        mf, mb = _experts(ph, layout, w, c)
        fwd, bwd = fwd + mf, bwd + mb
    bwd += _recompute(ph, layout, w, t, fwd)
    if w.framework == "torchtitan" or (w.framework == "megatron-core" and layout.zero_stage == 3):
        sf, sb = _fsdp_layer(ph, layout, w, fwd, bwd)
        fwd, bwd = fwd + sf, bwd + sb
    return fwd, bwd


def _recompute(ph, layout: Layout, w: Workload, t: dict, fwd: float) -> float:
    """Backward seconds added by re-running what the recompute mode dropped (Megatron-Core's module sets:
    the norms and activations are element-wise work, the MLP its GEMMs too)."""
    mode = layout.recompute
    if mode == "full":
        return fwd
    if mode == "selective":
        return t["ew_f"] + ph["sac_mm"] * t["gemm_f"] if w.framework == "torchtitan" else t["attn_f"]
    extra = 0.0
    if "norm" in mode or "act" in mode:
        extra += 0.5 * t["ew_f"]
    if "mlp" in mode:
        extra += 0.6 * t["gemm_f"] + 0.5 * t["ew_f"]
    return extra


def _experts(ph, layout: Layout, w: Workload, c) -> tuple[float, float]:
    """(forward, backward) seconds of an MoE layer's experts and token all-to-all on the busiest rank."""
    m, ep, etp, gpn = w.model, layout.expert_parallel, layout.expert_tensor_parallel, w.cluster.gpus_per_node
    load = ph["expert_load"]
    local = m.num_experts // ep
    busiest = max(sum(load[r * local:(r + 1) * local]) for r in range(ep))
    tokens_rank = c.tokens / (layout.tp if layout.sequence_parallel else 1)
    routed = tokens_rank * ep * etp * m.moe_top_k            # tokens the ep group routes to its experts
    f_e = m.moe_ffn_hidden_size // etp
    f_in = (2 if m.ffn_type == "swiglu" else 1) * f_e
    per_expert = routed * busiest / local
    gf, gb = compute.gemm_pass(ph, [(per_expert, f_in, m.hidden_size), (per_expert, m.hidden_size, f_e)] * local)
    a2a = 0.0
    if etp > 1:      # expert TP: the routed tokens all-gathered over etp before the experts, reduce-scattered after
        routed_bytes = 2.0 * tokens_rank * etp * m.moe_top_k * m.hidden_size
        a2a += (network.collective(ph, "all-gather", routed_bytes, etp, 1, gpn)
                + network.collective(ph, "reduce-scatter", routed_bytes, etp, 1, gpn))
    if ep > 1:
        nbytes = 2.0 * tokens_rank * m.moe_top_k * m.hidden_size
        skew = ph["moe_skew"] ** (busiest * ep - 1)        # the busiest rank receives busiest * ep of a fair share
        a2a += 2 * network.collective(ph, "all-to-all", nbytes, ep, etp, gpn) * skew
    overlap = ph["ep_overlap"] if (w.framework == "megatron-core" and ep > 1 and layout.recompute != "full"
                                   and (layout.pp == 1 or layout.virtual_pipeline > 1)) else 0.0
    host = ph["moe_kernels"] * local * ph["launch_us"] * 1e-6
    return gf + host + a2a * (1 - overlap), gb + 2 * host + 2 * a2a * (1 - overlap)


def expert_dp(layout: Layout) -> tuple[int, int]:
    """(size, stride) of the expert-data-parallel group: Megatron-Core's expert ranks are etp x ep x edp in the
    order tp-ep-dp (megatron/core/parallel_state.py @ 00119989, expert_decoder_rank_generator), so an expert's
    replicas are ep * etp ranks apart and there are tp * cp * dp / (ep * etp) of them."""
    span = layout.expert_parallel * layout.expert_tensor_parallel
    return max(1, layout.tp * layout.context_parallel * layout.dp // span), span


def _fsdp_layer(ph, layout: Layout, w: Workload, fwd: float, bwd: float) -> tuple[float, float]:
    """FSDP2's / Megatron-FSDP's exposed per-layer all-gathers (forward, again in the backward) and gradient
    reduce-scatter: the dense weights over dp x cp, the experts' over the expert-data-parallel group."""
    split, _ = geometry.layer_params(w)
    (esize, estride), gpn = expert_dp(layout), w.cluster.gpus_per_node
    groups = ((split / layout.tp, layout.dp * layout.context_parallel, layout.tp),
              (geometry.expert_params(w) / estride, esize, estride))
    ag = sum(network.collective(ph, "all-gather", 2.0 * n, size, stride, gpn) for n, size, stride in groups)
    rs = sum(network.collective(ph, "reduce-scatter", 4.0 * n, size, stride, gpn) for n, size, stride in groups)
    if ag + rs <= 0:
        return 0.0, 0.0
    hide = ph["fsdp_overlap"]
    return max(0.0, ag - hide * fwd), max(0.0, ag + rs - hide * bwd)


def chunk_times(ph, layout: Layout, w: Workload) -> tuple[list, list]:
    """fwd[r][k], bwd[r][k]: seconds of one micro-batch through chunk k of pipeline rank r."""
    moe = w.model.is_moe
    lf, lb = _layer(ph, layout, w, moe)
    chunks = geometry.stage_chunks(layout, w)
    c = geometry.cut(layout, w)
    hbm = ph["hbm_gbps"] * 1e9 * ph["hbm_eff"]
    emb_f, emb_b = 4.0 * c.tokens * c.hidden / hbm, 8.0 * c.tokens * c.hidden / hbm
    M, N, K = geometry.lm_head_gemm(layout, w)
    hf, hb = compute.gemm_pass(ph, [(M, N, K)])
    loss = 3 * 6.0 * M * N / hbm
    fwd = [[n * lf for n in row] for row in chunks]
    bwd = [[n * lb for n in row] for row in chunks]
    fwd[0][0] += emb_f
    bwd[0][0] += emb_b
    fwd[-1][-1] += hf + loss
    bwd[-1][-1] += hb + loss
    return fwd, bwd


def _slow(ph, layout: Layout, w: Workload) -> list[float]:
    """Per pipeline rank, its straggler factor: the stage holding the world's slow GPU runs slower."""
    stage_gpus = w.gpus // layout.pp
    slow = [1.0] * layout.pp
    slow[min(int(ph["straggler_at"] * w.gpus) // stage_gpus, layout.pp - 1)] = ph["straggler"]
    return slow


def offload_s(ph, layout: Layout, w: Workload, fwd: float, bwd: float) -> tuple[float, float]:
    """(forward, backward) seconds per micro-batch that Megatron-Core's CPU activation offloading (offload_layers, pp
    1) adds beyond the pass it runs under: each offloaded layer's saved tensors go to the host in the forward and come
    back in the backward at the world's share of the host link, a drawn share of the pass's compute hiding them."""
    n = layout.offload_layers
    if not n:
        return 0.0, 0.0
    copy = n * saved_layer_bytes(ph, layout, w) / (ph["host_gbps"] * 1e9 * ph["host_eff"])
    return max(0.0, copy - ph["off_overlap"] * fwd), max(0.0, copy - ph["off_overlap"] * bwd)


def pipeline_s(ph, layout: Layout, w: Workload, seed: int) -> tuple[float, list, list]:
    fwd, bwd = chunk_times(ph, layout, w)
    if layout.offload_layers:                    # pp 1: one chunk holds every layer
        f, b = offload_s(ph, layout, w, fwd[0][0], bwd[0][0])
        fwd[0][0], bwd[0][0] = fwd[0][0] + f, bwd[0][0] + b
    c, gpn = geometry.cut(layout, w), w.cluster.gpus_per_node
    scatter = layout.tp if (layout.sequence_parallel or w.framework != "megatron-deepspeed") else 1
    nbytes = 2.0 * c.tokens * c.hidden / scatter
    crosses = layout.tp * layout.context_parallel * layout.dp >= gpn
    p2p = network.p2p(ph, nbytes, crosses, gpn) if layout.pp > 1 else 0.0
    if layout.virtual_pipeline > 1 and w.framework == "megatron-core":
        p2p *= 1 - ph["p2p_overlap"]
    rng = np.random.default_rng([seed, zlib.crc32(layout.key().encode())])
    m = geometry.micro_batches(layout, w)
    t = pipeline_time(fwd, bwd, p2p, ph["mb_ms"] * 1e-3, _slow(ph, layout, w), ph["jitter"], m, rng)
    return t, fwd, bwd


def _grad_sync(ph, z: int, m: int, grad_bytes: float, params: float, size: int, stride: int, gpn: int) -> float:
    """Seconds of one data-parallel group's gradient reduction and parameter gather (ZeRO stage z, m micro-
    batches) for `params` parameters per rank, on `size` ranks `stride` apart."""
    if size <= 1 or params <= 0:
        return 0.0
    if z == 0:
        return network.collective(ph, "all-reduce", grad_bytes * params, size, stride, gpn)
    t = (network.collective(ph, "reduce-scatter", grad_bytes * params, size, stride, gpn)
         + network.collective(ph, "all-gather", 2.0 * params, size, stride, gpn))
    if z == 2:
        t += (m - 1) * network.collective(ph, "reduce-scatter", 2.0 * params, size, stride, gpn)
    if z == 3:
        per_pass = network.collective(ph, "all-gather", 2.0 * params, size, stride, gpn)
        t += m * 2 * per_pass * (1 - ph["z3_prefetch"])
    return t


def tail_s(ph, layout: Layout, w: Workload, fwd: list, bwd: list) -> float:
    """Seconds after (or exposed beside) the pipeline: DP / ZeRO, embedding sync, optimizer, step cost.
    The experts' gradients go over the expert-data-parallel group, in buffers of their own (Megatron-Core:
    megatron/core/distributed/distributed_data_parallel.py @ 00119989, expert_parallel_buffers on
    intra_expt_dp_group), and the distributed optimizer shards their states over that group."""
    gpn, fw, z = w.cluster.gpus_per_node, w.framework, layout.zero_stage
    dense, experts = rank_params(layout, w, 0)
    shard = layout.dp * layout.context_parallel
    esize, estride = expert_dp(layout)
    grad_bytes = 4.0 if fw == "megatron-core" else 2.0
    m = geometry.micro_batches(layout, w)
    t = 0.0
    if fw == "megatron-core" and z == 3:
        fw = "torchtitan"                        # Megatron-FSDP: per-layer gathers, counted in the layer pass
    if fw != "torchtitan":
        dp = (_grad_sync(ph, z, m, grad_bytes, dense, shard, layout.tp, gpn)
              + _grad_sync(ph, z, m, grad_bytes, experts, esize, estride, gpn))
        hide = ph["dp_overlap"] * sum(bwd[0]) * (m if z == 2 else 1) if fw == "megatron-core" else 0.0
        t += max(0.0, dp - hide)
    if w.model.tie_embeddings and layout.pp > 1:
        emb = w.model.vocab_size * w.model.hidden_size / layout.tp
        t += network.collective(ph, "all-reduce", grad_bytes * emb, 2, w.gpus // layout.pp, gpn)
    sharded = z >= 1 or fw == "torchtitan"
    local = dense / (shard if sharded else 1) + experts / (esize if sharded else 1)
    t += local * ph["opt_bytes"] / (ph["hbm_gbps"] * 1e9 * ph["hbm_eff"]) + ph["step_ms"] * 1e-3
    return t


def step_s(ph, layout: Layout, w: Workload, seed: int) -> float:
    pipe, fwd, bwd = pipeline_s(ph, layout, w, seed)
    return pipe + tail_s(ph, layout, w, fwd, bwd)
