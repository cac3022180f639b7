"""The analytic performance and memory model: predict(layout, workload) -> Prediction.

Pure and fast (no I/O; numpy only in memory_batch, plan's memory of many layouts at once, which answers as
memory_fit does): `tuner plan` ranks every valid layout with it. Memory comes from
memory.py, per-micro-batch compute from compute.py, communication from comm.py, each pipeline stage's
seconds per micro-batch from stages.py; every hardware constant comes from the workload's ClusterSpec, so
the same code predicts any cluster file.

Step time of one iteration, the 1F1B pipeline (interleaved over v virtual stages per rank):

    step = (m + (p - 1) / v) * t_stage(slowest) + t_dp + t_embedding_sync + t_optimizer + t_step_overhead

t_stage = compute (GEMMs, attention, element-wise) + TP all-reduces (reduce-scatter + all-gather with
sequence parallelism) + the context-parallel K/V ring beyond the attention it overlaps + blocking p2p
(v times per micro-batch when interleaved) + a fixed overhead per micro-batch and model chunk (v of them per
micro-batch when interleaved: each chunk's step is its own dispatch), and for mixture-of-experts
layers the token all-to-all (`all_to_all`, hidden under compute where Megatron-Core overlaps it) and a
fixed per-layer `moe_overhead` (tuner.perfmodel.moe); the slowest stage is the first or last (embedding /
LM head and loss; dense layers first, as DeepSeek-V3's, only make the first stage lighter).

The workload's framework (tuner.frameworks) says what is overlapped. Megatron-Core's overlaps
(--tp-comm-overlap with sequence parallelism, --overlap-p2p-comm with interleaving, --overlap-grad-reduce,
--overlap-param-gather): each of those collectives shows only where it outlasts the compute it runs under
-- its own GEMM (Transformer Engine binds each TP collective to one: `tp_overlap`), a stage's compute, the last
micro-batch's backward and the first one's forward. Compute one of them hides under is not there for another
(stages.free_compute: what the interleaved p2p and the MoE exchange hide under is not the gradient sync's).
Megatron-DeepSpeed overlaps nothing: DP/ZeRO collectives run after gradient accumulation (at ZeRO-3 each of
DeepSpeed's gathers and reduce-scatters pays NCCL's ring latency, `zero3_latency`). torchtitan's
FSDP2 gathers and reduce-scatters layer by layer under the neighbouring layer's compute (`fsdp_time`).
t_step_overhead is the cluster's fixed cost per iteration (tuner.perfmodel.step_floor: step_overhead_ms; 0 unless
measured, as `tuner calibrate` does from real runs of the harness).
"""

from __future__ import annotations

import dataclasses

from tuner.layout import RECOMPUTE, Layout, expert_data_parallel, micro_batches_per_pipeline, stage_layers
from tuner.pipeline_split import bubble_share
from tuner.frameworks import megatron_fsdp, of as framework_of
from tuner.perfmodel import buckets, comm, compute, memory, moe, moe_exchange, quantized, step_floor
from tuner.perfmodel.compute import shape_of
from tuner.perfmodel.deepspeed_states import partitioned_stage
from tuner.perfmodel.fit import (MEMORY_KEYS, MEMORY_NOISE_SD, MEMORY_PRIOR_SPLIT, PRUNE_BELOW, RECOMMEND_AT,
                                 account_sd, expected_speed, fit_probability, gpu_fit_probability, keeps_headroom,
                                 memory_gp_scales, memory_prior_sd, memory_shares, prior_fit_probability, risk,
                                 with_measured_bias)
from tuner.perfmodel.flops import megatron_flops, model_flops
from tuner.perfmodel.prediction import Prediction
from tuner.perfmodel.stages import (HIDDEN, SM_SHARE, free_compute, layer_parts, offload_seconds, overlaps_of,
                                   slowest_stage, stage_times, stage_total)
from tuner.specs import Workload

__all__ = ["SM_SHARE", "predict", "rank", "expected_speed", "risk", "keeps_headroom", "fit_probability", "memory_prior_sd",
           "account_sd", "gpu_fit_probability", "breakdown_fit",
           "memory_gp_scales", "memory_shares", "Prediction", "stage_times", "shape_of", "PRUNE_BELOW", "RECOMMEND_AT",
           "MEMORY_KEYS", "MEMORY_NOISE_SD", "MEMORY_PRIOR_SPLIT", "with_measured_bias"]


def fsdp_time(layout: Layout, workload: Workload, compute_mb: float, m: int, grad_bytes: float = 4.0,
              gathers: bool = True, weight_bytes: float = 2.0) -> dict:
    """FSDP's exposed collectives per iteration over the d*c ranks that shard the weights (FSDP2's, and
    Megatron-FSDP's with its gradient dtype `grad_bytes`; `gathers` False: its optim_grads, parameters kept
    whole, only the gradients reduce-scattered layer by layer): each layer's
    bf16 parameters are all-gathered before its forward and (resharded after it without pipelining)
    again before its backward, and its gradients reduce-scattered in fp32 after it, each under the
    neighbouring layer's compute (implicit prefetch); a layer's collectives show only where they outlast
    that compute, and the first gather and the last reduce-scatter of a pass show whole. Without
    pipelining that happens every micro-batch (gradients are synchronised at each accumulation step);
    with pipelining once per step (parameters stay gathered, gradients accumulate unsharded). `weight_bytes`: a layer
    weight's bytes in the gather (Megatron-FSDP's FP8 weights: quantized.layer_gather_bytes); the embedding's stay bf16."""
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
    ag_e = comm.allgather_time(weight_bytes * experts, edp, ebw, cluster)
    rs_e = comm.reduce_scatter_time(grad_bytes * experts, edp, ebw, cluster)
    ag = comm.allgather_time(weight_bytes * dense, shards, bw, cluster) + ag_e
    rs = comm.reduce_scatter_time(grad_bytes * dense, shards, bw, cluster) + rs_e
    embedding = memory.embedding_params(model, layout.tp)
    first = comm.allgather_time(max(weight_bytes * dense, 2.0 * embedding), shards, bw, cluster)
    last = comm.reduce_scatter_time(grad_bytes * max(dense, embedding), shards, bw, cluster)
    if not gathers:
        ag = ag_e = first = 0.0
    fwd, bwd = compute_mb / layers / 3.0, 2.0 * compute_mb / layers / 3.0
    if layout.pp == 1:
        reduce, gather = max(0.0, ag + rs - bwd), max(0.0, ag - fwd)
        return {"grad_reduce": m * (last + layers * reduce), "param_gather": m * (first + layers * gather),
                "expert_grad_reduce": m * layers * reduce * _part(ag_e + rs_e, ag + rs),
                "expert_param_gather": m * layers * gather * _part(ag_e, ag)}
    reduce, gather = max(0.0, rs - bwd), max(0.0, ag - fwd)
    return {"grad_reduce": last + layers * reduce, "param_gather": first + layers * gather,
            "expert_grad_reduce": layers * reduce * _part(rs_e, rs), "expert_param_gather": layers * gather * _part(ag_e, ag)}


def _part(expert: float, whole: float) -> float:
    """The expert parameters' part of a collective's exposed time: its part of the collective's whole time
    (what hides under compute hides the dense and the expert parts alike)."""
    return expert / whole if whole > 0 else 0.0


def _with_expert_part(exposed: dict, whole: dict, expert: dict) -> dict:
    """`exposed` (grad_reduce, param_gather) with the expert parameters' part of each (expert_grad_reduce,
    expert_param_gather) as `expert`'s share of `whole` -- the breakdown's split; the sum is `exposed`'s."""
    return {**exposed, **{f"expert_{k}": exposed[k] * _part(expert[k], whole[k]) for k in ("grad_reduce", "param_gather")}}


def bucket_latency(layout: Layout, workload: Workload) -> float:
    """NCCL's latency of each of Megatron-Core's gradient buckets but the first (dp_time charges the buffer as one
    collective): every bucket is its own reduce-scatter (all-reduce without the distributed optimizer) and its own
    parameter all-gather over the d*c ranks, each paying NCCL's ring latency (comm.nccl_ring_latency); the dense
    buffer's buckets (buckets.bucket_count), not the experts'. NVIDIA's stacks only (RCCL's constants not read)."""
    g = layout.dp * layout.context_parallel
    if g <= 1:
        return 0.0
    domains = g // comm.ranks_in_domain(workload.cluster, g, layout.tp)
    count = buckets.bucket_count(workload.model, layout, workload.ddp_bucket_size or None)   # the size a run set, else
    return (count - 1) * comm.nccl_ring_latency(g, domains, allreduce=layout.zero_stage == 0)    # Megatron-Core's


def zero3_latency(layout: Layout, workload: Workload) -> tuple[float, float]:
    """NCCL's latency of each of DeepSpeed ZeRO-3's collectives but the first of each pass, per micro-batch: (the
    parameter all-gathers of the forward, recompute and backward, the gradient reduce-scatters). dp_time charges each
    pass as one collective; DeepSpeed runs one per prefetch group and per reduce bucket (buckets.zero3_collectives),
    each a ring over the d*c ranks paying comm.nccl_ring_latency. NVIDIA's stacks only (RCCL's constants not read)."""
    g = layout.dp * layout.context_parallel
    if g <= 1 or workload.cluster.software != "cuda":
        return 0.0, 0.0
    lat = comm.nccl_ring_latency(g, g // comm.ranks_in_domain(workload.cluster, g, layout.tp))
    gathers, reduces = buckets.zero3_collectives(workload.model, layout)
    return (3 if layout.checkpointing else 2) * (gathers - 1) * lat, (reduces - 1) * lat


def gradient_sync_time(layout: Layout, workload: Workload, fw, slow: dict, m: int, params_gpu: float,
                       experts_gpu: float, hide: frozenset | None = None, bare: dict | None = None) -> dict:
    """`_gradient_sync`'s exposed seconds, and the compute lost to the SMs NCCL's kernels hold while the rest hides
    (comm.sm_share; its seconds carried in grad_reduce): the collectives' whole time (`bare`, the same for every
    stage: a caller asking for several passes it) is _gradient_sync's with no compute to hide under."""
    out = _gradient_sync(layout, workload, fw, slow, m, params_gpu, experts_gpu, hide)
    if not workload.cluster.sm_count:
        return out
    if bare is None:
        bare = _gradient_sync(layout, workload, fw, {**slow, **_NO_COMPUTE}, m, params_gpu, experts_gpu, hide)
    hidden = bare["grad_reduce"] + bare["param_gather"] - out["grad_reduce"] - out["param_gather"]
    share = comm.sm_share(workload.cluster, hidden, comm.NCCL_CTAS)
    if not share:
        return out
    out = {**out, "grad_reduce": out["grad_reduce"] + share}
    if "expert_grad_reduce" in out:           # the experts' part of it: their part of what hides
        expert = sum(bare[k] - out[k] for k in ("expert_grad_reduce", "expert_param_gather"))
        out["expert_grad_reduce"] += share * expert / hidden
    return out


_NO_COMPUTE = {"gemm": 0.0, "attention": 0.0, "elementwise": 0.0, HIDDEN: 0.0, SM_SHARE: 0.0}


def _gradient_sync(layout: Layout, workload: Workload, fw, slow: dict, m: int, params_gpu: float,
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
        out = fsdp_time(layout, workload, compute_mb, m, fw.grad_bytes(workload), gathers=layout.zero_stage >= 3,
                        weight_bytes=quantized.layer_gather_bytes(fw, layout, workload))
        if layout.zero_stage == 2:          # optim_grads: the updated parameters gathered once, under the first forward
            gather = comm.dp_time(cluster, t, layout.dp * layout.context_parallel, 1, params_gpu - experts_gpu, m,
                                  layout.checkpointing)["param_gather"]
            out["param_gather"] += max(0.0, gather - compute_mb / 3)
        return out
    gb = fw.grad_bytes(workload) if fw.name == "megatron-core" else None     # its buffers' dtype (comm.dp_time)
    dense = params_gpu - experts_gpu
    zero = partitioned_stage(layout, workload, fw)
    dp = comm.dp_time(cluster, t, layout.dp * layout.context_parallel, zero, dense, m,
                      layout.checkpointing, gb, quantized.gather_bytes(fw, layout, workload, dense))
    if gb is not None and layout.zero_stage <= 1 and cluster.software == "cuda":
        lat = bucket_latency(layout, workload)
        dp = {"grad_reduce": dp["grad_reduce"] + lat, "param_gather": dp["param_gather"] + lat * (layout.zero_stage == 1)}
    if fw.name == "megatron-deepspeed" and layout.zero_stage >= 3:
        gather, reduce = zero3_latency(layout, workload)
        dp = {"grad_reduce": dp["grad_reduce"] + m * reduce, "param_gather": dp["param_gather"] + m * gather}
    de = {"grad_reduce": 0.0, "param_gather": 0.0}
    if experts_gpu:
        de = comm.dp_time(cluster, layout.expert_parallel * layout.expert_tensor_parallel, expert_data_parallel(layout),
                          layout.zero_stage, experts_gpu, m, layout.checkpointing, gb,
                          quantized.gather_bytes(fw, layout, workload, experts_gpu, experts=True))
        dp = {k: dp[k] + de[k] for k in dp}
    whole = dp
    if "dp" in (fw.overlaps if hide is None else hide) and layout.zero_stage <= 1:
        # the embedding's bucket reduces after the last backward and gathers before the first forward (buckets.py)
        last = min(buckets.last_bucket_params(workload.model, layout, workload.ddp_bucket_size or None), dense)
        tail = comm.dp_time(cluster, t, layout.dp * layout.context_parallel, layout.zero_stage, last, m,
                            layout.checkpointing, gb)
        dp = {"grad_reduce": max(tail["grad_reduce"], dp["grad_reduce"] - compute_mb * 2 / 3),
              "param_gather": max(tail["param_gather"], dp["param_gather"] - compute_mb / 3)}
    return _with_expert_part(dp, whole, de)


def memory_fit(layout: Layout, workload: Workload, memo: dict | None = None) -> tuple:
    """The memory half of `predict`: (micro-batches per pipeline, the Shape, the worst stage, its breakdown
    with the framework's measured bias, p_fit). `memo`: sub-results shared by the layouts of one workload."""
    m = micro_batches_per_pipeline(layout, workload.global_batch)
    sh = shape_of(layout, workload) if memo is None else _memo_shape(layout, workload, memo)
    worst_stage, mem = memory.peak_memory(layout, workload, m, sh, memo)
    mem, p_fit = breakdown_fit(mem, workload)
    return m, sh, worst_stage, mem, p_fit * memory.host_fits(layout, workload, sh)


def _misfit_reason(layout: Layout, workload: Workload, sh: compute.Shape, mem: dict, worst_stage: int) -> str:
    """Why a layout does not fit ("" where it may): the host's memory (memory.host_fits), or the GPU's (fit_reason)."""
    cluster = workload.cluster
    if not memory.host_fits(layout, workload, sh):
        return (f"offloading {layout.offload_layers} layers holds {memory.offload_host_gb(layout, workload, sh):.0f} GB "
                f"of activations in host memory per GPU, more than the {cluster.host_memory_gb:.0f} GB the cluster "
                "has (host_memory_gb); use fewer --offload-layers")
    if mem["total"] <= cluster.memory_gb:
        return ""
    return memory.fit_reason(mem, cluster.memory_gb, worst_stage, memory.buffers_name(layout, framework_of(workload)))


def breakdown_fit(mem: dict, workload: Workload) -> tuple[dict, float]:
    """A stage's memory breakdown (memory.peak_memory's) as every command states it: with the framework's measured
    bias, and its p_fit on the workload's GPU (benchmarks/reading.py states a published run's memory as it ran, with
    what its recipe changed, through this one function)."""
    fw = framework_of(workload)
    mem = with_measured_bias(mem, fw.memory_bias)
    return mem, prior_fit_probability(mem, workload.cluster.memory_gb, fw)


def _memo_shape(layout: Layout, workload: Workload, memo: dict) -> compute.Shape:
    key = ("shape", layout.micro_batch, layout.tp, layout.context_parallel, layout.sequence_parallel, layout.recompute,
           layout.expert_parallel, layout.expert_tensor_parallel)
    sh = memo.get(key)
    if sh is None:
        sh = memo[key] = shape_of(layout, workload)
    return sh


def last_to_finish(layout: Layout, workload: Workload, fw, stages: list, m: int, params_gpu: float,
                   experts_gpu: float, hide: frozenset) -> tuple[dict, dict]:
    """The stage the step waits for and its gradient sync: the latest of m * stage time + the sync exposed
    beyond that stage's own free compute (not the slowest stage's: recomputing more could then be faster)."""
    best, bare = None, None
    if workload.cluster.sm_count:            # the collectives' whole time, one for every stage
        bare = _gradient_sync(layout, workload, fw, {**stages[0], **_NO_COMPUTE}, m, params_gpu, experts_gpu, hide)
    for st in stages:
        dp = gradient_sync_time(layout, workload, fw, st, m, params_gpu, experts_gpu, hide, bare)
        end = m * stage_total(st) + dp["grad_reduce"] + dp["param_gather"]
        if best is None or end > best[0]:
            best = (end, st, dp)
    return best[1], best[2]


def offload_beside_nic(layout: Layout, workload: Workload, how: tuple, slow: dict, m: int, sh: compute.Shape,
                       params: tuple[float, float]) -> dict:
    """`slow` with its CPU offloading copies slowed by the NIC's data-parallel traffic on the same PCIe link, where
    the cluster says they share it (nic_shares_host_link; tuner.perfmodel.offload's docstring): the layout's
    inter-node gradient sync that runs under the compute -- _gradient_sync's seconds with no compute to hide under less
    those it shows, the parameter gathers under the forward, the gradient reduce (and ZeRO-3's re-gathers) under the
    backward, spread evenly over the step's micro-batches (Megatron-FSDP runs them every micro-batch at pp 1; the
    distributed optimizer once a step, in the first forward and the last backward: an average there), only the groups
    that leave the scale-up domain and only for stacks that run them under compute (Megatron-FSDP / FSDP, the
    overlapped distributed optimizer) -- busy that share of each phase: its kernels (split 1 : 2 x backward_gemm) and
    the compute stream's waits for the copies (stages.offload_seconds, offload.busy_share). The seconds it shows run
    while the compute stream waits for them, before the first forward or after the last backward, when no copy runs
    (FSDP's per-layer waits fall inside a phase: left out of both the NIC's seconds and the phase's length). The
    NCCL latency of each bucket is counted with the rest: an upper bound on the NIC's busy time (ASSUMPTION).
    `how`: (framework, overlaps, exchange, memo); `params`: the stage's parameters and expert parameters per GPU."""
    fw, hide, exchange, memo = how
    cluster = workload.cluster
    if not (layout.offload_layers and cluster.nic_shares_host_link and "cpu_offload" in slow):
        return slow
    if not (megatron_fsdp(layout, workload) or fw.fsdp or ("dp" in hide and layout.zero_stage <= 1)):
        return slow                           # the collectives run after the compute, not beside the copies
    whole = _gradient_sync(layout, workload, fw, {**slow, **_NO_COMPUTE}, m, *params, hide)
    shown = _gradient_sync(layout, workload, fw, slow, m, *params, hide)
    # what runs under the compute: the shown seconds run while the compute stream waits for them (before the first
    # forward, after the last backward), when no copy runs
    under = {k: whole.get(k, 0.0) - shown.get(k, 0.0) for k in
             ("param_gather", "grad_reduce", "expert_param_gather", "expert_grad_reduce")}
    out = (comm.leaves_domain(cluster, layout.dp * layout.context_parallel, layout.tp),
           comm.leaves_domain(cluster, expert_data_parallel(layout),
                              layout.expert_parallel * layout.expert_tensor_parallel))
    inter = [((under[k] - under[f"expert_{k}"]) * out[0] + under[f"expert_{k}"] * out[1]) / m
             for k in ("param_gather", "grad_reduce")]
    # the kernels' seconds, not the TP collectives': a TP group that leaves the node sends over the same NIC, which
    # the share does not count, so its seconds are not NIC-idle time either (exposing TP or moving it out of the
    # NVLink domain never makes the copies faster: benchmarks/invariants.py)
    kernels = slow["gemm"] + slow["attention"] + slow["elementwise"]
    if not any(inter) or kernels <= 0:
        return slow
    parts = layer_parts(layout, workload, sh, exchange, memo)
    return {**slow, "cpu_offload": offload_seconds(layout, workload, sh, parts, tuple(inter), kernels)}


def framework_as_run(workload: Workload, exchange: moe_exchange.TokenExchange | None):
    """The workload's framework, with its layers' weights held as `exchange.quantized_params` says where a run held
    them otherwise than `tuner launch` writes (Framework.quantized_params: their parameter all-gather's bytes)."""
    fw = framework_of(workload)
    held = None if exchange is None else exchange.quantized_params
    return fw if held is None else dataclasses.replace(fw, fp8_params=held)


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
    fw = framework_as_run(workload, exchange)
    fits = p_fit >= PRUNE_BELOW
    reason = _misfit_reason(layout, workload, sh, mem, worst_stage)

    # ---- time
    _, t_stage, stages = slowest_stage(layout, workload, sh, exchange, memo)
    params_gpu, experts_gpu = memory.largest_stage_params(model, layout)
    edp, hide = expert_data_parallel(layout), overlaps_of(workload, exchange)
    slow, dp = last_to_finish(layout, workload, fw, stages, m, params_gpu, experts_gpu, hide)
    slow = offload_beside_nic(layout, workload, (fw, hide, exchange, memo), slow, m, sh, (params_gpu, experts_gpu))
    tied = memory.tied_embedding_params(model, t, p)     # none when the LM head is untied
    sync = comm.embedding_sync_time(cluster, t * layout.context_parallel, d, p, tied) if tied else 0.0
    owned = (params_gpu - experts_gpu) / shards + experts_gpu / edp if partitioned_stage(layout, workload, fw) >= 1 \
        else params_gpu
    t_opt = compute.optimizer_time(cluster, owned)

    time = {k: m * v for k, v in slow.items() if k != HIDDEN}
    time["bubble"] = (p - 1) * bubble_share(layout, model.num_layers) * t_stage
    time.update(dp_grad_reduce=dp["grad_reduce"], dp_param_gather=dp["param_gather"], embedding_sync=sync)
    time["optimizer"] = t_opt
    if floor := step_floor.step_floor_s(fw.name, cluster):
        time["step_overhead"] = floor
    step = sum(time.values())
    if model.is_moe:    # the dense parameters' collectives over the data-parallel group, the experts' over expert-dp
        for k in ("grad_reduce", "param_gather"):
            time[f"dp_{k}"] -= dp.get(f"expert_{k}", 0.0)
            time[f"dp_expert_{k}"] = dp.get(f"expert_{k}", 0.0)

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
