"""Invariants of the performance model over whole plans (issue 25, item 5): the count of violations.

Run: python benchmarks/invariants.py   (deterministic, no seed; about two minutes at stride 1)

Every valid layout of the default space for several workloads and frameworks, dense and mixture-of-experts:
- recomputing more is never faster (each layout against every recompute mode that recomputes at least as much);
- exposing a collective (Megatron-Core without its overlaps) never speeds a layout up;
- a TP group moved out of the NVLink domain (the same layout on nodes of half the GPUs, the same NICs per GPU)
  is never cheaper.
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
from tuner.layout import RECOMPUTE, recomputes_at_least  # noqa: E402
from tuner.perfmodel import predict  # noqa: E402
from tuner.space import load_space, valid_layouts  # noqa: E402
from tuner.specs import make_workload  # noqa: E402

CASES = [("deepseek-v3", "h100", 128, None, "megatron-core"), ("llama3-70b", "h100", 8, 128, "megatron-core"),
         ("gpt-175b", "frontier", 128, None, "megatron-deepspeed"), ("llama3-70b", "h100", 8, 128, "torchtitan"),
         ("qwen3-30b-a3b", "h100", 2, None, "torchtitan"),
         ("mpt-1b", "b300", 2, None, "megatron-core")]    # small GEMMs on a fast GPU: TP collectives outlast them
EXPOSED_CASES = (0, 1, 5)     # Megatron-Core workloads: the overlaps to take away are Megatron-Core's
NVLINK_CASES = (0, 1, 2)
TOL = 1 - 1e-12


def plan(i: int, groups: int | None = None):
    """(workload, {layout: prediction}) for case i's valid layouts: all of them, or all recompute modes of
    `groups` evenly spaced groups of layouts that differ only in recompute."""
    model, cluster, nodes, gb, fw = CASES[i]
    w = make_workload(model, nodes, cluster, gb, framework=fw)
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
    """(layouts whose TP group leaves a half-size node, those that get cheaper there)."""
    half = dataclasses.replace(w.cluster, gpus_per_node=w.cluster.gpus_per_node // 2,
                               inter_node_bandwidth_gbps=w.cluster.inter_node_bandwidth_gbps / 2)
    w2 = dataclasses.replace(w, cluster=half, nodes=2 * w.nodes)
    crossed = [lay for lay in preds if lay.tp > half.gpus_per_node]
    return len(crossed), [lay.key() for lay in crossed
                          if predict(lay, w2).step_time_s < preds[lay].step_time_s * TOL]


def main(argv=None) -> int:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)
    total = 0
    for i, (model, cluster, nodes, _, fw) in enumerate(CASES):
        w, preds = plan(i)
        checks = [("recompute more", recompute_violations(preds))]
        if i in EXPOSED_CASES:
            checks.append(("collective exposed", exposed_violations(w, preds)))
        if i in NVLINK_CASES:
            checks.append(("out of NVLink", nvlink_violations(w, preds)))
        for name, (n, bad) in checks:
            total += len(bad)
            print(f"{model:14s} {cluster:8s} {nodes:4d} nodes {fw:18s} {name:19s} checked {n:7d}  "
                  f"violations {len(bad)}" + (f"  e.g. {bad[:3]}" if bad else ""))
    print(f"invariant violations: {total}")
    return 1 if total else 0


if __name__ == "__main__":
    sys.exit(main())
