"""The fixed cost per training step beyond the compute and collectives the model counts (predict's `step_overhead`).

It is the cluster file's step_overhead_ms: 0 in every preset, set where `tuner calibrate` measured it from real runs
of the harness on that machine. A framework's own floor was built from Megatron-LM's CI runs and NOT applied (it made
some families worse, issues 25 / 26): benchmarks/step_floor.py holds it as a model variant, through this function.
"""

from __future__ import annotations


def step_floor_s(framework: str, cluster) -> float:
    """Seconds a step of `framework` costs on `cluster` beyond predict's other terms: the cluster's measured
    step_overhead_ms (the same for every framework)."""
    return cluster.step_overhead_ms * 1e-3
