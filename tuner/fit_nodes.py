"""How many nodes a workload that fits nowhere needs: "use more nodes" with the number. Pure."""

from __future__ import annotations

from dataclasses import replace

from tuner.errors import UsageError
from tuner.specs import MAX_INT, Workload

MAX_DOUBLINGS = 12          # 4096 times the nodes asked for: past that, more nodes is not the fix


def fewest_nodes(workload: Workload, space=None) -> tuple[int, object] | None:
    """(nodes, the prediction of its smallest layout that fits) for the fewest node count, doubling from the
    workload's, at which a valid layout of `space` (default: the shipped default space) fits in memory with
    the probability a recommendation needs (perfmodel.keeps_headroom: p_fit >= RECOMMEND_AT); None when
    none does within MAX_DOUBLINGS (or the global batch runs out)."""
    from tuner.perfmodel import keeps_headroom, predict
    from tuner.space import load_space, valid_layouts
    space = space if space is not None else load_space()
    nodes = workload.nodes
    for _ in range(MAX_DOUBLINGS):
        nodes *= 2
        if nodes * workload.cluster.gpus_per_node > MAX_INT:
            return None
        w = replace(workload, nodes=nodes)
        try:
            layouts = valid_layouts(space, w)
        except UsageError:         # no layout at all there (the global batch cannot be split that wide)
            return None
        fitting = [p for p in (predict(lay, w) for lay in layouts) if keeps_headroom(p, w)]
        if fitting:
            return nodes, min(fitting, key=lambda p: p.memory_gb)
    return None


def more_nodes_hint(workload: Workload, space=None) -> str:
    """'use more nodes: 8 is the fewest ...', the fix a workload that fits on no layout needs."""
    found = fewest_nodes(workload, space)
    if found is None:
        return (f"use more nodes (none up to {workload.nodes << MAX_DOUBLINGS} fits either: use a smaller model, "
                "a smaller --global-batch or GPUs with more memory)")
    nodes, p = found
    return (f"use more nodes: {nodes} is the fewest (doubling from {workload.nodes}) at which a layout fits "
            f"({p.layout.key()}: {p.memory_gb:.1f} of {workload.cluster.memory_gb:.1f} GB per GPU, p_fit "
            f"{p.p_fit:.2f}): --nodes {nodes}")
