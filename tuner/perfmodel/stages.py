"""Each pipeline stage's seconds per micro-batch, by component (`stage_times`): a dense and an MoE layer's compute
with what their recomputed modules run again, the TP and context-parallel collectives and the pipeline p2p beyond
what the framework's overlaps hide, the MoE token exchange shown phase by phase (tuner.perfmodel.moe_exchange),
the embedding, LM head and multi-token prediction on the end stages; and the slowest stage. Pure; predict
(tuner.perfmodel) adds the bubble, the gradient sync, the optimizer and the step overhead.
"""

from __future__ import annotations

from typing import NamedTuple

from tuner.frameworks import of as framework_of
from tuner.layout import Layout, micro_batches_per_pipeline, stage_candidates, stage_layers, stage_moe_layers
from tuner.perfmodel import comm, compute, memory, moe, moe_exchange, offload, recompute, tp_overlap
from tuner.perfmodel.compute import shape_of
from tuner.specs import Workload

HIDDEN = "hidden_under_compute"     # a stage entry that is not a time: compute an overlap already used
SM_SHARE = "ep_sm_share"            # compute slowed by the flex dispatcher's SMs while it hides the exchange


def layer_comm(layout: Layout, workload: Workload, sh: compute.Shape, attention_s: float) -> dict:
    """Per layer and micro-batch: TP collectives and the exposed context-parallel ring (K and V go
    round forward and in each recompute; K, V and their gradients backward; the ring overlaps the
    attention core it feeds, and only what exceeds it shows)."""
    model, cluster = workload.model, workload.cluster
    act = 2.0 * model.seq_length * sh.tokens * model.hidden_size      # one bf16 activation of this rank
    tp = comm.tp_allreduces_per_layer(sh.recompute) * comm.tp_allreduce_time(cluster, sh.t, act)
    if sh.sp and sh.gathered_inputs:        # DTensor's TP (torchtitan): what its collectives run beyond
        tp += comm.dtensor_tp_extra(cluster, sh.t, sh.b, sh.recompute, sh.op_sac, act)
    kv = 2.0 * 2.0 * model.seq_length * sh.tokens * model.kv_size / sh.t
    passes = 1.0 + (sh.recompute != "none") + 2.0
    ring = passes * comm.cp_ring_time(cluster, sh.t, sh.c, kv)
    shown = max(0.0, ring - attention_s)     # and the attention beside the hidden rest runs on fewer SMs
    return {"tp_comm": tp, "cp_comm": shown + comm.sm_share(cluster, ring - shown, comm.NCCL_P2P_CTAS),
            "activation_bytes": act}


def layer_terms(workload: Workload, sh: compute.Shape,
                exchange: moe_exchange.TokenExchange) -> tuple[dict, dict, float, str]:
    """What one layer costs at a shape, whatever the pipeline: a dense layer's and an MoE layer's times (with what
    their recomputed modules run again), the MoE token exchange's seconds and its dispatcher."""
    model, cluster = workload.model, workload.cluster
    lay = _with_modules(compute.layer_times(model, cluster, sh), model, cluster, sh, False)
    lay_moe = _with_modules(moe.moe_layer_times(model, cluster, sh), model, cluster, sh, True) if model.is_moe else lay
    if not model.is_moe:
        how, a2a = "alltoall", 0.0
    elif exchange.dispatcher:                          # the dispatcher a published run states
        how, a2a = exchange.dispatcher, moe_exchange.alltoall_seconds(model, cluster, sh, exchange.dispatcher)
    else:
        how, a2a = moe_exchange.dispatch(model, cluster, sh, workload.framework)
    return lay, lay_moe, a2a, how


class LayerParts(NamedTuple):
    """What every pipeline stage of a layout shares per layer and micro-batch (`layer_parts`)."""

    lay: dict                 # a dense layer's times (layer_terms)
    lay_moe: dict             # an MoE layer's (the dense one's on a dense model)
    a2a: float                # one MoE layer's token exchange, whole
    how: str                  # its dispatcher
    cp_comm: float            # the exposed context-parallel ring
    tp_comm: float            # TP collectives beyond what --tp-comm-overlap hides
    ar: float                 # one TP all-reduce of an activation (embedding forward, LM head backward)
    p2p: float                # blocking pipeline sends and receives
    hide: frozenset           # the overlaps the prediction credits (overlaps_of)
    ep_hidden: bool           # the EP overlap hides the exchange (phase by phase)
    shared_hidden: bool       # the shared experts hide it (--moe-shared-expert-overlap)
    exposed: float            # what of a paired exchange shows
    m: int                    # micro-batches per pipeline
    overhead: float           # an MoE layer's fixed cost per micro-batch (moe.layer_overhead)
    tp_moe: float             # an MoE layer's TP collectives (attention_tp_only: the attention's alone)


def layer_parts(layout: Layout, workload: Workload, sh: compute.Shape, exchange: moe_exchange.TokenExchange | None,
                memo: dict | None) -> LayerParts:
    """`stage_times`' per-layer pieces: layer_terms and the TP communication (kept by shape in `memo` when no `exchange`
    is stated), the CP and p2p communication beyond what the framework's overlaps hide, and the MoE exchange's
    exposure (kept by shape and overlap in `memo`)."""
    model = workload.model
    keep = memo is not None and exchange is None
    exchange = exchange or moe_exchange.TokenExchange()
    terms = memo.get(("terms", sh)) if keep else None
    if terms is None:
        terms = layer_terms(workload, sh, exchange)
        if keep:
            memo[("terms", sh)] = terms
    lay, lay_moe, a2a, how = terms
    comms = memo.get(("comms", sh)) if keep else None
    if comms is None:
        comms = _layer_comms(layout, workload, sh, exchange, lay)
        if keep:
            memo[("comms", sh)] = comms
    cp_comm, tp_comm, ar, boundary, hide, tp_moe = comms
    ep_hidden = framework_of(workload).ep_overlap(layout, model) and exchange.overlap is not False and "ep" in hide
    p2p = layout.virtual_pipeline * comm.pipeline_p2p_time(workload.cluster, layout.tp * sh.c, layout.dp, layout.pp,
                                                           boundary)
    shared_hidden = not ep_hidden and exchange.shared_overlap and how == "alltoall" and model.num_shared_experts > 0
    exposed = memo.get(("exposed", sh, ep_hidden, shared_hidden)) if keep else None
    if exposed is None:
        exposed = (overlapped_exchange(workload, sh, lay_moe, a2a) if ep_hidden else a2a if not shared_hidden
                   else moe_exchange.shared_overlap_exposed(a2a, *moe.shared_gemm_seconds(model, workload.cluster, sh),
                                                            sh))
        if keep:
            memo[("exposed", sh, ep_hidden, shared_hidden)] = exposed
    m = micro_batches_per_pipeline(layout, workload.global_batch)
    return LayerParts(lay, lay_moe, a2a, how, cp_comm, tp_comm, ar, p2p, hide, ep_hidden, shared_hidden, exposed, m,
                      moe.layer_overhead(exchange.graphed), tp_moe)


def _layer_comms(layout: Layout, workload: Workload, sh: compute.Shape, exchange: moe_exchange.TokenExchange,
                 lay: dict) -> tuple:
    """What of layer_parts reads the shape alone: (the exposed CP ring, the TP collectives beyond what
    --tp-comm-overlap hides, one TP all-reduce of an activation, the p2p boundary tensor's bytes, the overlaps)."""
    cluster, t = workload.cluster, layout.tp
    lc = layer_comm(layout, workload, sh, lay["attention"])
    act = lc["activation_bytes"]
    ar = comm.tp_allreduce_time(cluster, t, act)
    boundary = act / t if sh.sp else act              # sequence parallelism sends the scattered tensor
    hide = overlaps_of(workload, exchange)
    # --tp-comm-overlap (Transformer Engine's userbuffers) runs inside the NVLink domain only: a TP group
    # that spans nodes shows its collectives whole; on ROCm it is off (AMD's Primus: tp_comm_overlap false,
    # primus/configs/models/megatron/language_model.yaml line 180 @ fd1eeabbad15), and `launch` leaves it out.
    # Each collective hides under its own GEMM only (tuner.perfmodel.tp_overlap). That account charges the backward
    # re-gather of the input, which tp_allreduces_per_layer counts as hidden under the data-gradient GEMM: where the
    # GEMMs are short (small models on Blackwell) it could cost more than no overlap at all, so it is capped there.
    tp_hidden = "tp" in hide and sh.sp and not comm.leaves_domain(cluster, t, 1) and cluster.software == "cuda"
    # Where the cluster's GEMM curve does not carry it, the overlap's own cost on those GEMMs (chunks, the SMs its
    # kernels hold: tp_overlap.gemm_cost_seconds) is charged with what shows, under the same cap.
    model = workload.model
    tp_comm = (min(tp_overlap.exposed_seconds(model, cluster, sh) + tp_overlap.gemm_cost_seconds(model, cluster, sh),
                   lc["tp_comm"]) if tp_hidden and t > 1 else lc["tp_comm"])
    tp_moe = tp_comm
    if attention_tp_only(workload):           # an MoE layer's: the attention's collectives alone
        tp_moe = lc["tp_comm"] / 2.0
        if tp_hidden and t > 1:
            tp_moe = min(tp_overlap.exposed_seconds(model, cluster, sh, mlp=False)
                         + tp_overlap.gemm_cost_seconds(model, cluster, sh, mlp=False), tp_moe)
    return lc["cp_comm"], tp_comm, ar, boundary, hide, tp_moe


def attention_tp_only(workload: Workload) -> bool:
    """Whether an MoE layer runs only its attention's TP collectives (half of tp_allreduces_per_layer's: the
    attention's and the MLP's count alike): Megatron-Core's MoE block routes the rank's own sequence-parallel tokens
    (MoELayer refuses TP without sequence parallelism in training) and moves them in its dispatcher, whose only
    tensor-parallel group is the expert-TP one (token_dispatcher.py: tp_group = expt_tp, the gathers at etp > 1 that
    moe_exchange.alltoall_seconds charges), so at any etp the attention-TP group carries none of the block's
    tokens; only shared experts gather and reduce-scatter the activation over it as a dense FFN does
    (shared_experts.py pre_forward_comm / post_forward_comm). NVIDIA/Megatron-LM core_v0.13.0 moe_layer.py,
    token_dispatcher.py, shared_experts.py; the same at d98e8a64dd. torchtitan's MoE TP: as a dense layer (not read)."""
    model = workload.model
    return model.is_moe and not model.shared_expert_width and workload.framework == "megatron-core"


def exchange_shown(layout: Layout, workload: Workload, parts: LayerParts, stage: int) -> tuple[float, float, float]:
    """One MoE layer's exchange on a pipeline rank: the seconds shown (an unpaired pass's whole), hidden, and what
    the flex kernels' SMs slow the compute they hide under."""
    u = (moe_exchange.unpaired_share(layout.pp, layout.virtual_pipeline, stage, parts.m) if parts.ep_hidden
         else float(not parts.shared_hidden))
    shown = u * parts.a2a + (1.0 - u) * parts.exposed
    return shown, parts.a2a - shown, moe_exchange.sm_contention(workload.cluster, parts.how, parts.a2a - shown)


def stage_body(layout: Layout, workload: Workload, sh: compute.Shape, parts: LayerParts, stage: int) -> dict:
    """A pipeline rank's layers per micro-batch, by component (without the embedding, LM head and MTP)."""
    model, cluster, lay, lay_moe = workload.model, workload.cluster, parts.lay, parts.lay_moe
    layers = stage_layers(layout, model.num_layers, stage)
    n_moe = stage_moe_layers(layout, model, stage)
    out = {k: (layers - n_moe) * lay[k] + n_moe * lay_moe[k] for k in ("gemm", "attention", "elementwise")}
    shown = (max(0.0, parts.p2p - out["gemm"] - out["attention"])
             if "p2p" in parts.hide and layout.virtual_pipeline > 1 else parts.p2p)
    # the fixed cost per micro-batch is per model chunk: the interleaved schedule runs num_microbatches x
    # num_model_chunks forward and backward steps, each its own dispatch and p2p (Megatron-LM d98e8a64dd
    # megatron/core/pipeline_parallel/schedules.py line 949, forward_step_helper line 1385; issue 30 round 39)
    out.update({"tp_comm": (layers - n_moe) * parts.tp_comm + n_moe * parts.tp_moe, "p2p": shown,
                "microbatch_overhead": layout.virtual_pipeline * cluster.microbatch_overhead_ms * 1e-3})
    if parts.p2p > shown:
        # compute already spent hiding the p2p: not there for the gradient sync too. With --overlap-p2p-comm the
        # interleaved schedule posts its sends / receives as NCCL isend / irecv it waits on later (p2p_communication.py
        # _communicate(wait_on_reqs=False)), and --overlap-grad-reduce launches each bucket's collective async in the
        # last backward (param_and_grad_buffer.py start_grad_sync): both are network transfers under the same compute
        # (across nodes, the same NIC); counted twice, selective recompute's attention hid more of the sync and ran
        # faster than none (benchmarks/invariants.py, B200 FP8 tp8 pp4 vp8)
        out[HIDDEN] = parts.p2p - shown
    if sh.c > 1:
        out["cp_comm"] = layers * parts.cp_comm
    if model.is_moe:      # the MoE token dispatch and combine; each under its phase's compute where overlapped
        shown, hidden, slowed = exchange_shown(layout, workload, parts, stage)
        out["all_to_all"] = n_moe * shown
        out["moe_overhead"] = n_moe * parts.overhead
        out[HIDDEN] = out.get(HIDDEN, 0.0) + n_moe * hidden     # compute already spent hiding the exchange
        if slowed:                        # compute time, so other collectives may hide under it too
            out[SM_SHARE] = n_moe * slowed
    return out


def stage_times(layout: Layout, workload: Workload, sh: compute.Shape | None = None,
                exchange: moe_exchange.TokenExchange | None = None, memo: dict | None = None) -> list[dict]:
    """Seconds per micro-batch of each distinct pipeline stage, each a breakdown by component: [first,
    ..., last], one stage with pp = 1; between them the first rank of each other layer count
    (tuner.layout.stage_candidates: the middle stages of an uneven split). `memo` (with no `exchange`): what reads
    the shape alone (layer_terms, the TP collectives, the embedding and LM head) kept by shape for one workload's
    layouts."""
    model, cluster = workload.model, workload.cluster
    t, p, sh = layout.tp, layout.pp, sh or shape_of(layout, workload)
    parts = layer_parts(layout, workload, sh, exchange, memo)
    ar, lay, lay_moe = parts.ar, parts.lay, parts.lay_moe
    first, last = stage_body(layout, workload, sh, parts, 0), stage_body(layout, workload, sh, parts, p - 1)
    ends = memo.get(("ends", sh)) if memo is not None and exchange is None else None
    if ends is None:                          # the embedding's and the LM head's times, read only here
        ends = compute.embedding_times(model, cluster, sh.tokens), compute.lm_head_times(model, cluster, sh.tokens, t)
        if memo is not None and exchange is None:
            memo[("ends", sh)] = ends
    emb, head = ends
    first["elementwise"] += emb["elementwise"]
    first["tp_comm"] += ar                    # the vocabulary-parallel embedding's forward all-reduce
    last["gemm"] += head["gemm"]
    last["elementwise"] += head["elementwise"]
    last["tp_comm"] += ar                     # the LM head's input-gradient all-reduce
    if model.mtp_num_layers:
        _add_mtp(last, workload, sh, lay_moe if model.is_moe else lay, {
            "head": head, "emb": emb, "tp": (parts.tp_moe if model.is_moe else parts.tp_comm) + ar,
            "exchange": exchange_shown(layout, workload, parts, p - 1), "overhead": parts.overhead})
    if p == 1:
        last["elementwise"] += emb["elementwise"]
        last["tp_comm"] += ar
        if layout.offload_layers:
            last["cpu_offload"] = offload_seconds(layout, workload, sh, parts)
        return [last]
    return [first, *(stage_body(layout, workload, sh, parts, s) for s in stage_candidates(layout, model)[1:-1]), last]


def offload_seconds(layout: Layout, workload: Workload, sh: compute.Shape, parts: LayerParts,
                    nic_s: tuple[float, float] = (0.0, 0.0), kernels_s: float = 0.0) -> float:
    """Megatron-Core's CPU activation offloading (pp 1) per micro-batch: what the copies of the first offload_layers
    layers' activations to the host and back take beyond the layers' compute they run under (offload.exposed_seconds,
    TransformerEngine's schedule), at what one GPU gets while every GPU of the node copies the same way (the forward's
    copies ClusterSpec.host_d2h, the backward's reloads host_h2d: measured where the cluster file says). A layer's bytes
    (memory.layer_activation_bytes, what memory frees) and its compute and TP collectives are the mean of the model's
    layers; its forward's share 1 / (1 + 2 x backward_gemm), as overlapped_exchange splits one. `nic_s`: the seconds
    per micro-batch the GPU's NIC moves data-parallel traffic over the same PCIe link under the forward and under the
    backward (predict asks it where the cluster's nic_shares_host_link holds), busy that share of each phase -- its
    kernels' `kernels_s` (split as a layer's) and the waits for the copies (offload.busy_share) -- during which the
    copies get what the NIC leaves of the link: offload.shared_rates. No fitted constant."""
    model, cluster = workload.model, workload.cluster
    n, n_moe = model.num_layers, model.num_moe_layers
    layer_bytes = memory.mean_layer_activation_bytes(model, sh, cluster.flash_attention)
    busy = lambda lay, tp: lay["gemm"] + lay["attention"] + lay["elementwise"] + tp    # noqa: E731
    layer_s = ((n - n_moe) * busy(parts.lay, parts.tp_comm) + n_moe * busy(parts.lay_moe, parts.tp_moe)) / n
    fwd = 1.0 / (1.0 + 2.0 * sh.backward_gemm)
    nic = cluster.nic_bandwidth * cluster.network_efficiency

    def waits(forward_busy: float, backward_busy: float) -> tuple[float, float]:
        d2h, h2d = offload.shared_rates(cluster.host_d2h, cluster.host_h2d, cluster.host_link, nic, forward_busy,
                                        backward_busy)
        return offload.exposed_parts(n, layout.offload_layers, layer_bytes / (d2h * 1e9), layer_bytes / (h2d * 1e9),
                                     fwd * layer_s, (1.0 - fwd) * layer_s)
    shares = (offload.busy_share(nic_s[0], fwd * kernels_s, lambda s: waits(s, 0.0)[0]),
              offload.busy_share(nic_s[1], (1.0 - fwd) * kernels_s, lambda s: waits(0.0, s)[1]))
    return sum(waits(*shares))


def _add_mtp(last: dict, workload: Workload, sh: compute.Shape, layer: dict, per: dict) -> None:
    """The last stage's multi-token prediction (ModelSpec.mtp_num_layers; Megatron-Core's MultiTokenPredictionLayer,
    transformer/multi_token_prediction.py at d98e8a64ddf3, built on the last stage, which then holds an embedding
    too: gpt_model.py line 173): per module and micro-batch the embedding lookup of the shifted tokens, two norms,
    eh_proj (a column-parallel h x 2h linear), one more layer of the last layer's kind (its MoE exchange as the
    stage's layers show theirs) and the LM head and loss again; `per`: the stage's head, embedding, one layer's TP
    collectives and MoE exchange (seconds shown, hidden)."""
    model, n = workload.model, workload.model.mtp_num_layers
    eh = compute.gemm_time(workload.cluster, 4.0 * model.seq_length * sh.tokens * model.hidden_size ** 2 / sh.t, sh.fp8)
    last["gemm"] += n * (layer["gemm"] + per["head"]["gemm"] + eh * (1.0 + 2.0 * sh.backward_gemm))
    last["attention"] += n * layer["attention"]
    last["elementwise"] += n * (layer["elementwise"] + per["head"]["elementwise"] + per["emb"]["elementwise"])
    last["tp_comm"] += n * per["tp"]
    if model.is_moe:
        shown, hidden, slowed = per["exchange"]
        last["all_to_all"] += n * shown
        last["moe_overhead"] += n * per["overhead"]
        last[HIDDEN] += n * hidden
        if slowed:
            last[SM_SHARE] = last.get(SM_SHARE, 0.0) + n * slowed


def overlapped_exchange(workload: Workload, sh: compute.Shape, lay_moe: dict, a2a: float) -> float:
    """One MoE layer's exchange left exposed by the EP overlap (moe_exchange.exposed_alltoall): its compute split into
    the pre-dispatch part (attention core, and of the GEMMs and element-wise kernels the share of the attention's and
    router's GEMMs) and the MLP part, forward : backward as the GEMMs' 1 : 2 x backward_gemm."""
    model, cluster = workload.model, workload.cluster
    share = moe.pre_dispatch_gemm_seconds(model, cluster, sh) / moe.moe_gemm_seconds(model, cluster, sh)
    rest = lay_moe["gemm"] + lay_moe["elementwise"]
    return moe_exchange.exposed_alltoall(a2a, lay_moe["attention"] + share * rest, (1.0 - share) * rest,
                                         1.0 / (1.0 + 2.0 * sh.backward_gemm))


def overlaps_of(workload: Workload, exchange: moe_exchange.TokenExchange | None) -> frozenset:
    """The overlaps a prediction credits: the run's where `exchange` states them, else the framework's."""
    return framework_of(workload).overlaps if exchange is None or exchange.overlaps is None else exchange.overlaps


def _with_modules(times: dict, model, cluster, sh: compute.Shape, moe_layer: bool) -> dict:
    """A layer's times plus what its recomputed modules run again (tuner.perfmodel.recompute)."""
    extra = recompute.extra_seconds(model, cluster, sh, moe_layer)
    if not extra["gemm"] and not extra["elementwise"]:
        return times
    return {**times, "gemm": times["gemm"] + extra["gemm"], "elementwise": times["elementwise"] + extra["elementwise"]}


def stage_total(st: dict) -> float:
    """A stage's seconds per micro-batch (its entries but HIDDEN)."""
    return sum(v for k, v in st.items() if k != HIDDEN)


def free_compute(st: dict) -> float:
    """A stage's compute per micro-batch that no overlap has used yet (the gradient sync may hide under it)."""
    return max(0.0, st["gemm"] + st["attention"] + st["elementwise"] + st.get(SM_SHARE, 0.0) - st.get(HIDDEN, 0.0))


def stage_floor(layout: Layout, workload: Workload, sh: compute.Shape, memo: dict) -> float:
    """A lower bound of slowest_stage's seconds (with no `exchange`) from the per-layer pieces alone: on each candidate
    stage, its layers' compute and TP collectives and its MoE layers' fixed overhead and token exchange at the less of
    whole and exposed (exchange_shown shows u x whole + (1 - u) x exposed, 0 <= u <= 1); every other entry of
    stage_body and stage_times' additions (p2p, CP ring, SM share, the embedding, LM head and MTP) is >= 0. For plan's
    --top bound (tuner.perfmodel.screening.reachable), where it is checked as a bound on every layout
    (tests/test_plan_speed.py). `memo`: the per-layer pieces by shape and EP overlap, the layers by pipeline cut."""
    model = workload.model
    key = ("floor_pieces", sh, framework_of(workload).ep_overlap(layout, model))   # all layer_parts' pieces read
    pieces = memo.get(key)
    if pieces is None:
        parts = layer_parts(layout, workload, sh, None, memo)
        pieces = memo[key] = (
            parts.lay["gemm"] + parts.lay["attention"] + parts.lay["elementwise"] + parts.tp_comm,
            parts.lay_moe["gemm"] + parts.lay_moe["attention"] + parts.lay_moe["elementwise"] + parts.tp_moe
            + min(parts.a2a, parts.exposed) + parts.overhead)
    key = ("floor_layers", layout.pp, layout.virtual_pipeline, layout.pipeline_split)
    layers = memo.get(key)
    if layers is None:
        layers = memo[key] = [(stage_layers(layout, model.num_layers, s) - stage_moe_layers(layout, model, s),
                               stage_moe_layers(layout, model, s)) for s in stage_candidates(layout, model)]
    dense, routed = pieces
    return max(n_dense * dense + n_moe * routed for n_dense, n_moe in layers)


def slowest_stage(layout: Layout, workload: Workload, sh: compute.Shape,
                  exchange: moe_exchange.TokenExchange | None = None, memo: dict | None = None) -> tuple[dict, float, list]:
    """The slowest stage's breakdown per micro-batch, its seconds, and every distinct stage's breakdown; one
    computation for the layouts of a workload that differ only in ZeRO stage (stage_times does not read it)
    when `memo` is given."""
    key = None
    if memo is not None and exchange is None:
        key = ("slow", layout.tp, layout.sequence_parallel, layout.context_parallel, layout.pp, layout.virtual_pipeline,
               layout.pipeline_split, layout.dp, layout.expert_parallel, layout.expert_tensor_parallel,
               layout.micro_batch, layout.recompute, layout.offload_layers)
        got = memo.get(key)
        if got is not None:
            return got
    stages = stage_times(layout, workload, sh, exchange, memo)
    totals = [stage_total(st) for st in stages]
    slowest = max(totals)
    got = (stages[totals.index(slowest)], slowest, stages)          # max()'s choice: the first of the largest
    if key is not None:
        memo[key] = got
    return got
