"""A world that differs from the performance model: the simulator with perturbed constants, physics the
model lacks, a memory estimate that is off, and seeded noise. Used by benchmarks/search_efficiency.py.

As a trial command (the command runner's protocol: reads $TUNER_TRIAL_JSON, writes $TUNER_RESULT_JSON):

    python benchmarks/world.py --perturb '{"matmul_efficiency": 0.7, "activation_memory": 1.3, "seed": 1}'

Perturbation keys:
- any numeric cluster constant (matmul_efficiency, gemm_knee_gflop, inter_node_bandwidth_gbps,
  intra_node_bandwidth_gbps, microbatch_overhead_ms, memory_reserved_gb, latency_us, ...): a
  multiplier on the cluster file's value (efficiencies capped at 1);
- activation_memory: multiplier on activations and logits in the world's peak memory;
- pp_penalty: the step takes (1 + pp_penalty * log2 pp) longer (e.g. stage imbalance the model lacks);
- tp_penalty: the same for log2 tp (e.g. kernel launch gaps of small GEMMs beyond the knee);
- zero_penalty: the step takes (1 + zero_penalty * zero_stage) longer;
- slow: {"tp2": 1.2, "pp16": 1.1, "mb1": 1.1, "z0": 1.05, "ac0": 1.1, "dp32": 1.1}: the step of every layout
  with that value takes that factor longer (a kernel, collective or schedule the model knows nothing of);
- noise: relative sd of the measured throughput (default 0.02), drawn from (seed, layout).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import os
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tuner import metrics  # noqa: E402
from tuner.layout import Layout  # noqa: E402
from tuner.perfmodel import predict  # noqa: E402
from tuner.specs import ModelSpec, Workload, load_cluster  # noqa: E402
from tuner.trial import Status, TrialResult  # noqa: E402

FIXED = {"name", "gpus_per_node", "peak_tflops", "memory_gb", "flash_attention", "group_bandwidth_gbps", "slurm"}
EFFICIENCIES = {"matmul_efficiency", "attention_efficiency", "memory_bandwidth_efficiency", "network_efficiency"}
EXTRA = {"activation_memory", "pp_penalty", "tp_penalty", "zero_penalty", "slow", "noise", "seed"}
SLOW_KEYS = {"tp": "tp", "pp": "pp", "dp": "dp", "mb": "micro_batch", "z": "zero_stage", "ac": "activation_checkpointing"}


def perturbed_workload(workload: Workload, perturb: dict) -> Workload:
    c = workload.cluster
    changes = {}
    for k, v in perturb.items():
        if k in EXTRA:
            continue
        if k in FIXED or not hasattr(c, k):
            raise ValueError(f"cannot perturb '{k}'; perturb a numeric cluster constant or one of {sorted(EXTRA)}")
        new = getattr(c, k) * float(v)
        changes[k] = min(new, 1.0) if k in EFFICIENCIES else new
    if "intra_node_bandwidth_gbps" in perturb and c.group_bandwidth_gbps:
        f = float(perturb["intra_node_bandwidth_gbps"])
        changes["group_bandwidth_gbps"] = {g: bw * f for g, bw in c.group_bandwidth_gbps.items()}
    return dataclasses.replace(workload, cluster=dataclasses.replace(c, **changes))


def truth(layout: Layout, workload: Workload, perturb: dict) -> tuple[float | None, float]:
    """The world's noise-free MFU (None: out of memory) and its peak memory (GB)."""
    w = perturbed_workload(workload, perturb)
    p = predict(layout, w)
    mem = p.memory_breakdown
    extra = (float(perturb.get("activation_memory", 1.0)) - 1.0) * (mem.get("activations", 0.0) + mem.get("logits", 0.0))
    peak = p.memory_gb + extra
    if peak > workload.cluster.memory_gb:
        return None, peak
    slow = (1 + float(perturb.get("pp_penalty", 0.0)) * math.log2(layout.pp)) \
        * (1 + float(perturb.get("tp_penalty", 0.0)) * math.log2(layout.tp)) \
        * (1 + float(perturb.get("zero_penalty", 0.0)) * layout.zero_stage)
    for key, factor in (perturb.get("slow") or {}).items():
        dim = key.rstrip("0123456789")
        if int(getattr(layout, SLOW_KEYS[dim])) == int(key[len(dim):]):
            slow *= float(factor)
    return p.mfu / slow, peak


def measure(layout: Layout, workload: Workload, perturb: dict) -> TrialResult:
    """One trial in the world: the truth with seeded noise, or an OOM."""
    value, peak = truth(layout, workload, perturb)
    if value is None:
        return TrialResult(Status.OOM, peak_memory_gb=None, message=f"world OOM: needs {peak:.1f} GB")
    digest = hashlib.sha256(f"{perturb.get('seed', 0)}:{workload.nodes}:{layout.key()}".encode()).digest()
    rnd = random.Random(digest)
    f = max(0.05, 1.0 + rnd.gauss(0.0, float(perturb.get("noise", 0.02))))
    sps = value * f / metrics.mfu(1.0, workload)
    return metrics.complete(TrialResult(Status.OK, samples_per_second=sps, peak_memory_gb=peak * (1 + rnd.gauss(0.0, 0.005)),
                                        message="world"), workload, layout)


class WorldRunner:
    """The world in-process, behind the runner protocol (run(trial) -> TrialResult)."""

    name = "world"
    measured = True

    def __init__(self, perturb: dict):
        self.perturb = dict(perturb)

    def run(self, trial) -> TrialResult:
        return measure(trial.layout, trial.workload, self.perturb)

    def cancel(self) -> None:
        pass


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--perturb", default="{}", help="JSON object of perturbations (see the module docstring)")
    args = ap.parse_args(argv)
    spec = json.loads(Path(os.environ["TUNER_TRIAL_JSON"]).read_text())
    workload = Workload(ModelSpec.from_dict(spec["model"]), load_cluster(spec["cluster"]), int(spec["nodes"]),
                        int(spec["global_batch"]))
    r = measure(Layout.from_dict(spec["layout"]), workload, json.loads(args.perturb))
    out = {"status": r.status.value, "message": r.message}
    if r.status == Status.OK:
        out.update(samples_per_second=r.samples_per_second, peak_memory_gb=r.peak_memory_gb)
    else:
        print("world: out of memory", file=sys.stderr)
    Path(os.environ["TUNER_RESULT_JSON"]).write_text(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
