"""The analytic performance and memory model: predict(layout, workload) -> Prediction.

Pure and fast (no I/O, no numpy): `tuner plan` ranks every valid layout with it. Memory comes from
memory.py, per-micro-batch compute from compute.py, communication from comm.py; every hardware
constant comes from the workload's ClusterSpec, so the same code predicts any cluster file.

Step time of one iteration, the 1F1B pipeline (interleaved over v virtual stages per rank):

    step = (m + (p - 1) / v) * t_stage(slowest) + t_dp + t_embedding_sync + t_optimizer + t_step_overhead

t_stage = compute (GEMMs, attention, element-wise) + TP all-reduces (reduce-scatter + all-gather with
sequence parallelism) + the context-parallel K/V ring beyond the attention it overlaps + blocking p2p
(v times per micro-batch when interleaved) + a fixed per-micro-batch overhead, and for mixture-of-experts
layers the token all-to-all (`all_to_all`, hidden under compute where Megatron-Core overlaps it) and a
fixed per-layer `moe_overhead` (tuner.perfmodel.moe); the slowest stage is the first or last (embedding /
LM head and loss; dense layers first, as DeepSeek-V3's, only make the first stage lighter).

The workload's framework (tuner.frameworks) says what is overlapped. Megatron-Core's overlaps
(--tp-comm-overlap with sequence parallelism, --overlap-p2p-comm with interleaving, --overlap-grad-reduce,
--overlap-param-gather): each of those collectives shows only where it outlasts the compute it runs under
-- a layer's GEMMs, a stage's compute, the last micro-batch's backward and the first one's forward.
Megatron-DeepSpeed overlaps nothing: DP/ZeRO collectives run after gradient accumulation. torchtitan's
FSDP2 gathers and reduce-scatters layer by layer under the neighbouring layer's compute (`fsdp_time`).
t_step_overhead is the cluster's fixed cost per iteration (step_overhead_ms; 0 unless measured, as
`tuner calibrate` does from real runs of the harness).
"""

from __future__ import annotations

from tuner.layout import (RECOMPUTE, Layout, expert_data_parallel, micro_batches_per_pipeline, stage_candidates,
                          stage_layers, stage_moe_layers)
from tuner.pipeline_split import bubble_share
from tuner.frameworks import megatron_fsdp, of as framework_of
from tuner.perfmodel import buckets, comm, compute, memory, moe, moe_exchange, recompute
from tuner.perfmodel.compute import shape_of
from tuner.perfmodel.fit import (MEMORY_KEYS, MEMORY_NOISE_SD, MEMORY_PRIOR_SPLIT, PRUNE_BELOW, RECOMMEND_AT,
                                 account_sd, expected_speed, fit_probability, gpu_fit_probability, keeps_headroom,
                                 memory_gp_scales, memory_prior_sd, memory_shares, risk, with_measured_bias)
from tuner.perfmodel.flops import megatron_flops, model_flops
from tuner.perfmodel.prediction import Prediction
from tuner.specs import Workload

__all__ = ["SM_SHARE", "predict", "rank", "expected_speed", "risk", "keeps_headroom", "fit_probability", "memory_prior_sd",
           "account_sd", "gpu_fit_probability", "breakdown_fit",
           "memory_gp_scales", "memory_shares", "Prediction", "stage_times", "shape_of", "PRUNE_BELOW", "RECOMMEND_AT",
           "MEMORY_KEYS", "MEMORY_NOISE_SD", "MEMORY_PRIOR_SPLIT", "with_measured_bias"]

def layer_comm(layout: Layout, workload: Workload, sh: compute.Shape, attention_s: float) -> dict:
    """Per layer and micro-batch: TP collectives and the exposed context-parallel ring (K and V go
    round forward and in each recompute; K, V and their gradients backward; the ring overlaps the
    attention core it feeds, and only what exceeds it shows)."""
    model, cluster = workload.model, workload.cluster
    act = 2.0 * model.seq_length * sh.tokens * model.hidden_size      # one bf16 activation of this rank
    tp = comm.tp_allreduces_per_layer(sh.recompute) * comm.tp_allreduce_time(cluster, sh.t, act)
    kv = 2.0 * 2.0 * model.seq_length * sh.tokens * model.kv_size / sh.t
    passes = 1.0 + (sh.recompute != "none") + 2.0
    ring = passes * comm.cp_ring_time(cluster, sh.t, sh.c, kv)
    return {"tp_comm": tp, "cp_comm": max(0.0, ring - attention_s), "activation_bytes": act}


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


def stage_times(layout: Layout, workload: Workload, sh: compute.Shape | None = None,
                exchange: moe_exchange.TokenExchange | None = None, memo: dict | None = None) -> list[dict]:
    """Seconds per micro-batch of each distinct pipeline stage, each a breakdown by component: [first,
    ..., last], one stage with pp = 1; between them the first rank of each other layer count
    (tuner.layout.stage_candidates: the middle stages of an uneven split). `memo` (with no `exchange`): layer_terms
    kept by shape for one workload's layouts."""
    model, cluster = workload.model, workload.cluster
    t, p, sh = layout.tp, layout.pp, sh or shape_of(layout, workload)
    key = ("terms", sh) if memo is not None and exchange is None else None
    terms = memo.get(key) if key else None
    exchange = exchange or moe_exchange.TokenExchange()
    if terms is None:
        terms = layer_terms(workload, sh, exchange)
        if key:
            memo[key] = terms
    lay, lay_moe, a2a, how = terms
    lc = layer_comm(layout, workload, sh, lay["attention"])
    act = lc["activation_bytes"]
    ar = comm.tp_allreduce_time(cluster, t, act)
    boundary = act / t if sh.sp else act              # sequence parallelism sends the scattered tensor
    hide = overlaps_of(workload, exchange)
    ep_hidden = framework_of(workload).ep_overlap(layout, model) and exchange.overlap is not False and "ep" in hide
    # --tp-comm-overlap (Transformer Engine's userbuffers) runs inside the NVLink domain only: a TP group
    # that spans nodes shows its collectives whole; on ROCm it is off (AMD's Primus: tp_comm_overlap false,
    # primus/configs/models/megatron/language_model.yaml line 180 @ fd1eeabbad15), and `launch` leaves it out
    tp_hidden = "tp" in hide and sh.sp and not comm.leaves_domain(cluster, t, 1) and cluster.software == "cuda"
    tp_comm = max(0.0, lc["tp_comm"] - lay["gemm"]) if tp_hidden else lc["tp_comm"]
    p2p = layout.virtual_pipeline * comm.pipeline_p2p_time(cluster, t * sh.c, layout.dp, p, boundary)
    shared_hidden = not ep_hidden and exchange.shared_overlap and how == "alltoall" and model.num_shared_experts > 0
    exposed = (overlapped_exchange(workload, sh, lay_moe, a2a) if ep_hidden else a2a if not shared_hidden
               else moe_exchange.shared_overlap_exposed(a2a, *moe.shared_gemm_seconds(model, cluster, sh), sh))
    m = micro_batches_per_pipeline(layout, workload.global_batch)

    def exchange_shown(stage: int) -> tuple[float, float, float]:   # one MoE layer's exchange: seconds shown,
        u = (moe_exchange.unpaired_share(p, layout.virtual_pipeline, stage, m) if ep_hidden   # hidden (unpaired passes
             else float(not shared_hidden))
        shown = u * a2a + (1.0 - u) * exposed            # whole) and what the flex kernels' SMs slow the compute
        return shown, a2a - shown, moe_exchange.sm_contention(cluster, how, a2a - shown)         # they hide under

    def body(stage: int) -> dict:
        layers = stage_layers(layout, model.num_layers, stage)
        n_moe = stage_moe_layers(layout, model, stage)
        out = {k: (layers - n_moe) * lay[k] + n_moe * lay_moe[k] for k in ("gemm", "attention", "elementwise")}
        shown = (max(0.0, p2p - out["gemm"] - out["attention"])
                 if "p2p" in hide and layout.virtual_pipeline > 1 else p2p)
        out.update({"tp_comm": layers * tp_comm, "p2p": shown,
                    "microbatch_overhead": cluster.microbatch_overhead_ms * 1e-3})
        if sh.c > 1:
            out["cp_comm"] = layers * lc["cp_comm"]
        if model.is_moe:      # the MoE token dispatch and combine; each under its phase's compute where overlapped
            shown, hidden, slowed = exchange_shown(stage)
            out["all_to_all"] = n_moe * shown
            out["moe_overhead"] = n_moe * moe.MOE_LAYER_OVERHEAD_MS * 1e-3
            out[HIDDEN] = n_moe * hidden     # compute already spent hiding the exchange
            if slowed:                        # compute time, so other collectives may hide under it too
                out[SM_SHARE] = n_moe * slowed
        return out

    first, last = body(0), body(p - 1)
    emb = compute.embedding_times(model, cluster, sh.tokens)
    head = compute.lm_head_times(model, cluster, sh.tokens, t)
    first["elementwise"] += emb["elementwise"]
    first["tp_comm"] += ar                    # the vocabulary-parallel embedding's forward all-reduce
    last["gemm"] += head["gemm"]
    last["elementwise"] += head["elementwise"]
    last["tp_comm"] += ar                     # the LM head's input-gradient all-reduce
    if model.mtp_num_layers:
        _add_mtp(last, workload, sh, lay_moe if model.is_moe else lay, {"head": head, "emb": emb, "tp": tp_comm + ar,
                                                                        "exchange": exchange_shown(p - 1)})
    if p == 1:
        last["elementwise"] += emb["elementwise"]
        last["tp_comm"] += ar
        return [last]
    return [first, *(body(s) for s in stage_candidates(layout, model)[1:-1]), last]


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
        last["moe_overhead"] += n * moe.MOE_LAYER_OVERHEAD_MS * 1e-3
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


HIDDEN = "hidden_under_compute"     # a stage entry that is not a time: compute an overlap already used
SM_SHARE = "ep_sm_share"            # compute slowed by the flex dispatcher's SMs while it hides the exchange


def _with_modules(times: dict, model, cluster, sh: compute.Shape, moe_layer: bool) -> dict:
    """A layer's times plus what its recomputed modules run again (tuner.perfmodel.recompute)."""
    extra = recompute.extra_seconds(model, cluster, sh, moe_layer)
    if not extra["gemm"] and not extra["elementwise"]:
        return times
    return {**times, "gemm": times["gemm"] + extra["gemm"], "elementwise": times["elementwise"] + extra["elementwise"]}


def stage_total(st: dict) -> float:
    """A stage's seconds per micro-batch (its entries but HIDDEN)."""
    return sum(v for k, v in st.items() if k != HIDDEN)


def fsdp_time(layout: Layout, workload: Workload, compute_mb: float, m: int, grad_bytes: float = 4.0,
              gathers: bool = True) -> dict:
    """FSDP's exposed collectives per iteration over the d*c ranks that shard the weights (FSDP2's, and
    Megatron-FSDP's with its gradient dtype `grad_bytes`; `gathers` False: its optim_grads, parameters kept
    whole, only the gradients reduce-scattered layer by layer): each layer's
    bf16 parameters are all-gathered before its forward and (resharded after it without pipelining)
    again before its backward, and its gradients reduce-scattered in fp32 after it, each under the
    neighbouring layer's compute (implicit prefetch); a layer's collectives show only where they outlast
    that compute, and the first gather and the last reduce-scatter of a pass show whole. Without
    pipelining that happens every micro-batch (gradients are synchronised at each accumulation step);
    with pipelining once per step (parameters stay gathered, gradients accumulate unsharded)."""
    model, cluster = workload.model, workload.cluster
    shards = layout.dp * layout.context_parallel
    if shards <= 1:
        return {"grad_reduce": 0.0, "param_gather": 0.0}
    bw = comm.group_bandwidth(cluster, shards, layout.tp)
    layers = stage_layers(layout, model.num_layers, 0) or 1
    unit = memory.max_layer_params(model, layout)
    experts = 0.0
    if model.is_moe:    # the routed experts gather over their own (expert-dp) group, ep*etp apart
        experts = moe.moe_layer_params(model, layout.tp, layout.expert_parallel, layout.expert_tensor_parallel)[1]
    dense = unit - experts
    edp, stride = expert_data_parallel(layout), layout.expert_parallel * layout.expert_tensor_parallel
    ebw = comm.group_bandwidth(cluster, edp, stride)
    ag = comm.allgather_time(2.0 * dense, shards, bw, cluster) + comm.allgather_time(2.0 * experts, edp, ebw, cluster)
    g = grad_bytes
    rs = (comm.reduce_scatter_time(g * dense, shards, bw, cluster)
          + comm.reduce_scatter_time(g * experts, edp, ebw, cluster))
    edge = max(dense, memory.embedding_params(model, layout.tp))
    first, last = (comm.allgather_time(2.0 * edge, shards, bw, cluster),
                   comm.reduce_scatter_time(g * edge, shards, bw, cluster))
    if not gathers:
        ag = first = 0.0
    fwd, bwd = compute_mb / layers / 3.0, 2.0 * compute_mb / layers / 3.0
    if layout.pp == 1:
        return {"grad_reduce": m * (last + layers * max(0.0, ag + rs - bwd)),
                "param_gather": m * (first + layers * max(0.0, ag - fwd))}
    return {"grad_reduce": last + layers * max(0.0, rs - bwd), "param_gather": first + layers * max(0.0, ag - fwd)}


def gradient_sync_time(layout: Layout, workload: Workload, fw, slow: dict, m: int, params_gpu: float,
                       experts_gpu: float, hide: frozenset | None = None) -> dict:
    """The data-parallel gradient reduce and parameter gather of one step beyond what hides under compute:
    FSDP2's layer by layer, else DP/ZeRO's over the dense replicas plus the expert gradients' over the
    expert-dp group (ep*etp ranks apart); Megatron-Core overlaps them with the last backward / first forward.
    `slow`: the stage whose compute they hide under (predict: the one with the least free compute)."""
    cluster, t = workload.cluster, layout.tp
    # compute that hides one collective cannot hide another: what the MoE exchange already hides under is
    # not there for the gradient sync (else recomputing more would hide more, and be faster)
    compute_mb = free_compute(slow)
    if fw.fsdp:
        return fsdp_time(layout, workload, compute_mb, m)
    if megatron_fsdp(layout, workload):     # Megatron-FSDP: layer by layer, in the gradients' own dtype
        out = fsdp_time(layout, workload, compute_mb, m, fw.grad_bytes(workload), gathers=layout.zero_stage >= 3)
        if layout.zero_stage == 2:          # optim_grads: the updated parameters gathered once, under the first forward
            gather = comm.dp_time(cluster, t, layout.dp * layout.context_parallel, 1, params_gpu - experts_gpu, m,
                                  layout.checkpointing)["param_gather"]
            out["param_gather"] += max(0.0, gather - compute_mb / 3)
        return out
    gb = fw.grad_bytes(workload) if fw.name == "megatron-core" else None     # its buffers' dtype (comm.dp_time)
    dp = comm.dp_time(cluster, t, layout.dp * layout.context_parallel, layout.zero_stage, params_gpu - experts_gpu,
                      m, layout.checkpointing, gb)
    if experts_gpu:
        de = comm.dp_time(cluster, layout.expert_parallel * layout.expert_tensor_parallel,
                          expert_data_parallel(layout), layout.zero_stage, experts_gpu, m, layout.checkpointing, gb)
        dp = {k: dp[k] + de[k] for k in dp}
    if "dp" in (fw.overlaps if hide is None else hide) and layout.zero_stage <= 1:
        # the embedding's bucket reduces after the last backward and gathers before the first forward (buckets.py)
        last = min(buckets.last_bucket_params(workload.model, layout), params_gpu - experts_gpu)
        tail = comm.dp_time(cluster, t, layout.dp * layout.context_parallel, layout.zero_stage, last, m,
                            layout.checkpointing, gb)
        dp = {"grad_reduce": max(tail["grad_reduce"], dp["grad_reduce"] - compute_mb * 2 / 3),
              "param_gather": max(tail["param_gather"], dp["param_gather"] - compute_mb / 3)}
    return dp


def memory_fit(layout: Layout, workload: Workload, memo: dict | None = None) -> tuple:
    """The memory half of `predict`: (micro-batches per pipeline, the Shape, the worst stage, its breakdown
    with the framework's measured bias, p_fit). `memo`: sub-results shared by the layouts of one workload."""
    m = micro_batches_per_pipeline(layout, workload.global_batch)
    sh = shape_of(layout, workload) if memo is None else _memo_shape(layout, workload, memo)
    worst_stage, mem = memory.peak_memory(layout, workload, m, sh, memo)
    return (m, sh, worst_stage, *breakdown_fit(mem, workload))


def breakdown_fit(mem: dict, workload: Workload) -> tuple[dict, float]:
    """A stage's memory breakdown (memory.peak_memory's) as every command states it: with the framework's measured
    bias, and its p_fit on the workload's GPU (benchmarks/reading.py states a published run's memory as it ran, with
    what its recipe changed, through this one function)."""
    fw = framework_of(workload)
    mem = with_measured_bias(mem, fw.memory_bias)
    return mem, gpu_fit_probability(mem["total"], workload.cluster.memory_gb,
                                    account_sd(fw.memory_sd, memory_shares(mem)))


def _memo_shape(layout: Layout, workload: Workload, memo: dict) -> compute.Shape:
    key = ("shape", layout.micro_batch, layout.tp, layout.context_parallel, layout.sequence_parallel, layout.recompute,
           layout.expert_parallel, layout.expert_tensor_parallel)
    sh = memo.get(key)
    if sh is None:
        sh = memo[key] = shape_of(layout, workload)
    return sh


def free_compute(st: dict) -> float:
    """A stage's compute per micro-batch that no overlap has used yet (the gradient sync may hide under it)."""
    return max(0.0, st["gemm"] + st["attention"] + st["elementwise"] + st.get(SM_SHARE, 0.0) - st.get(HIDDEN, 0.0))


def slowest_stage(layout: Layout, workload: Workload, sh: compute.Shape,
                  exchange: moe_exchange.TokenExchange | None = None, memo: dict | None = None) -> tuple[dict, float, list]:
    """The slowest stage's breakdown per micro-batch, its seconds, and every distinct stage's breakdown; one
    computation for the layouts of a workload that differ only in ZeRO stage (stage_times does not read it)
    when `memo` is given."""
    key = None
    if memo is not None and exchange is None:
        key = ("slow", layout.tp, layout.sequence_parallel, layout.context_parallel, layout.pp, layout.virtual_pipeline,
               layout.pipeline_split, layout.dp, layout.expert_parallel, layout.expert_tensor_parallel,
               layout.micro_batch, layout.recompute)
        got = memo.get(key)
        if got is not None:
            return got
    stages = stage_times(layout, workload, sh, exchange, memo)
    slow = max(stages, key=stage_total)
    got = (slow, stage_total(slow), stages)
    if key is not None:
        memo[key] = got
    return got


def last_to_finish(layout: Layout, workload: Workload, fw, stages: list, m: int, params_gpu: float,
                   experts_gpu: float, hide: frozenset) -> tuple[dict, dict]:
    """The stage the step waits for and its gradient sync: the latest of m * stage time + the sync exposed
    beyond that stage's own free compute (not the slowest stage's: recomputing more could then be faster)."""
    best = None
    for st in stages:
        dp = gradient_sync_time(layout, workload, fw, st, m, params_gpu, experts_gpu, hide)
        end = m * stage_total(st) + dp["grad_reduce"] + dp["param_gather"]
        if best is None or end > best[0]:
            best = (end, st, dp)
    return best[1], best[2]


def predict(layout: Layout, workload: Workload, exchange: moe_exchange.TokenExchange | None = None,
            memo: dict | None = None, fitted: tuple | None = None) -> Prediction:
    """Predicted throughput, step time and per-GPU peak memory of a valid `layout` on `workload`; an MoE
    model's tokens moved as `exchange` says (default: as `tuner launch` writes the layout). `memo` (a dict
    kept for one workload's layouts, as `rank` does) shares the sub-results layouts have in common; `fitted`:
    memory_fit's answer for this layout, where it was already asked."""
    model, cluster = workload.model, workload.cluster
    t, p, d = layout.tp, layout.pp, layout.dp
    shards = d * layout.context_parallel         # the ranks that hold the same weights

    # ---- memory
    m, sh, worst_stage, mem, p_fit = fitted or memory_fit(layout, workload, memo)
    fw = framework_of(workload)
    fits = p_fit >= PRUNE_BELOW
    reason = memory.fit_reason(mem, cluster.memory_gb, worst_stage) if mem["total"] > cluster.memory_gb else ""

    # ---- time
    _, t_stage, stages = slowest_stage(layout, workload, sh, exchange, memo)
    params_gpu, experts_gpu = max((memory.stage_params(model, layout, s), memory.stage_expert_params(model, layout, s))
                                  for s in stage_candidates(layout, model))
    edp = expert_data_parallel(layout)
    slow, dp = last_to_finish(layout, workload, fw, stages, m, params_gpu, experts_gpu, overlaps_of(workload, exchange))
    tied = memory.tied_embedding_params(model, t, p)     # none when the LM head is untied
    sync = comm.embedding_sync_time(cluster, t * layout.context_parallel, d, p, tied) if tied else 0.0
    owned = (params_gpu - experts_gpu) / shards + experts_gpu / edp if layout.zero_stage >= 1 else params_gpu
    t_opt = compute.optimizer_time(cluster, owned)

    time = {k: m * v for k, v in slow.items() if k != HIDDEN}
    time["bubble"] = (p - 1) * bubble_share(layout, model.num_layers) * t_stage
    time["dp_grad_reduce"] = dp["grad_reduce"]
    time["dp_param_gather"] = dp["param_gather"]
    time["embedding_sync"] = sync
    time["optimizer"] = t_opt
    if cluster.step_overhead_ms:
        time["step_overhead"] = cluster.step_overhead_ms * 1e-3
    step = sum(time.values())

    gpus = workload.gpus
    tflops = megatron_flops(model, workload.global_batch, layout.recompute) / (step * gpus * 1e12)
    mfu = model_flops(model, workload.global_batch) / (step * gpus * cluster.peak_tflops * 1e12)
    mem_out = {k: v for k, v in mem.items() if k not in ("total", "params_billion")}
    return Prediction(
        layout=layout,
        tflops_per_gpu=tflops,
        peak_fraction=tflops / cluster.peak_tflops,
        mfu=mfu,
        step_time_s=step,
        samples_per_second=workload.global_batch / step,
        memory_gb=mem["total"],
        fits=fits,
        memory_breakdown=mem_out,
        time_breakdown=time,
        reason=reason,
        memory_stage=worst_stage,
        p_fit=p_fit,
    )


def rank(layouts, workload: Workload) -> list[Prediction]:
    """Predictions for `layouts`, best first: those the model cannot rule out (p_fit >= PRUNE_BELOW) by
    expected speed (samples/s x p_fit: the step time for the workload's global batch, the same order as
    MFU, discounted by the risk of not fitting), then by lower peak memory; those ruled out last. Megatron's
    TFLOPS count recompute, so ordering by them would reward activation checkpointing for the work it
    repeats; step time compares like with like."""
    memo: dict = {}
    return sorted((predict(lay, workload, memo=memo) for lay in layouts), key=rank_key)


def rank_key(pr: Prediction) -> tuple:
    """`rank`'s order: not ruled out first, by expected speed, then lower peak memory; at a tie, recompute less."""
    return not pr.fits, -expected_speed(pr), pr.memory_gb, RECOMPUTE.index(pr.layout.recompute)
