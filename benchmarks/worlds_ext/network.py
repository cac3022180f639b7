"""Collective times: measured in-node curves (tables.py), a hierarchical account across nodes.

In a node: the measured bytes/s of the op on a group of its size at that message size (H100: XLA's
sm_90 table; MI250X: the MI300X table times drawn per-group-size link factors, since the MI250X's
Infinity Fabric gives a GCD pair four links, a block of four two, all eight one).
Across nodes, as NCCL's hierarchical algorithms do: the in-node part on the ranks of the group that share
a node, then the inter-node ring on 1/r of the bytes at the node's injection bandwidth shared by every
GPU of the node that talks at the same time (gpn), with a drawn efficiency, a latency per ring step and
a congestion factor growing with the nodes spanned. All-to-all across nodes: the off-node share of the
bytes at the same per-GPU injection share, times a drawn all-to-all efficiency.
"""

from __future__ import annotations

import math

from worlds_ext import tables

GB = 1e9


def in_node(ph, op: str, size: int, nbytes: float) -> float:
    """Seconds of `op` over `nbytes` on `size` GPUs of one node."""
    if size <= 1 or nbytes <= 0:
        return 0.0
    scale = ph.get(f"link_{min(size, 8)}", 1.0)
    key = nbytes / size if op == "reduce-scatter" else nbytes      # XLA keys a reduce-scatter by its output
    return tables.collective_seconds(ph["hw"], op, size, key) / scale


def ranks_per_node(size: int, stride: int, gpn: int) -> int:
    """How many ranks of a group of `size` ranks `stride` apart share a node."""
    if stride >= gpn:
        return 1
    return max(1, min(size, gpn // stride))


def collective(ph, op: str, nbytes: float, size: int, stride: int, gpn: int, concurrent: int | None = None) -> float:
    """Seconds of `op` ("all-reduce", "all-gather", "reduce-scatter", "all-to-all") over a buffer of
    `nbytes` (the whole tensor: an all-gather's result, a reduce-scatter's input) on a group of `size` ranks
    `stride` apart; `concurrent`: GPUs of a node that use the node's network at the same time (default gpn)."""
    if size <= 1 or nbytes <= 0:
        return 0.0
    r = ranks_per_node(size, stride, gpn)
    if r >= size:
        return in_node(ph, op, size, nbytes)
    nodes = size // r
    share = ph["nic_gbps"] * GB * ph["nic_eff"] / (concurrent or gpn)
    share /= 1.0 + ph["congestion"] * math.log2(nodes)
    lat = ph["lat_inter_us"] * 1e-6
    if op == "all-to-all":
        off = nbytes * (size - r) / size
        return off / (share * ph["a2a_eff"]) + (nodes - 1) * lat + in_node(ph, op, r, nbytes * r / size)
    part = nbytes / r
    ring = (nodes - 1) / nodes * part / share + (nodes - 1) * lat
    if op == "all-reduce":
        return in_node(ph, "reduce-scatter", r, nbytes) + 2 * ring + in_node(ph, "all-gather", r, nbytes)
    inner = "reduce-scatter" if op == "reduce-scatter" else "all-gather"
    return ring + in_node(ph, inner, r, nbytes)


def p2p(ph, nbytes: float, crosses_node: bool, gpn: int) -> float:
    """Seconds of one pipeline send of `nbytes` to the next stage (every GPU of a node sends at once)."""
    if nbytes <= 0:
        return 0.0
    if not crosses_node:
        return in_node(ph, "collective-permute", 2, nbytes)
    share = ph["nic_gbps"] * GB * ph["nic_eff"] / gpn
    return nbytes / share + ph["lat_inter_us"] * 1e-6
