"""Communication costs of a layout: collectives, pipeline p2p, and where each group sits.

Pure functions of a layout, a model and a ClusterSpec (docs/reference/formulas.md). Placement follows
Megatron's rank order: TP varies fastest, then CP, then DP, then PP, so

    rank = tp_index + t * (cp_index + c * (dp_index + d * pp_index))

and a group is described by its size and the rank stride between its members (TP: stride 1, CP:
stride t, DP: stride t*c, a PP neighbour: stride t*c*d). Gradients are reduced (and the distributed
optimizer / ZeRO shards its states) over the d*c ranks that hold the same weights: stride t. Every bandwidth and latency comes from the cluster file.

Bandwidth rules (GB/s per rank, before `network_efficiency`):
- A group inside one node gets the bandwidth of the smallest aligned block of GPUs that contains it
  (`ClusterSpec.intra_group_bandwidth(size * stride)`): on Frontier a TP=2 group sits on one MI250X
  (200 GB/s), a block of 4 or 8 GCDs crosses Infinity Fabric links between packages (100 / 50 GB/s).
- A group that leaves the node shares the node's injection bandwidth with the other groups of the
  same kind that cross at the same time: inter_node_bw * (its ranks on the node / GPUs per node).
  Its ring still runs through the in-node links of its ranks on each node, so it also gets no more
  than the intra-node bandwidth of that part.
"""

from __future__ import annotations

from tuner.specs import ClusterSpec

GB = 1e9


def group_bandwidth(cluster: ClusterSpec, size: int, stride: int) -> float:
    """Per-rank bandwidth (GB/s, per direction) of a collective group of `size` ranks, `stride` apart."""
    if size <= 1:
        return float("inf")
    gpn = cluster.gpus_per_node
    block = size * stride
    if block <= gpn and gpn % block == 0:
        return cluster.intra_group_bandwidth(block)
    # The group leaves the node: `k` of its ranks sit on each node it touches.
    k = max(1, min(size, gpn // stride)) if stride < gpn else 1
    share = cluster.inter_node_bandwidth_gbps * k / gpn
    if k > 1:
        share = min(share, cluster.intra_group_bandwidth(min(k * stride, gpn)))
    return share


def crosses_nodes(cluster: ClusterSpec, size: int, stride: int) -> bool:
    """Whether a group of `size` ranks `stride` apart spans more than one node."""
    block = size * stride
    return size > 1 and not (block <= cluster.gpus_per_node and cluster.gpus_per_node % block == 0)


def _bw_bytes(cluster: ClusterSpec, bw_gbps: float) -> float:
    return bw_gbps * GB * cluster.network_efficiency


def allreduce_time(nbytes: float, size: int, bw_gbps: float, cluster: ClusterSpec) -> float:
    """Ring all-reduce of `nbytes` over `size` ranks: 2(g-1)/g * n / bw + 2(g-1) * latency."""
    if size <= 1 or nbytes <= 0:
        return 0.0
    g = size
    return 2.0 * (g - 1) / g * nbytes / _bw_bytes(cluster, bw_gbps) + 2.0 * (g - 1) * cluster.latency_us * 1e-6


def reduce_scatter_time(nbytes: float, size: int, bw_gbps: float, cluster: ClusterSpec) -> float:
    """Ring reduce-scatter (or all-gather) of `nbytes`: half of an all-reduce."""
    return 0.5 * allreduce_time(nbytes, size, bw_gbps, cluster)


allgather_time = reduce_scatter_time


def alltoall_time(cluster: ClusterSpec, nbytes: float, size: int, stride: int) -> float:
    """One all-to-all in which each of `size` ranks, `stride` apart, sends `nbytes` spread evenly over the
    group (1/size of it to itself). The part for ranks on the same node goes over NVLink at the
    intra-node bandwidth; the part for other nodes leaves through the node's injection bandwidth, which
    all GPUs of the node share while their groups exchange at the same time (inter-node / GPUs per
    node each); the two proceed at once, so the slower sets the time; plus one latency per node the
    group spans (the NIC's messages to each remote node)."""
    if size <= 1 or nbytes <= 0:
        return 0.0
    gpn = cluster.gpus_per_node
    local = size if not crosses_nodes(cluster, size, stride) else max(1, min(size, gpn // stride)) if stride < gpn else 1
    intra = nbytes * (local - 1) / size / _bw_bytes(cluster, cluster.intra_node_bandwidth_gbps) if local > 1 else 0.0
    inter = nbytes * (size - local) / size / _bw_bytes(cluster, cluster.inter_node_bandwidth_gbps / gpn)
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


def cp_ring_time(cluster: ClusterSpec, tp: int, cp: int, kv_bytes: float) -> float:
    """One layer's context-parallel ring for one micro-batch pass: cp - 1 steps, each sending this
    rank's K and V chunk (`kv_bytes`) to the next rank of the CP group (stride tp)."""
    if cp <= 1:
        return 0.0
    return (cp - 1) * p2p_time(kv_bytes, group_bandwidth(cluster, cp, tp), cluster)


def pipeline_p2p_bandwidth(cluster: ClusterSpec, tp: int, dp: int, pp: int) -> float:
    """Per-rank bandwidth of the slowest stage boundary (GB/s).

    A stage holds tp*dp consecutive ranks. If the pipeline leaves a node, some boundary crosses the
    network while the node's other ranks do the same, so each rank gets its share of injection
    bandwidth (inter / GPUs per node); otherwise the pair sits in one node block of 2*tp*dp GPUs."""
    if pp <= 1:
        return float("inf")
    gpn = cluster.gpus_per_node
    if tp * dp * pp <= gpn and gpn % (tp * dp * pp) == 0:
        return cluster.intra_group_bandwidth(2 * tp * dp)
    return cluster.inter_node_bandwidth_gbps / gpn


def pipeline_p2p_time(cluster: ClusterSpec, tp: int, dp: int, pp: int, nbytes: float) -> float:
    """Blocking p2p per micro-batch on a stage: one activation send forward, one gradient send back
    (DeepSpeed's pipeline engine does not overlap them with compute)."""
    if pp <= 1:
        return 0.0
    return 2.0 * p2p_time(nbytes, pipeline_p2p_bandwidth(cluster, tp, dp, pp), cluster)


def dp_time(cluster: ClusterSpec, tp: int, dp: int, zero_stage: int, params: float, m: int,
            checkpointing: bool) -> dict:
    """Data-parallel / ZeRO collectives per iteration for a GPU holding `params` parameters (fp16),
    over `dp` ranks `tp` apart (with context parallelism: the d*c ranks sharing weights, stride t).

    ZeRO-0: all-reduce of the gradients once per step (after gradient accumulation; with PP in
    DeepSpeed not overlapped with compute). ZeRO-1: the same reduction, then an all-gather of the
    updated parameters. ZeRO-2: reduce-scatter of the gradients every micro-step, all-gather once.
    ZeRO-3: also all-gathers the parameters in every forward, backward (and recompute)."""
    if dp <= 1:
        return {"grad_reduce": 0.0, "param_gather": 0.0}
    bw = group_bandwidth(cluster, dp, tp)
    n = 2.0 * params
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
