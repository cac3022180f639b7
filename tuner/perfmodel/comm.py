"""Communication costs of a layout: collectives, pipeline p2p, and where each group sits.

Pure functions of a layout, a model and a ClusterSpec (docs/reference/formulas.md). Placement follows
Megatron's rank order: TP varies fastest, then CP, then DP, then PP, so

    rank = tp_index + t * (cp_index + c * (dp_index + d * pp_index))

and a group is described by its size and the rank stride between its members (TP: stride 1, CP:
stride t, DP: stride t*c, a PP neighbour: stride t*c*d). Gradients are reduced (and the distributed
optimizer / ZeRO shards its states) over the d*c ranks that hold the same weights: stride t. Every bandwidth and latency comes from the cluster file.

Every framework tuner launches places ranks in this order (tuner.frameworks.RANK_ORDER cites each), so
the strides above are theirs.

Bandwidth rules (GB/s per rank, before `network_efficiency`). A node (`gpus_per_node`, what Slurm
allocates: a DGX, a GB200 tray) sits inside a scale-up domain (`ClusterSpec.domain_gpus`: NVLink or
Infinity Fabric; the node itself unless the cluster says otherwise, e.g. 72 GPUs over 18 trays of an
NVL72 rack):
- A group inside one node gets the bandwidth of the smallest aligned block of GPUs that contains it
  (`ClusterSpec.intra_group_bandwidth(size * stride)`): on Frontier a TP=2 group sits on one MI250X
  (200 GB/s), a block of 4 or 8 GCDs crosses Infinity Fabric links between packages (100 / 50 GB/s).
- A group that spans nodes inside one aligned block of the domain gets the domain's bandwidth
  (`ClusterSpec.domain_bandwidth`: NVLink through the rack's switches).
- A group that leaves the domain shares the scale-out network with the other groups of the same kind
  that cross at the same time: each of its ranks in a domain brings its own NIC, so the ring gets
  (its ranks in the domain) x (scale-out bandwidth per GPU, `ClusterSpec.nic_bandwidth`). Its ring still
  runs through the domain's links of those ranks, so it also gets no more than their in-domain bandwidth.
With the domain = the node (every cluster that does not set one) these are the node rules of before.
"""

from __future__ import annotations

from tuner.specs import ClusterSpec

GB = 1e9


def _block_bandwidth(cluster: ClusterSpec, block: int) -> float | None:
    """Per-GPU bandwidth of an aligned block of `block` consecutive GPUs that stays inside the scale-up
    domain: in one node the node's table, across nodes of the domain the domain's links; None if it leaves."""
    gpn, dom = cluster.gpus_per_node, cluster.domain_gpus
    if block <= gpn and gpn % block == 0:
        return cluster.intra_group_bandwidth(block)
    if block <= dom and dom % block == 0:
        return cluster.domain_bandwidth
    return None


def ranks_in_domain(cluster: ClusterSpec, size: int, stride: int) -> int:
    """How many of a group's `size` ranks, `stride` apart, share one scale-up domain (all of them when
    the group stays inside it)."""
    dom = cluster.domain_gpus
    if not leaves_domain(cluster, size, stride):
        return size
    return max(1, min(size, dom // stride)) if stride < dom else 1


def group_bandwidth(cluster: ClusterSpec, size: int, stride: int) -> float:
    """Per-rank bandwidth (GB/s, per direction) of a collective group of `size` ranks, `stride` apart."""
    if size <= 1:
        return float("inf")
    inside = _block_bandwidth(cluster, size * stride)
    if inside is not None:
        return inside
    # The group leaves the domain: `k` of its ranks sit in each domain it touches, each with its own NIC.
    k = ranks_in_domain(cluster, size, stride)
    share = cluster.nic_bandwidth * k
    if k > 1:
        part = min(k * stride, cluster.domain_gpus)
        share = min(share, cluster.intra_group_bandwidth(part) if part <= cluster.gpus_per_node
                    else cluster.domain_bandwidth)
    return share


def crosses_nodes(cluster: ClusterSpec, size: int, stride: int) -> bool:
    """Whether a group of `size` ranks `stride` apart spans more than one node."""
    block = size * stride
    return size > 1 and not (block <= cluster.gpus_per_node and cluster.gpus_per_node % block == 0)


def leaves_domain(cluster: ClusterSpec, size: int, stride: int) -> bool:
    """Whether a group of `size` ranks `stride` apart spans more than one scale-up (NVLink) domain."""
    return size > 1 and _block_bandwidth(cluster, size * stride) is None


def _bw_bytes(cluster: ClusterSpec, bw_gbps: float) -> float:
    return bw_gbps * GB * cluster.network_efficiency


def allreduce_time(nbytes: float, size: int, bw_gbps: float, cluster: ClusterSpec) -> float:
    """Ring all-reduce of `nbytes` over `size` ranks: 2(g-1)/g * n / bw + 2(g-1) * latency."""
    if size <= 1 or nbytes <= 0:
        return 0.0
    g = size
    return 2.0 * (g - 1) / g * nbytes / _bw_bytes(cluster, bw_gbps) + 2.0 * (g - 1) * cluster.latency_us * 1e-6


#: NCCL's latency model for a ring reduce-scatter / all-gather in its Simple protocol (the one it picks for
#: gradient buckets of tens of MB and up), NVIDIA/nccl src/graph/tuning.cc @ 5067397c (ncclTunerConstantsDefaults,
#: ncclTopoTuneModel): a base latency, an NVLink step latency for each step inside a node (max(3.4, 3 x the network
#: overhead of 1.0 us on an Intel or Arm host) = 3.4 once the ring leaves the node) and a network step latency for
#: each of the nNodes - 1 steps between nodes (the InfiniBand plugin states no latency of its own: 14.0).
NCCL_RING_BASE_US, NCCL_RING_NVLINK_STEP_US, NCCL_RING_NET_STEP_US = 8.4, 3.4, 14.0


def nccl_ring_latency(size: int, domains: int, allreduce: bool = False) -> float:
    """Seconds of NCCL's latency for one ring reduce-scatter or all-gather over `size` ranks spanning `domains`
    scale-up domains (NCCL's nodes): size - 1 steps, domains - 1 of them over the network (tuning.cc above); a ring
    all-reduce is a reduce-scatter and an all-gather in one kernel, 2 (size - 1) steps after one base latency
    (tuning.cc's nsteps = 2 (nRanks - 1) for ncclFuncAllReduce)."""
    if size <= 1:
        return 0.0
    net = max(0, min(domains, size) - 1)
    steps = (size - 1 - net) * NCCL_RING_NVLINK_STEP_US + net * NCCL_RING_NET_STEP_US
    return (NCCL_RING_BASE_US + (2 if allreduce else 1) * steps) * 1e-6


#: SMs (CTAs) an NCCL kernel holds while it runs, on an 8-GPU Hopper node: one CTA per channel, and a CTA holds its
#: SM alone ("NCCL CTAs won't share an SM with compute kernels", NVIDIA/nccl issue #689, maintainer); NCCL's init lines
#: on such nodes print "16 coll channels" (NVIDIA/nccl #892 on H800, deepseek-ai/DeepEP #106 on multi-node Hopper;
#: 16 SMs for a DGX with 8 NICs in #689), and "2 p2p channels per peer" (the same logs): a ring's send and receive
#: with two peers, 4. Not fitted to any row (benchmarks/overlap_contention.py prints what they move).
NCCL_CTAS, NCCL_P2P_CTAS = 16, 4


def sm_share(cluster: ClusterSpec, hidden: float, ctas: int) -> float:
    """Seconds the compute loses while an NCCL collective of `ctas` CTAs hides `hidden` seconds under it: it runs
    on sm_count - ctas SMs for that long (first order; HBM and wave effects left out). 0 where the cluster states
    no sm_count (the Hopper files, whose SM counts those logs are of, and B200 / GB200 since issue 26, state one)."""
    return hidden * ctas / cluster.sm_count if cluster.sm_count and hidden > 0 else 0.0


def reduce_scatter_time(nbytes: float, size: int, bw_gbps: float, cluster: ClusterSpec) -> float:
    """Ring reduce-scatter (or all-gather) of `nbytes`: half of an all-reduce."""
    return 0.5 * allreduce_time(nbytes, size, bw_gbps, cluster)


allgather_time = reduce_scatter_time


def alltoall_time(cluster: ClusterSpec, nbytes: float, size: int, stride: int) -> float:
    """One all-to-all in which each of `size` ranks, `stride` apart, sends `nbytes` spread evenly over the
    group (1/size of it to itself). The part for ranks in the same scale-up domain goes over its links
    (NVLink: the domain's bandwidth); the part for other domains leaves through the GPU's own NIC (the
    scale-out bandwidth per GPU: every GPU's group exchanges at the same time); the two proceed at once,
    so the slower sets the time; plus one latency per domain the group spans."""
    if size <= 1 or nbytes <= 0:
        return 0.0
    local = ranks_in_domain(cluster, size, stride)
    bw_local = cluster.intra_node_bandwidth_gbps if not crosses_nodes(cluster, local, stride) else cluster.domain_bandwidth
    intra = nbytes * (local - 1) / size / _bw_bytes(cluster, bw_local) if local > 1 else 0.0
    inter = nbytes * (size - local) / size / _bw_bytes(cluster, cluster.nic_bandwidth)
    return max(intra, inter) + (size // local) * cluster.latency_us * 1e-6


def p2p_time(nbytes: float, bw_gbps: float, cluster: ClusterSpec) -> float:
    """One point-to-point message: n / bw + latency."""
    if nbytes <= 0:
        return 0.0
    return nbytes / _bw_bytes(cluster, bw_gbps) + cluster.latency_us * 1e-6


def tp_allreduce_time(cluster: ClusterSpec, tp: int, nbytes: float) -> float:
    """One tensor-parallel all-reduce of `nbytes` over a TP group (contiguous ranks)."""
    return allreduce_time(nbytes, tp, group_bandwidth(cluster, tp, 1), cluster)


def tp_allreduces_per_layer(recompute: str) -> int:
    """Megatron: 2 all-reduces forward, 2 backward, 2 more with full recompute (per layer, micro-batch).
    Sequence parallelism replaces each by a reduce-scatter and an all-gather of the same total time
    (the backward pass's re-gather of the input runs under the data-gradient GEMM)."""
    return 6 if recompute == "full" else 4


#: torchtitan's tensor parallelism is DTensor's (pytorch/torchtitan @ 238fa9953e4a, the launch file's target:
#: models/llama3/infra/parallelize.py apply_tp): per layer two SequenceParallel norms (output Shard(1), the sequence),
#: a PrepareModuleInput Shard(1) -> Replicate before the attention and before the FFN (an all-gather on dim 1) and
#: RowwiseParallel wo / w2 with output_layouts Shard(1) (a reduce-scatter on dim 1); backward the reverse: the 4
#: all-reduces' worth tp_allreduces_per_layer counts. What DTensor and torchtitan run beyond them (dtensor_tp_extra):
#: - per-op selective recompute saves torch.ops._c10d_functional.reduce_scatter_tensor but not all_gather_into_tensor
#:   (parallelize.py _op_sac_save_list) and recomputes every second mm (distributed/activation_checkpoint.py
#:   _apply_op_sac): wk and w3 run again, each from its gathered input, so both all-gathers run again in the backward;
#: - PyTorch's functional collectives hand NCCL dim 0 only (torch/distributed/_functional_collectives.py, which
#:   DTensor's Shard._reduce_shard_tensor / _to_replicate_tensor call): reduce_scatter_tensor with scatter_dim != 0
#:   first copies its whole input into rank order (chunk or narrow, then cat), every time; all_gather_tensor with
#:   gather_dim != 0 copies its whole output back (chunk + cat) unless every dim before gather_dim is 1, where it is a
#:   view (torch/_utils.py _maybe_view_chunk_cat, pytorch/pytorch #169404, 2025-12): at micro-batch 1 the gathers
#:   copy nothing. Each copy reads and writes the whole activation once, at the HBM rate tuner charges element-wise
#:   kernels (no constant chosen).
DTENSOR_SAC_REGATHERS = 2


def dtensor_tp_extra(cluster: ClusterSpec, tp: int, micro_batch: int, recompute: str, op_sac: bool,
                     nbytes: float) -> float:
    """Seconds per layer and micro-batch DTensor's sequence-parallel TP (torchtitan) runs beyond
    tp_allreduces_per_layer's collectives of the `nbytes` activation: the all-gathers per-op selective recompute runs
    again, and funcol's copies of the dim-1 collectives (see DTENSOR_SAC_REGATHERS)."""
    if tp <= 1 or nbytes <= 0:
        return 0.0
    regathers = DTENSOR_SAC_REGATHERS if op_sac else 0
    passes = 2 + (recompute == "full")                  # forward, backward, and the forward again under full
    scatters, gathers = 2 * passes, 2 * passes + regathers
    copies = scatters + (gathers if micro_batch > 1 else 0)
    hbm = cluster.hbm_bandwidth_gbps * GB * cluster.memory_bandwidth_efficiency
    return (regathers * allgather_time(nbytes, tp, group_bandwidth(cluster, tp, 1), cluster)
            + copies * 2.0 * nbytes / hbm)


def cp_ring_time(cluster: ClusterSpec, tp: int, cp: int, kv_bytes: float) -> float:
    """One layer's context-parallel ring for one micro-batch pass: cp - 1 steps, each sending this
    rank's K and V chunk (`kv_bytes`) to the next rank of the CP group (stride tp)."""
    if cp <= 1:
        return 0.0
    return (cp - 1) * p2p_time(kv_bytes, group_bandwidth(cluster, cp, tp), cluster)


def pipeline_p2p_bandwidth(cluster: ClusterSpec, tp: int, dp: int, pp: int) -> float:
    """Per-rank bandwidth of the slowest stage boundary (GB/s).

    A stage holds tp*dp consecutive ranks. If the pipeline leaves the scale-up domain, some boundary
    crosses the network while the domain's other ranks do the same, so each rank gets its NIC (the
    scale-out bandwidth per GPU); in one node the pair sits in a node block of 2*tp*dp GPUs; across the
    nodes of one domain it gets the domain's links."""
    if pp <= 1:
        return float("inf")
    gpn = cluster.gpus_per_node
    if tp * dp * pp <= gpn and gpn % (tp * dp * pp) == 0:
        return cluster.intra_group_bandwidth(2 * tp * dp)
    if _block_bandwidth(cluster, tp * dp * pp) is not None:
        return cluster.domain_bandwidth
    return cluster.nic_bandwidth


def pipeline_p2p_time(cluster: ClusterSpec, tp: int, dp: int, pp: int, nbytes: float) -> float:
    """Blocking p2p per micro-batch on a stage: one activation send forward, one gradient send back
    (DeepSpeed's pipeline engine does not overlap them with compute)."""
    if pp <= 1:
        return 0.0
    return 2.0 * p2p_time(nbytes, pipeline_p2p_bandwidth(cluster, tp, dp, pp), cluster)


def dp_time(cluster: ClusterSpec, tp: int, dp: int, zero_stage: int, params: float, m: int,
            checkpointing: bool, grad_bytes: float | None = None, gather_bytes: float = 2.0) -> dict:
    """Data-parallel / ZeRO collectives per iteration for a GPU holding `params` parameters (fp16),
    over `dp` ranks `tp` apart (with context parallelism: the d*c ranks sharing weights, stride t).

    ZeRO-0: all-reduce of the gradients once per step (after gradient accumulation; with PP in
    DeepSpeed not overlapped with compute). ZeRO-1: the same reduction, then an all-gather of the
    updated parameters. ZeRO-2: reduce-scatter of the gradients every micro-step, all-gather once.
    ZeRO-3: also all-gathers the parameters in every forward, backward (and recompute).
    `grad_bytes` (Megatron-Core, ZeRO 0 / 1): its gradient buffers' dtype, see the branch below; `gather_bytes`: the
    bytes per parameter its parameter all-gather moves there (2, bf16; less where the weights are quantized alone:
    tuner.perfmodel.quantized.gather_bytes)."""
    if dp <= 1:
        return {"grad_reduce": 0.0, "param_gather": 0.0}
    bw = group_bandwidth(cluster, dp, tp)
    n = 2.0 * params
    if grad_bytes is not None and zero_stage <= 1:
        # Megatron-Core's buffers (megatron/core/distributed/param_and_grad_buffer.py at d98e8a64dd,
        # start_grad_sync lines 701-725, start_param_sync line 383): the gradients reduce in their own dtype,
        # all-reduced without the distributed optimizer, reduce-scattered with it; the bf16 parameters gathered
        g = grad_bytes * params
        if zero_stage == 0:
            return {"grad_reduce": allreduce_time(g, dp, bw, cluster), "param_gather": 0.0}
        return {"grad_reduce": reduce_scatter_time(g, dp, bw, cluster),
                "param_gather": allgather_time(gather_bytes * params, dp, bw, cluster)}
    if zero_stage == 0:
        return {"grad_reduce": allreduce_time(n, dp, bw, cluster), "param_gather": 0.0}
    if zero_stage == 1:
        return {"grad_reduce": allreduce_time(n, dp, bw, cluster),
                "param_gather": allgather_time(n, dp, bw, cluster)}
    rs = m * reduce_scatter_time(n, dp, bw, cluster)
    if zero_stage == 2:
        return {"grad_reduce": rs, "param_gather": allgather_time(n, dp, bw, cluster)}
    gathers = 3 if checkpointing else 2
    return {"grad_reduce": rs, "param_gather": m * gathers * allgather_time(n, dp, bw, cluster)}


def embedding_sync_time(cluster: ClusterSpec, tp: int, dp: int, pp: int, embedding_params: float) -> float:
    """All-reduce of the tied word-embedding gradient between the first and last stage (pp > 1)."""
    if pp <= 1:
        return 0.0
    return allreduce_time(2.0 * embedding_params, 2, pipeline_p2p_bandwidth(cluster, tp, dp, pp), cluster)


def strides(layout, framework: str) -> dict[str, int]:
    """Rank stride of each parallel dimension's groups under `framework`'s rank order (tuner.frameworks
    RANK_ORDER, innermost first): a dimension's stride is the product of the degrees inside it. The
    routed experts' EP group is etp apart (etp innermost in the MoE layers' regrouping)."""
    from tuner.frameworks import RANK_ORDER
    degree = {"tp": layout.tp, "cp": layout.context_parallel, "dp": layout.dp, "pp": layout.pp}
    out, inner = {}, 1
    for dim in RANK_ORDER[framework]:
        out[dim] = inner
        inner *= degree[dim]
    out.setdefault("cp", layout.tp)
    out["ep"] = layout.expert_tensor_parallel
    return out


def placement(layout, workload) -> dict[str, dict]:
    """Where each of `layout`'s groups sits on the workload's cluster: {dim: {size, stride, inside (one
    scale-up domain), bandwidth (GB/s per rank)}} for TP, CP, EP, DP (the d*c ranks sharing weights) and PP
    (a stage boundary), as the costs above charge them."""
    c, st = workload.cluster, strides(layout, workload.framework)
    t, cp, d, p = layout.tp, layout.context_parallel, layout.dp, layout.pp
    groups = {"tp": (t, st["tp"]), "cp": (cp, st["cp"]), "ep": (layout.expert_parallel, st["ep"]),
              "dp": (d * cp, min(st["cp"], st["dp"])), "pp": (p, st["pp"])}
    out = {}
    for dim, (size, stride) in groups.items():
        if dim == "pp":
            bw = pipeline_p2p_bandwidth(c, t * cp, d, p)
            inside = p <= 1 or not leaves_domain(c, p, stride)
        else:
            bw, inside = group_bandwidth(c, size, stride), not leaves_domain(c, size, stride)
        out[dim] = {"size": size, "stride": stride, "inside": inside, "bandwidth_gbps": bw}
    return out
