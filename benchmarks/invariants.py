"""Invariants of the performance model over whole plans (issue 25, item 5): the count of violations.

Run: python benchmarks/invariants.py   (deterministic, no seed; about four minutes at stride 1)

Every valid layout of the default space for several workloads, frameworks, precisions and machines (H100, Frontier,
B200, B300, GB200 NVL72, MI300X, MI355X), dense and mixture-of-experts:
- recomputing more is never faster (each layout against every recompute mode that recomputes at least as much);
- exposing a collective (Megatron-Core without its overlaps) never speeds a layout up;
- a group moved out of the NVLink domain is never cheaper: a TP group leaving a node of half the GPUs (the same
  NICs per GPU), or on an NVL72 rack (a domain of several nodes) any group leaving a domain of half the GPUs.
tests/test_invariants.py runs the same checks on evenly spaced groups of layouts that differ only in recompute
(all of a group's modes, so the first check keeps its pairs); this checks every layout.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tuner import frameworks  # noqa: E402
from tuner.layout import RECOMPUTE, expert_data_parallel, recomputes_at_least  # noqa: E402
from tuner.perfmodel import comm, predict  # noqa: E402
from tuner.space import load_space, valid_layouts  # noqa: E402
from tuner.specs import make_workload  # noqa: E402

CASES = [("deepseek-v3", "h100", 128, None, "megatron-core", "bf16"),
         ("llama3-70b", "h100", 8, 128, "megatron-core", "bf16"),
         ("gpt-175b", "frontier", 128, None, "megatron-deepspeed", "bf16"),
         ("llama3-70b", "h100", 8, 128, "torchtitan", "bf16"), ("qwen3-30b-a3b", "h100", 2, None, "torchtitan", "bf16"),
         ("mpt-1b", "b300", 2, None, "megatron-core", "bf16"),   # small GEMMs on a fast GPU: TP collectives outlast them
         # the 2026 machines: B200 (its NIC on the offload copies' PCIe link, TE's TP-overlap GEMM cost), GB200 NVL72
         # (a domain of 16 trays), a mixture of experts on GB200, AMD's CDNA 3 / 4, torchtitan on B200, B300 in FP8
         ("llama3-70b", "b200", 8, 128, "megatron-core", "fp8"), ("llama3-70b", "gb200", 16, None, "megatron-core", "bf16"),
         ("mixtral-8x7b", "gb200", 4, None, "megatron-core", "fp8"), ("llama3-70b", "mi355x", 8, 128, "megatron-core", "fp8"),
         ("llama3-70b", "mi300x", 8, 128, "megatron-core", "bf16"), ("llama3-70b", "b200", 8, 128, "torchtitan", "bf16"),
         ("llama3-70b", "b300", 8, 128, "megatron-core", "fp8")]
EXPOSED_CASES = (0, 1, 5, 6, 7, 8, 9, 10, 12)     # Megatron-Core workloads: the overlaps to take away are Megatron-Core's
NVLINK_CASES = (0, 1, 2, 6, 7, 8, 9, 11)
TOL = 1 - 1e-12


def plan(i: int, groups: int | None = None):
    """(workload, {layout: prediction}) for case i's valid layouts: all of them, or all recompute modes of
    `groups` evenly spaced groups of layouts that differ only in recompute."""
    model, cluster, nodes, gb, fw, precision = CASES[i]
    w = make_workload(model, nodes, cluster, gb, precision, framework=fw)
    layouts = list(valid_layouts(load_space(), w))
    if groups is not None:
        base = {lay: dataclasses.replace(lay, recompute=RECOMPUTE[0]) for lay in layouts}
        ordered = sorted(set(base.values()), key=lambda lay: lay.key())
        kept = set(ordered[::max(1, len(ordered) // groups)])
        layouts = [lay for lay in layouts if base[lay] in kept]
    return w, {lay: predict(lay, w) for lay in layouts}


def recompute_violations(preds) -> tuple[int, list]:
    """(pairs checked, layouts that recompute more and run faster)."""
    pairs, bad = 0, []
    for lay, p in preds.items():
        for rc in (r for r in RECOMPUTE if r != lay.recompute and recomputes_at_least(r, lay.recompute)):
            more = preds.get(dataclasses.replace(lay, recompute=rc))
            if more is not None:
                pairs += 1
                if more.step_time_s < p.step_time_s * TOL:
                    bad.append((lay.key(), rc))
    return pairs, bad


def exposed_violations(w, preds) -> tuple[int, list]:
    """(layouts checked, layouts that run faster once Megatron-Core overlaps nothing)."""
    saved = frameworks.FRAMEWORKS["megatron-core"]
    frameworks.FRAMEWORKS["megatron-core"] = dataclasses.replace(saved, overlaps=frozenset())
    try:
        bad = [lay.key() for lay, p in preds.items() if predict(lay, w).step_time_s < p.step_time_s * TOL]
    finally:
        frameworks.FRAMEWORKS["megatron-core"] = saved
    return len(preds), bad


def nvlink_violations(w, preds) -> tuple[int, list]:
    """(layouts with a group moved out of the NVLink domain, those that get cheaper there). A domain of one node: the
    same layout on nodes of half the GPUs (the same NICs per GPU), whose TP groups larger than such a node leave it. A
    domain of several nodes (an NVL72 rack's trays): the same nodes in domains of half the GPUs, which every group that
    spanned more than half the domain leaves (groups_leaving)."""
    c = w.cluster
    if c.domain_gpus > c.gpus_per_node:
        w2 = dataclasses.replace(w, cluster=dataclasses.replace(c, scale_up_domain_gpus=max(c.gpus_per_node,
                                                                                          c.domain_gpus // 2)))
        crossed = [lay for lay in preds if groups_leaving(lay, w2) > groups_leaving(lay, w)]
    else:
        half = dataclasses.replace(c, gpus_per_node=c.gpus_per_node // 2,
                                   inter_node_bandwidth_gbps=c.inter_node_bandwidth_gbps / 2)
        w2 = dataclasses.replace(w, cluster=half, nodes=2 * w.nodes)
        crossed = [lay for lay in preds if lay.tp > half.gpus_per_node]
    return len(crossed), [lay.key() for lay in crossed
                          if predict(lay, w2).step_time_s < preds[lay].step_time_s * TOL]


def groups_leaving(lay, w) -> int:
    """How many of a layout's groups span more than one of the workload's scale-up domains: those
    tuner.perfmodel.comm.placement places outside one (TP, CP, EP, the d*c gradient ranks, PP, at the framework's
    strides), and the expert-data-parallel group."""
    e = lay.expert_parallel * lay.expert_tensor_parallel
    return (sum(not g["inside"] for g in comm.placement(lay, w).values())
            + comm.leaves_domain(w.cluster, expert_data_parallel(lay), e))


def main(argv=None) -> int:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)
    total = 0
    for i, (model, cluster, nodes, _, fw, precision) in enumerate(CASES):
        w, preds = plan(i)
        checks = [("recompute more", recompute_violations(preds))]
        if i in EXPOSED_CASES:
            checks.append(("collective exposed", exposed_violations(w, preds)))
        if i in NVLINK_CASES:
            checks.append(("out of NVLink", nvlink_violations(w, preds)))
        for name, (n, bad) in checks:
            total += len(bad)
            print(f"{model:14s} {cluster:8s} {nodes:4d} nodes {precision:4s} {fw:18s} {name:19s} checked {n:7d}  "
                  f"violations {len(bad)}" + (f"  e.g. {bad[:3]}" if bad else ""))
    print(f"invariant violations: {total}")
    return 1 if total else 0


if __name__ == "__main__":
    sys.exit(main())
