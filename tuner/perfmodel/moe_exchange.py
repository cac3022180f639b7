"""The token exchange of MoE layers between the EP ranks: the dispatch and combine all-to-alls (Megatron-Core's
alltoall dispatcher, or its flex dispatcher over DeepEP / HybridEP), what of them shows under Megatron-Core's EP
overlap and shared-expert overlap, where an EP group lies, and the one-line MoE summary `tuner plan` prints.
Pure. The layer's compute, activations and parameters are tuner.perfmodel.moe's; where the experts live and how
tokens are routed: its module docstring.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import comb

from tuner.perfmodel import comm
from tuner.perfmodel.compute import Shape, _passes
from tuner.perfmodel.moe import load, rank_tokens
from tuner.recompute_modes import recompute_modules
from tuner.specs import ClusterSpec, ModelSpec

#: The flex dispatcher's bandwidth as a share of the links' (instead of the cluster's NCCL network_efficiency):
#: DeepEP's own measurement of its normal (training) kernels, deepseek-ai/DeepEP README 'Normal kernels with
#: NVLink and RDMA forwarding' (H800, ~160 GB/s NVLink, CX7 400 Gb/s ~50 GB/s; DeepSeek-V3 pre-training
#: setting): intranode dispatch / combine 153 / 158 GB/s (0.97 of 160, the mean), internode EP 16-64
#: 43-47 GB/s (0.89 of 50, the median of the six). HybridEP is taken as DeepEP (ASSUMED: no published table).
FLEX_EFFICIENCY = {"nvlink": 0.97, "network": 0.89}
#: SMs the flex dispatcher's kernels hold while they move tokens: DeepEP's Buffer.num_sms (deep_ep/buffer.py line 30,
#: 20, at b7fef496 of 2025-08, the V1 the published runs used; its README's example sets 24), which Megatron-Core
#: kept as moe_deepep_num_sms ("historical default 20", transformer_config.py line 969 at d98e8a64ddf3). Compute that
#: runs beside an exchange gets the GPU's other SMs (`sm_contention`).
FLEX_SMS = 20


@dataclass(frozen=True)
class TokenExchange:
    """How a run moves the tokens between the EP ranks, where it is not what `tuner launch` writes
    (benchmarks/moe_accuracy.py predicts published runs as they were configured).
    overlap: Megatron-Core's --overlap-moe-expert-parallel-comm on or off; None: where the framework
    allows it (tuner.frameworks ep_overlap), as `launch` writes it.
    dispatcher: "alltoall" (--moe-token-dispatcher-type alltoall) or "flex" (Megatron-Core's flex dispatcher
    with its DeepEP or HybridEP backend, `flex_alltoall_time`); None: `dispatcher_for`, what `launch` writes.
    overlaps: the framework overlaps the run had (names of tuner.frameworks Framework.overlaps: "tp", "p2p",
    "dp", "ep"), where they are not what the framework's current release does and `launch` writes: a
    published config that turns --tp-comm-overlap off (NVIDIA's Grok-1 recipe: ub_tp_comm_overlap false), a
    Megatron-LM older than its overlaps (commit 285068c8, 2023-01-11, has none: --overlap-grad-reduce came in
    2d5220a424, 2023-09-05). None: the framework's own."""

    overlap: bool | None = None
    dispatcher: str | None = None
    overlaps: frozenset | None = None
    shared_overlap: bool = False      # --moe-shared-expert-overlap (`shared_overlap_exposed`); launch leaves it off
    graphed: bool = False             # the whole iteration replays as one CUDA graph with a sync-free dispatch
                                      # (tuner.perfmodel.moe.MOE_LAYER_OVERHEAD_MS: not charged); launch writes none
    quantized_params: bool | None = None   # the layers' weights held (and gathered) as TE's quantized tensors alone or
                                      # not (Framework.quantized_params); None: as launch writes it


DISPATCHERS = ("alltoall", "flex")


def exposed_alltoall(a2a: float, pre: float, mlp: float, forward: float) -> float:
    """Seconds of one MoE layer's token exchange per micro-batch left exposed under Megatron-Core's
    --overlap-moe-expert-parallel-comm (with --delay-wgrad-compute, as NVIDIA's configs and `tuner launch` run
    it). Its 1F1B schedule pairs one micro-batch's forward of a layer with another's backward of a layer, in
    three phases (TransformerLayerSchedulePlan.run, megatron/core/models/common/model_chunk_schedule_plan.py
    lines 236-300 at d98e8a64ddf3):
        comm stream:    combine_bwd       | dispatch_fwd -> dispatch_bwd    | combine_fwd
        compute stream: pre_dispatch_fwd  | mlp_bwd -> mlp_bwd_dw -> mlp_fwd | pre_dispatch_bwd
    so each exchange hides only behind its own phase's compute, and what outlasts it shows. `a2a`: the layer's
    four exchanges (`alltoall_seconds`, no full recompute: the overlap refuses it), taken equal; `pre` / `mlp`:
    the layer's pre-dispatch (attention, router) and MLP (experts) seconds, forward + backward; `forward`: the
    forward's share of them. The passes a schedule runs unpaired (the warm-up and cool-down chunks) show their
    exchanges whole: `unpaired_share`, weighed in by tuner.perfmodel.stages.stage_times."""
    one = a2a / 4.0
    return max(0.0, one - forward * pre) + max(0.0, 2.0 * one - mlp) + max(0.0, one - (1.0 - forward) * pre)


def shared_overlap_exposed(a2a: float, fc1: float, fc2: float, shape: Shape) -> float:
    """Seconds of one MoE layer's token exchange per micro-batch left exposed under Megatron-Core's
    --moe-shared-expert-overlap (alltoall dispatcher; NeMo's DeepSeek and Llama 4 configs set it): the shared
    experts run on a side stream, fc1 launched before the dispatch all-to-all and fc2 before the combine
    (token_dispatcher.py token_permutation / token_unpermutation, shared_experts.py at core_v0.12.0 and
    d98e8a64ddf3), and their backward on that stream beside the exchanges' gradients (set_tensor_grad_fn_sequence_sr
    orders the communication first). So each exchange hides under the shared GEMM it is paired with -- dispatch
    under fc1, combine under fc2, forward (and recomputed) passes and the backward alike -- and what outlasts it
    shows. `a2a`: the layer's exchanges (`alltoall_seconds`), taken equal; `fc1` / `fc2`: `shared_gemm_seconds`."""
    fwd = exchange_passes(shape) - 1.0        # forward passes (recompute runs the layer's forward again)
    one = a2a / (2.0 * (fwd + 1.0))
    bwd = 2.0 * shape.backward_gemm
    return fwd * (max(0.0, one - fc1) + max(0.0, one - fc2)) + max(0.0, one - bwd * fc1) + max(0.0, one - bwd * fc2)


def unpaired_share(pp: int, vp: int, rank: int, m: int) -> float:
    """Share of a pipeline rank's layer passes that Megatron-Core's combined 1F1B schedule (the EP overlap) runs
    unpaired, so that their token exchanges show whole (`exposed_alltoall`'s pairing needs a forward and a backward
    at once). With pp 1 the first micro-batch's forward runs alone and the last one's backward
    (pipeline_parallel/combined_1f1b.py combined_1f1b_schedule_for_no_pipelining, at d98e8a64ddf3); interleaved,
    the rank's warm-up forwards, (pp - rank - 1) * 2 + (vp - 1) * pp + 1 chunk passes (the extra one that the
    overlap schedules before its 1F1B steps), and as many cool-down backwards, of its m * vp each way
    (schedules.py get_pp_rank_microbatches lines 953-970; microbatch_group_size_per_vp_stage defaults to pp,
    model_parallel_config.py line 568). The overlap needs vp > 1 when pp > 1 (transformer_config.py line 3007)."""
    warm = 1 if pp == 1 else (pp - rank - 1) * 2 + (vp - 1) * pp + 1
    return min(1.0, warm / max(1, m * vp))


def sm_contention(cluster: ClusterSpec, dispatcher: str, hidden: float) -> float:
    """Seconds the compute loses to the flex dispatcher's kernels while it hides `hidden` seconds of their exchange
    (the EP overlap): the kernels hold FLEX_SMS of the GPU's sm_count SMs, so the compute beside them runs on the
    rest, FLEX_SMS / sm_count slower for that long. None for the alltoall dispatcher (NCCL's kernels are counted
    in the cluster's measured efficiencies) or where the cluster states no sm_count."""
    if dispatcher != "flex" or not cluster.sm_count:
        return 0.0
    return hidden * FLEX_SMS / cluster.sm_count


def _miss(experts: int, held: float, top_k: int) -> float:
    """Probability that none of a token's top_k experts (distinct, uniform: balanced routing) is among
    `held` of the `experts`."""
    p = 1.0
    for i in range(top_k):
        p *= max(0.0, experts - held - i) / (experts - i)
    return p


def hit_probability(model: ModelSpec, block: int) -> float:
    """Probability that a token's top_k experts (balanced routing) include any of a block of `block` consecutive experts
    (the E/ep of one EP rank, or the E*local/ep of one node): `_miss` over all E experts, or, where the model routes
    group-limited (DeepSeek-V3: n_group 8, topk_group 4), over the groups a token may use. Megatron-Core's
    group_limited_topk (megatron/core/transformer/moe/moe_utils.py at d98e8a64dd; router.py the same in core_v0.13.0 and
    core_v0.14.0) splits the E experts into moe_router_num_groups consecutive groups, picks moe_router_group_topk of them
    per token by the sum of each group's two best scores, then top_k experts among the picked groups' experts; and
    --moe-router-force-load-balancing (router.py: apply_random_logits before routing) draws the scores at random and keeps
    the group limit, so the picked groups are a uniform draw. A block of whole groups is taken as hit whenever one of its
    groups is picked (a group is picked for its two best scores, which then rank among the token's top_k: in 20,000
    random-score draws of that algorithm, DeepSeek-V3's shape, a picked group held one of the 8 in 98.7 %); a block
    inside one group is hit when its group is picked and one of the token's experts, drawn uniformly from the picked
    groups, falls in it (random-score draws: 0.114 for 4 of 32 experts, this 0.115). Other blocks: unconstrained."""
    e, k = model.num_experts, model.moe_top_k
    groups, picks = model.moe_router_num_groups or 0, model.moe_router_group_topk or 0
    if not groups or not picks or picks >= groups or e % groups:
        return 1.0 - _miss(e, block, k)
    per = e // groups                                    # experts per group
    if block % per == 0:                                 # whole groups: hit unless none of them is picked
        return 1.0 - comb(groups - block // per, picks) / comb(groups, picks)
    if per % block == 0:                                 # inside one group
        return picks / groups * (1.0 - _miss(picks * per, block, k))
    return 1.0 - _miss(e, block, k)


def flex_alltoall_time(model: ModelSpec, cluster: ClusterSpec, shape: Shape, token_bytes: float) -> float:
    """One dispatch (or combine) of Megatron-Core's flex dispatcher (DeepEP / HybridEP: the permutation
    fused into the exchange): a token crosses the network ONCE per remote node that holds any of its
    top_k experts (to the GPU of its local rank there, which forwards it over NVLink), and NVLink once
    per GPU holding any of them, where the alltoall dispatcher sends a copy per (token, expert) pair;
    the combine reduces a node's expert outputs before they cross back. "Node" here is the scale-up domain
    (DeepEP / HybridEP forward over NVLink inside it: the whole NVL72 rack). The network part leaves through
    the GPU's own NIC (the scale-out bandwidth per GPU); the two parts run at once, the slower sets the time. Which nodes
    and GPUs a token reaches: `hit_probability` (group-limited routing keeps DeepSeek-V3's tokens on at most 4 nodes)."""
    ep = shape.ep
    if ep <= 1:
        return 0.0
    local = comm.ranks_in_domain(cluster, ep, shape.etp)
    nodes, e = ep // local, model.num_experts
    hit_gpu, hit_node = hit_probability(model, e // ep), hit_probability(model, e * local // ep)
    per_token = token_bytes * rank_tokens(model, shape)
    up = cluster.intra_node_bandwidth_gbps if not comm.crosses_nodes(cluster, local, shape.etp) else cluster.domain_bandwidth
    intra = per_token * nodes * (local - 1) * hit_gpu / (FLEX_EFFICIENCY["nvlink"] * comm.GB * up)
    inter = per_token * (nodes - 1) * hit_node / (FLEX_EFFICIENCY["network"] * comm.GB * cluster.nic_bandwidth)
    return max(intra, inter) + nodes * cluster.latency_us * 1e-6


def dispatcher_for(model: ModelSpec, cluster: ClusterSpec, shape: Shape, framework: str) -> str:
    """The token dispatcher a layout is predicted and launched with where the run names none: Megatron-Core's
    flex dispatcher (DeepEP / HybridEP, which NVIDIA's DeepSeek-V3 and Qwen3-30B-A3B H100 recipes run) where
    it moves this layout's tokens faster than the alltoall one, on CUDA; the alltoall one elsewhere (ep 1,
    torchtitan, ROCm: DeepEP and HybridEP are NVSHMEM / CUDA libraries)."""
    return dispatch(model, cluster, shape, framework)[0]


def dispatch(model: ModelSpec, cluster: ClusterSpec, shape: Shape, framework: str) -> tuple[str, float]:
    """(`dispatcher_for`'s dispatcher, its `alltoall_seconds`): each exchange computed once."""
    alltoall = alltoall_seconds(model, cluster, shape, "alltoall")
    if shape.ep <= 1 or framework != "megatron-core" or cluster.software != "cuda":
        return "alltoall", alltoall
    flex = alltoall_seconds(model, cluster, shape, "flex")
    return ("flex", flex) if flex < alltoall else ("alltoall", alltoall)


def flex_backend(cluster: ClusterSpec, shape: Shape) -> str:
    """The flex dispatcher's backend: HybridEP where the EP group crosses nodes of a scale-up domain larger
    than a node (an NVL72 rack: "currently only 'hybridep' backend supports the MNNVL case", Megatron-Core's
    transformer_config.py line 898 at d98e8a64dd), DeepEP otherwise (its default)."""
    mnnvl = cluster.domain_gpus > cluster.gpus_per_node and comm.crosses_nodes(cluster, shape.ep, shape.etp)
    return "hybridep" if mnnvl else "deepep"


def exchange_passes(shape: Shape) -> float:
    """Passes of an MoE layer that exchange tokens per micro-batch: forward, backward, and the forward again
    under full recompute or Megatron-Core's moe recompute module."""
    _, _, _, full = _passes(shape)
    return 2.0 + full + (0.0 if full else float("moe" in recompute_modules(shape.recompute)))


def alltoall_seconds(model: ModelSpec, cluster: ClusterSpec, shape: Shape, dispatcher: str = "alltoall") -> float:
    """The token dispatch and combine of one MoE layer for one micro-batch on one GPU: two all-to-alls
    forward, two backward (the gradients go the other way), two more with full recompute, each moving
    this rank's T*top_k bf16 hidden states over its EP group (ep ranks, etp apart; the flex dispatcher:
    `flex_alltoall_time`); and with etp > 1 the expert-TP all-gather of the dispatched tokens and
    reduce-scatter of the outputs (one all-reduce's worth per pass)."""
    passes = exchange_passes(shape)
    tokens = rank_tokens(model, shape) * model.moe_top_k * load(model)
    nbytes = 2.0 * tokens * model.hidden_size
    one = (flex_alltoall_time(model, cluster, shape, 2.0 * model.hidden_size) if dispatcher == "flex"
           else comm.alltoall_time(cluster, nbytes, shape.ep, shape.etp))
    seconds = 2.0 * passes * one
    if shape.etp > 1:
        bw = comm.group_bandwidth(cluster, shape.etp, 1)
        seconds += passes * comm.allreduce_time(nbytes * shape.etp, shape.etp, bw, cluster)
    return seconds



def ep_group_nodes(cluster: ClusterSpec, ep: int, etp: int) -> int:
    """Nodes one EP group spans: its ep ranks are etp apart, ep*etp consecutive ranks from a group start."""
    if not comm.crosses_nodes(cluster, ep, etp):
        return 1
    return -(-ep * etp // cluster.gpus_per_node)


def ep_group_domains(cluster: ClusterSpec, ep: int, etp: int) -> int:
    """Scale-up (NVLink) domains one EP group spans."""
    if not comm.leaves_domain(cluster, ep, etp):
        return 1
    return -(-ep * etp // cluster.domain_gpus)


def moe_summary(layout, workload, prediction) -> str:
    """One line on the MoE side of a prediction: the all-to-all's share and where its group lies, the
    experts one GPU holds, the expert-data-parallel replicas, and active against total parameters."""
    from tuner.layout import expert_data_parallel
    m, c = workload.model, workload.cluster
    ep, etp = layout.expert_parallel, layout.expert_tensor_parallel
    nodes, domains = ep_group_nodes(c, ep, etp), ep_group_domains(c, ep, etp)
    inside = "inside one node (NVLink)" if nodes == 1 else f"over {nodes} nodes of one NVLink domain"
    where = "no all-to-all (ep 1)" if ep == 1 else (
        f"EP group of {ep} GPUs {etp} apart {inside if domains == 1 else f'over {nodes} nodes (network)'}")
    t = prediction.time_breakdown
    a2a, over = t.get("all_to_all", 0.0), t.get("moe_overhead", 0.0)
    from tuner.perfmodel.compute import shape_of
    sh = shape_of(layout, workload)
    if ep > 1:
        how = dispatcher_for(m, c, sh, workload.framework)
        where += f", {how} dispatcher" + (f" ({flex_backend(c, sh)})" if how == "flex" else "")
    split = f", each split {etp} ways" if etp > 1 else ""
    return (f"MoE: all-to-all {a2a:.3g} s of the {prediction.step_time_s:.3g} s step ({100 * a2a / prediction.step_time_s:.1f} %; "
            f"{where}), MoE layer overhead {over:.3g} s; {m.num_experts // ep} of {m.num_experts} experts per GPU{split}, "
            f"expert-data-parallel {expert_data_parallel(layout)}; {m.active_parameters / 1e9:.1f} B of "
            f"{m.num_parameters / 1e9:.1f} B parameters active per token (MFU counts the active ones)")
