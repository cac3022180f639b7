"""Step time and memory of the independent worlds, for every layout of the default space.

Written from first principles and the literature, apart from tuner.perfmodel (imports nothing of it);
the primitives (GEMMs, flash or materialised attention, collectives over the node's geometry) and the
drawn constants' fields are benchmarks/indep_physics.py's (drawn by benchmarks/indep_worlds.py). With
sp, cp, vp, selective recompute and FP8 off, on a GPT model (multi-head attention, GELU, tied
embeddings) and a stack that overlaps nothing (Frontier's Megatron-DeepSpeed), every formula reduces to
the Frontier-only worlds' formulas.

- Model: Q, K, V (GQA: K and V of width num_query_groups x head size), output projection; FFN GELU
  (h->f->h) or SwiGLU (h->2f, f->h, element-wise silu and product); untied LM head on the last stage.
- Sequence parallelism (Korthikanti et al. 2022): the TP all-reduces become all-gathers and
  reduce-scatters of the same bytes (drawn sp_coll x their time); on an overlapping stack (Megatron-
  Core's TP communication overlap, which needs SP) a drawn share sp_overlap of it hides under the GEMMs;
  the norms, dropouts and residuals (the replicated element-wise work and activations) split across TP;
  pipeline sends and the full-recompute checkpoint are the sequence shard.
- Selective recompute (Korthikanti et al. 2022): the attention core re-runs in the backward pass (drawn
  sel_cost x its forward); it frees the s^2 scores of materialised attention, and with flash attention
  only sel_save bytes per token x h (buffers; flash keeps no scores).
- Interleaved 1F1B (Narayanan et al. 2021): step = sum(stages) / v + (m - 1/v) x the slowest stage (the
  bubble shrinks by v); every micro-batch crosses v times more stage boundaries (p2p x v x drawn
  vp_p2p contention) and pays a per-chunk dispatch (vp_mb x mb_ms per extra chunk); the first stage
  holds p + (p - 1) / v micro-batches of activations (Megatron's warm-up), the last ((v - 1) p + 1) / v.
- Context parallelism (ring attention, Megatron CP with 2 cp load-balancing chunks): every GEMM and
  element-wise pass sees s / cp tokens; causal attention work / cp at a drawn cp_eff (smaller blocks);
  cp - 1 ring steps pass K and V (backward also dK, dV), each hidden under that step's attention by
  cp_overlap; cp_kernels launches per step; gradients reduce and ZeRO shards over the dp x cp group
  (rank order TP, CP, DP, PP); cp_buf K/V receive buffers.
- FP8 (Transformer Engine): the layers' GEMMs run at fp8_speedup x the bf16 rate (attention core, LM
  head stay bf16); each GEMM input is cast (fp8_cast bytes per element), weights re-cast in a share
  fp8_wcast of micro-batches, fp8_kernels more launches per pass; fp8_wbytes more bytes per parameter
  (FP8 weight copies), activations x fp8_act.
- Overlapping stack (the workload's framework other than megatron-deepspeed: Megatron-Core --overlap-grad-reduce, --overlap-param-
  gather, --overlap-p2p-comm): mc_overlap of the DP gradient reduce (bounded by the backward) and of
  the parameter all-gather (bounded by a forward) hidden, mc_p2p of the pipeline sends.
"""

from __future__ import annotations

import math

from indep_physics import GB, Physics, attention_s, collective_s, gemm_passes, gemm_s, group_geometry, intra_bw

from tuner.layout import Layout
from tuner.specs import Workload


def _hbm(ph: Physics) -> float:
    return ph.hbm_gbps * GB * ph.hbm_eta


def tokens(w: Workload, lay: Layout) -> int:
    """Tokens of one micro-batch on one rank: b x s / cp."""
    return lay.micro_batch * w.model.seq_length // lay.context_parallel


def tp_comm_s(ph: Physics, w: Workload, lay: Layout, nbytes: float, count: int) -> float:
    """Exposed seconds of `count` TP all-reduces of `nbytes` (with SP: all-gather + reduce-scatter)."""
    ar = count * collective_s(ph, w, lay.tp, 1, nbytes, "ar")
    if not lay.sequence_parallel:
        return ar
    return ar * ph.sp_coll * (1.0 - ph.sp_overlap if (w.framework != "megatron-deepspeed") else 1.0)


def cp_attention_s(ph: Physics, w: Workload, lay: Layout) -> tuple[float, float]:
    """(forward, backward) seconds of one layer's attention core with context parallelism: the rank's
    s/cp queries (two load-balanced chunks) over the causal keys: causal work / cp."""
    b, t, cp = lay.micro_batch, lay.tp, lay.context_parallel
    if cp == 1:
        return attention_s(ph, w, b, t)
    m, peak = w.model, w.cluster.peak_tflops
    s, heads, d = m.seq_length, m.num_attention_heads // t, m.head_size
    sq = s // cp
    if ph.flash:
        blocks = b * heads * math.ceil(sq / ph.attn_block)
        q_wave = (blocks / (math.ceil(blocks / ph.n_cu) * ph.n_cu)) ** ph.wave_exp
        fwd = 2.0 * b * heads * s * s * d / cp / (peak * 1e12 * ph.attn_eta * q_wave * ph.cp_eff)
        return fwd, 2.5 * fwd
    keys = s * (cp + 1) // (2 * cp)          # the keys a rank's queries see, on average (causal chunks)
    score = b * heads * (gemm_s(ph, peak, sq, keys, d) + gemm_s(ph, peak, sq, d, keys)) / ph.cp_eff
    scores = 11.0 * b * heads * sq * keys / _hbm(ph)
    return score + scores, 2.0 * (score + scores)


def cp_ring_s(ph: Physics, w: Workload, lay: Layout, a_fwd: float, a_bwd: float) -> tuple[float, float]:
    """Exposed seconds of the ring's K/V passing (forward, backward) in one layer."""
    cp = lay.context_parallel
    if cp == 1:
        return 0.0, 0.0
    bw, lat, _ = group_geometry(ph, w.cluster.gpus_per_node, cp, lay.tp)
    kv = 2.0 * 2.0 * tokens(w, lay) * w.model.kv_size / lay.tp          # K and V, bf16
    step = kv / (bw * GB * ph.coll_eta) + lat
    fwd = (cp - 1) * max(0.0, step - ph.cp_overlap * a_fwd / cp)
    bwd = (cp - 1) * max(0.0, 2.0 * step - ph.cp_overlap * a_bwd / cp)
    return fwd, bwd


def layer_shapes(w: Workload, lay: Layout) -> tuple:
    """Forward (M, N, K) of the layer's GEMMs on one rank: QKV, output projection, fc1, fc2."""
    m, t, M = w.model, lay.tp, tokens(w, lay)
    h, kv, f = m.hidden_size, m.kv_size, m.ffn_hidden_size
    up = f * (m.ffn_matrices - 1)
    return ((M, (h + 2 * kv) // t, h), (M, h, h // t), (M, up // t, h), (M, h, f // t))


def fp8_cast_s(ph: Physics, w: Workload, lay: Layout) -> float:
    """Seconds of one pass's FP8 casts (inputs of the four GEMMs, a share of weight re-casts)."""
    if w.precision != "fp8":
        return 0.0
    m, t, M = w.model, lay.tp, tokens(w, lay)
    elems = M * (2 * m.hidden_size + m.hidden_size / t + m.ffn_hidden_size / t)
    weights = (m.attention_weights + m.ffn_weights) / t
    return (ph.fp8_cast * elems + 3.0 * ph.fp8_wcast * weights) / _hbm(ph)


def layer_s(ph: Physics, w: Workload, lay: Layout) -> dict:
    """Seconds of one transformer layer pass on one GPU for one micro-batch: fwd, bwd (with their TP
    and CP communication) and recompute, each the larger of GPU time and host launch time."""
    m, t, M, h = w.model, lay.tp, tokens(w, lay), w.model.hidden_size
    fp8 = w.precision == "fp8"
    g_fwd, g_bwd = gemm_passes(ph, w.cluster.peak_tflops * (ph.fp8_speedup if fp8 else 1.0), layer_shapes(w, lay))
    a_fwd, a_bwd = cp_attention_s(ph, w, lay)
    c_fwd, c_bwd = cp_ring_s(ph, w, lay, a_fwd, a_bwd)
    rep = ph.ew_rep / t if lay.sequence_parallel else ph.ew_rep
    ew = M * h * (rep + ph.ew_split / t) / _hbm(ph)
    if m.ffn_type == "swiglu":
        ew += M * m.ffn_hidden_size / t * ph.glu_bytes / _hbm(ph)
    cast = fp8_cast_s(ph, w, lay)
    ar = tp_comm_s(ph, w, lay, 2.0 * M * h, 2)
    kernels = ph.kernels + (ph.fp8_kernels if fp8 else 0.0) + ph.cp_kernels * (lay.context_parallel - 1)
    host, sync = kernels * ph.launch_us * 1e-6, ph.sync_ms * 1e-3
    fwd = max(g_fwd + a_fwd + ew + ar + c_fwd + cast, host) + sync
    bwd = max(g_bwd + a_bwd + 2.0 * ew + ar + c_bwd + cast, 2.0 * host) + sync
    if lay.recompute == "full":
        rec = fwd * ph.recompute
    elif lay.recompute == "selective":
        rec = (a_fwd + c_fwd) * ph.sel_cost
    else:
        rec = 0.0
    return {"fwd": fwd, "bwd": bwd, "rec": rec}


def ends_s(ph: Physics, w: Workload, lay: Layout) -> tuple[float, float]:
    """Extra seconds per micro-batch of the first stage (embedding) and the last (LM head, loss; bf16)."""
    m, t, M = w.model, lay.tp, tokens(w, lay)
    h, V = m.hidden_size, m.vocab_size
    ar = tp_comm_s(ph, w, lay, 2.0 * M * h, 1)
    first = 14.0 * M * h / _hbm(ph) + ar
    head_f, head_b = gemm_passes(ph, w.cluster.peak_tflops, ((M, V // t, h),))
    last = head_f + head_b + 3.0 * ph.logit_bytes * M * V / t / _hbm(ph) + ar
    return first, last


def p2p_s(ph: Physics, w: Workload, lay: Layout) -> float:
    """Exposed seconds of a stage's pipeline sends per micro-batch (activation forward, gradient back;
    v times with interleaving)."""
    if lay.pp <= 1:
        return 0.0
    gpn, span = w.cluster.gpus_per_node, lay.tp * lay.context_parallel * lay.dp
    shard = lay.tp if (ph.p2p_scatter or lay.sequence_parallel) else 1
    nbytes = 2.0 * tokens(w, lay) * w.model.hidden_size / shard
    if span * lay.pp <= gpn:
        bw, lat = intra_bw(ph, 2 * span), ph.lat_intra_us * 1e-6
    else:
        bw, lat = ph.nic_gbps / min(span, gpn), ph.lat_inter_us * 1e-6
    exposed = ph.p2p_exposed * 2.0 * (nbytes / (bw * GB * ph.coll_eta) + lat)
    if lay.virtual_pipeline > 1:
        exposed *= lay.virtual_pipeline * ph.vp_p2p
    return exposed * (1.0 - ph.mc_p2p) if (w.framework != "megatron-deepspeed") else exposed


# ------------------------------------------------------------------------------------------ step
def layer_params(w: Workload) -> tuple[float, float]:
    """(parameters of one layer split across TP, replicated on every TP rank)."""
    m = w.model
    h, kv, f = m.hidden_size, m.kv_size, m.ffn_hidden_size
    bias = 2 * h + 2 * kv + (m.ffn_matrices - 1) * f if m.add_bias_linear else 0
    norm = 2 * h if m.normalization == "layernorm" else h
    return 2 * h * h + 2 * h * kv + m.ffn_matrices * h * f + bias, 2 * norm


def rank_layers(w: Workload, lay: Layout, rank: int) -> int:
    """Transformer layers on pipeline rank `rank`: layers / pp, or, where pp x vp divides only layers + 2,
    Megatron-Core's split counting the embedding and the loss as a layer each (one fewer on the first
    and on the last rank)."""
    L, p = w.model.num_layers, lay.pp
    if L % (p * lay.virtual_pipeline) == 0:
        return L // p
    return (L + 2) // p - (rank == 0) - (rank == p - 1)


def stage_params(w: Workload, lay: Layout, rank: int) -> float:
    """Parameters per GPU on pipeline rank `rank` (embedding on the first, LM head, tied copy or own,
    on the last)."""
    m, t = w.model, lay.tp
    h, V = m.hidden_size, m.vocab_size
    split, rep = layer_params(w)
    layers = rank_layers(w, lay, rank) * (split / t + rep)
    emb = V * h / t
    pos = m.seq_length * h if m.position_embedding == "learned" else 0
    if lay.pp == 1:
        return layers + emb + pos + (0 if m.tie_embeddings else emb)
    if rank == 0:
        return layers + emb + pos
    return layers + emb if rank == lay.pp - 1 else layers


def zero_s(ph: Physics, w: Workload, lay: Layout, params: float, m: int, fb_mb: tuple, compute: float) -> float:
    """Exposed seconds per step of the DP / ZeRO collectives (over dp x cp)."""
    d, t, z = lay.dp * lay.context_parallel, lay.tp, lay.zero_stage
    fwd_mb, bwd_mb = fb_mb
    if d <= 1:
        return 0.0
    grads, weights = params * ph.grad_bytes, params * 2.0
    stack = (w.framework != "megatron-deepspeed")
    overlap = ph.mc_overlap if stack else ph.dp_overlap * (1.0 if lay.pp == 1 else 0.5)
    if z == 0:
        red = collective_s(ph, w, d, t, grads, "ar")
        return red - min(overlap * red, bwd_mb)
    gather = ph.zero_eff * collective_s(ph, w, d, t, weights, "ag")
    if stack:
        gather -= min(ph.mc_overlap * gather, fwd_mb)
    if z == 1:
        red = ph.zero_eff * collective_s(ph, w, d, t, grads, "rs")
        return red - min(overlap * red, bwd_mb) + gather
    red = m * ph.zero_eff * collective_s(ph, w, d, t, grads, "rs")
    exposed = red - min(overlap * red, m * bwd_mb) + gather
    if z == 3:
        passes = 3 if lay.checkpointing else 2
        layers = w.model.num_layers // lay.pp
        g3 = m * passes * (collective_s(ph, w, d, t, weights, "ag") + layers * ph.lat_inter_us * 1e-6)
        exposed += g3 - min(ph.z3_prefetch * g3, compute)
    return exposed


def pipeline_s(stages: list[float], m: int, v: int) -> float:
    """1F1B: sum of the stages + (m - 1) x the slowest; interleaved over v chunks: the bubble / v."""
    if v == 1:
        return sum(stages) + (m - 1) * max(stages)
    return sum(stages) / v + (m - 1.0 / v) * max(stages)


def step_s(ph: Physics, w: Workload, lay: Layout) -> float:
    """Seconds of one training step (global batch) of `lay`."""
    m = w.global_batch // (lay.micro_batch * lay.dp)
    layer = layer_s(ph, w, lay)
    per_layer = layer["fwd"] + layer["bwd"] + layer["rec"]
    ns = [rank_layers(w, lay, r) for r in range(lay.pp)]
    dispatch = ph.mb_ms * 1e-3 * (1.0 + ph.vp_mb * (lay.virtual_pipeline - 1))
    p2p = p2p_s(ph, w, lay)
    body = [n * per_layer + p2p + dispatch for n in ns]
    first, last = ends_s(ph, w, lay)
    stages = [body[0] + first + last] if lay.pp == 1 else [body[0] + first] + body[1:-1] + [body[-1] + last]
    pipe = pipeline_s(stages, m, lay.virtual_pipeline)
    params = max(stage_params(w, lay, r) for r in {0, min(1, lay.pp - 1), lay.pp - 1})   # middle ranks alike
    n = max(ns)
    dp = zero_s(ph, w, lay, params, m, (n * layer["fwd"], n * layer["bwd"]), pipe)
    sync = 0.0
    if lay.pp > 1 and w.model.tie_embeddings:
        span = lay.tp * lay.context_parallel * lay.dp * (lay.pp - 1)
        sync = collective_s(ph, w, 2, span, 2.0 * w.model.vocab_size * w.model.hidden_size / lay.tp, "ar")
    owned = params / (lay.dp * lay.context_parallel) if lay.zero_stage >= 1 else params
    opt = owned * ph.opt_bytes / _hbm(ph)
    return pipe + dp + sync + opt + ph.step_ms * 1e-3


# ------------------------------------------------------------------------------------------ memory
def layer_activations(ph: Physics, w: Workload, lay: Layout) -> tuple[float, float]:
    """(bytes one layer keeps for the backward pass for one micro-batch, bytes it keeps under full
    recompute): Korthikanti's replicated part (split with SP) and TP-split part (scaled by the
    layer's widths), materialised scores; what selective recompute frees."""
    mo, t, M = w.model, lay.tp, tokens(w, lay)
    h, kv, f = mo.hidden_size, mo.kv_size, mo.ffn_hidden_size
    widths = (2 * h + 2 * kv + (mo.ffn_matrices - 1) * f + f) / (12 * h)    # 1 for a GPT layer
    rep = ph.act_rep / t if lay.sequence_parallel else ph.act_rep
    full = M * h * (rep + ph.act_split * widths / t)
    if w.precision == "fp8":
        full *= ph.fp8_act
    if not ph.flash:
        scores = 5.0 * lay.micro_batch * mo.num_attention_heads / t * (M // lay.micro_batch * mo.seq_length)
        full += scores
        if lay.recompute == "selective":
            full -= scores
    elif lay.recompute == "selective":
        full -= min(ph.sel_save * M * h, 0.5 * full)
    ckpt = 2.0 * M * h / (t if lay.sequence_parallel else 1)
    return full, ckpt


def in_flight(lay: Layout, m: int, rank: int) -> float:
    """Micro-batches whose activations pipeline rank `rank` holds at the peak of 1F1B: p - rank;
    interleaved, Megatron's warm-up of 2 (p - rank - 1) + (v - 1) p chunks, plus one, over v."""
    p, v = lay.pp, lay.virtual_pipeline
    if v == 1:
        return min(p - rank, m)
    return min((2 * (p - rank - 1) + (v - 1) * p + 1) / v, m)


def stage_memory_gb(ph: Physics, w: Workload, lay: Layout, rank: int, allocated: bool = False,
                    reserved: bool = False) -> float:
    """Peak GB per GPU on pipeline rank `rank`: what the GPU needs (context, communicator buffers and the allocator's
    fragmentation included), or with `allocated` the bytes its tensors allocate -- what a GPU run's
    max_memory_allocated, and so every tuner runner, reports as its peak -- or with `reserved` what the caching
    allocator holds at the peak, its fragmentation included (max_memory_reserved, issue 24 round 7)."""
    mo, t, z, cp = w.model, lay.tp, lay.zero_stage, lay.context_parallel
    d, last = lay.dp * cp, rank == lay.pp - 1
    m = w.global_batch // (lay.micro_batch * lay.dp)
    params = stage_params(w, lay, rank)
    states = params * ((2.0 / d if z >= 3 else 2.0) + (ph.grad_bytes / d if z >= 2 else ph.grad_bytes)
                       + (12.0 / d if z >= 1 else 12.0))
    if w.precision == "fp8":
        states += params * ph.fp8_wbytes
    M, h, layers = tokens(w, lay), mo.hidden_size, rank_layers(w, lay, rank)
    full, ckpt = layer_activations(ph, w, lay)
    if lay.checkpointing:
        per_mb, working = layers * ckpt, full
    else:
        per_mb, working = layers * full, 0.0
    if cp > 1:
        working += ph.cp_buf * 2.0 * 2.0 * M * mo.kv_size / t
    send = 2.0 * M * h / (t if lay.sequence_parallel else 1)
    dynamic = in_flight(lay, m, rank) * (per_mb + (send if lay.pp > 1 else 0.0)) + working
    if last:
        dynamic += ph.logit_bytes * M * mo.vocab_size / t
    buffers = ph.bucket_gb * GB if z >= 1 and d > 1 else 0.0
    if z == 3 and d > 1:
        buffers += 2 * 2.0 * (mo.attention_weights + mo.ffn_weights) / t
    if allocated:
        return (states + buffers + dynamic) / GB
    if reserved:
        return (states + buffers + dynamic * ph.frag) / GB
    comms = ph.comm_buf_gb * sum(g > 1 for g in (t, d, lay.pp))
    return (states + buffers + dynamic * ph.frag) / GB + ph.ctx_gb + comms


def peak_memory_gb(ph: Physics, w: Workload, lay: Layout, allocated: bool = False, reserved: bool = False) -> float:
    """The fullest pipeline rank's GB (stage_memory_gb; `allocated`: its tensors' bytes, `reserved`: the caching
    allocator's, the largest over the ranks as the harness reports): the first or the last with equal stages, any
    with the uneven split."""
    even = w.model.num_layers % (lay.pp * lay.virtual_pipeline) == 0
    return max(stage_memory_gb(ph, w, lay, r, allocated, reserved)
               for r in ({0, lay.pp - 1} if even else range(lay.pp)))
