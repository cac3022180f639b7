"""Goodput: the share of a training run's wall time that trains, once checkpoints, failures and restarts
are paid for; and the cluster's power for the energy of a run. Pure (no I/O; imports nothing of tuner).

- Failures: every node fails on its own at rate 1 / node_mtbf_hours (exponential), so a job of n nodes
  fails every M = node_mtbf_hours / n hours on average: 24 n / node_mtbf_hours failures a day.
- Checkpoint: what a restart needs, parameters x CHECKPOINT_BYTES of the framework (weights and the
  optimizer's state), written at the file system's bandwidth the job can reach: at most
  filesystem_bandwidth_gbps, and at most the nodes' injection bandwidth (inter_node_bandwidth_gbps each).
  Training waits for the write (delta = the write): an asynchronous save (Megatron-Core --async-save,
  torchtitan's async_mode) hides most of it, so this is the cautious side.
- Interval: Daly's higher-order optimum (J. T. Daly, "A higher order estimate of the optimum checkpoint
  interval for restart dumps", Future Generation Computer Systems 22(3), 2006, eq. 37) of Young's
  tau = sqrt(2 delta M) (J. W. Young, "A first order approximation to the optimum checkpoint interval",
  CACM 17(9), 1974); tau = M when delta >= 2M.
- Restart: restart_minutes (scheduling, process start, communicator setup) plus reading the checkpoint
  back at the same bandwidth.
- Wall time: Daly's expected completion time with exponential failures (eq. 20),
  T_wall = M e^(R/M) (e^((tau + delta)/M) - 1) T_solve / tau, so goodput = T_solve / T_wall.

A cluster file may give its own figures in an [operations] table (OPERATION_KEYS); those it leaves out
come from PRESET_DEFAULTS (by cluster name) or DEFAULTS, each with its source. Energy is node_power_kw x
nodes x wall time: the node's maximum input power, so an upper bound of the IT energy (no cooling, PUE 1).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

#: The [operations] table of a cluster file: key -> what it is.
OPERATION_KEYS = {
    "node_mtbf_hours": "mean time between failures of one node that stop the job, hours",
    "filesystem_bandwidth_gbps": "checkpoint write (and read) bandwidth the job can reach, GB/s in all",
    "restart_minutes": "minutes from a failure to training again, before the checkpoint is read back",
    "node_power_kw": "a node's maximum input power, kW (energy = this x nodes x wall time)",
}

# Defaults for any cluster: (value, source). Derived figures say how.
DEFAULTS = {
    # Llama 3 (Grattafiori et al., "The Llama 3 Herd of Models", arXiv 2407.21783, 2024), section 3.3.4 and
    # Table 5: 419 unexpected interruptions in a 54-day snapshot of pre-training on 16,384 H100 GPUs (2,048
    # 8-GPU Grand Teton nodes). Derived: 54 d x 24 h x 2,048 nodes / 419 = 6,335 node-hours per interruption.
    "node_mtbf_hours": (6335.0, "Llama 3 paper (arXiv 2407.21783) sec. 3.3.4 / Table 5: 419 unexpected "
                                "interruptions in 54 days on 2,048 8-GPU H100 nodes (54 x 24 x 2048 / 419)"),
    # Llama 3 section 3.3.1: Meta's Tectonic file system, 240 PB on 7,500 SSD servers, 2 TB/s sustained
    # (7 TB/s peak) -- the storage of a large training cluster.
    "filesystem_bandwidth_gbps": (2000.0, "Llama 3 paper sec. 3.3.1: Tectonic, 2 TB/s sustained"),
    "restart_minutes": (10.0, "ESTIMATE: rescheduling, process start and NCCL/RCCL setup of a large job"),
}
#: Per preset cluster (its `name`): figures its operators or vendor published.
PRESET_DEFAULTS = {
    "frontier": {
        # OLCF, "OLCF Releases Storage Specs for Frontier Exascale" (insideHPC, 2021-05): Orion's flash
        # performance tier, 5,400 NVMe devices, 10 TB/s peak read/write.
        "filesystem_bandwidth_gbps": (10000.0, "OLCF Orion (Frontier's Lustre), flash tier: 10 TB/s peak "
                                               "(OLCF storage specs, insideHPC 2021-05)"),
        # TOP500 June 2022: Frontier's HPL run at 21,100 kW on 9,408 nodes. Derived: 21,100 / 9,408.
        "node_power_kw": (2.24, "TOP500 June 2022: Frontier 21,100 kW on 9,408 nodes (21100 / 9408)"),
    },
    "h100": {"node_power_kw": (10.2, "NVIDIA DGX H100/H200 user guide: maximum system power 10.2 kW")},
    "h200": {"node_power_kw": (10.2, "NVIDIA DGX H100/H200 user guide: maximum system power 10.2 kW")},
    "a100": {"node_power_kw": (6.5, "NVIDIA DGX A100 datasheet: system power 6.5 kW max")},
    "b200": {"node_power_kw": (14.3, "NVIDIA DGX B200 datasheet: system power ~14.3 kW max")},
}
#: Checkpoint bytes per parameter: Megatron-Core's and Megatron-DeepSpeed's checkpoints hold the bf16
#: weights (2) and the optimizer's fp32 main parameters and two Adam moments (4 + 8; Megatron-LM
#: docs/user-guide/features/dist_optimizer.md: "optimizer steps always use fp32 main parameters");
#: torchtitan (FSDP2) keeps fp32 parameters (4) and the two moments (8).
CHECKPOINT_BYTES = {"megatron-core": 14.0, "megatron-deepspeed": 14.0, "torchtitan": 12.0}


def check_operations(table: dict | None, where: str) -> None:
    """Refuse an [operations] table with an unknown key or a value that is not a positive number."""
    from tuner.errors import SpecError
    for k, v in (table or {}).items():
        if k not in OPERATION_KEYS:
            raise SpecError(f"{where}: unknown [operations] key {k!r}; valid keys: {', '.join(OPERATION_KEYS)}")
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < float("inf"):
            raise SpecError(f"{where}: [operations] key '{k}' must be a number > 0, got {v!r}")


def operation(cluster, key: str) -> tuple[float | None, str]:
    """(value, where it comes from) of an [operations] key for `cluster`: its file, its preset's published
    figure, the default, or (None, why) where there is none (node power of a cluster nobody published)."""
    own = (getattr(cluster, "operations", None) or {}).get(key)
    if own is not None:
        return float(own), f"cluster {cluster.name}'s [operations]"
    if key in PRESET_DEFAULTS.get(cluster.name, {}):
        return PRESET_DEFAULTS[cluster.name][key]
    if key in DEFAULTS:
        return DEFAULTS[key]
    return None, f"not known for cluster {cluster.name}: give {key} in its [operations] table"


@dataclass(frozen=True)
class Goodput:
    """What failures and checkpoints cost a job of `nodes` nodes."""

    nodes: int
    failures_per_day: float
    checkpoint_gb: float
    write_s: float               # the checkpoint's write, which training waits for
    interval_s: float            # training time between checkpoints (Daly's optimum)
    restart_s: float             # from a failure to training again, the checkpoint read included
    fraction: float              # goodput: training time / wall time (0 < fraction <= 1)
    basis: dict                  # key -> source of each figure used

    def as_dict(self) -> dict:
        return {"failures_per_day": self.failures_per_day, "checkpoint_gb": self.checkpoint_gb,
                "checkpoint_write_s": self.write_s, "checkpoint_interval_s": self.interval_s,
                "restart_s": self.restart_s, "goodput": self.fraction}


def daly_interval(delta: float, mtbf: float) -> float:
    """Daly's (2006) optimum compute time between checkpoints for a checkpoint cost `delta` and a job MTBF."""
    if delta >= 2.0 * mtbf:
        return mtbf
    x = delta / (2.0 * mtbf)
    return math.sqrt(2.0 * delta * mtbf) * (1.0 + math.sqrt(x) / 3.0 + x / 9.0) - delta


def wall_fraction(tau: float, delta: float, restart: float, mtbf: float) -> float:
    """T_solve / T_wall of Daly's (2006) expected completion time with exponential failures."""
    exponent = restart / mtbf + math.log(math.expm1((tau + delta) / mtbf))
    return tau / (mtbf * math.exp(exponent)) if exponent < 700 else 0.0


def goodput(parameters: float, framework: str, cluster, nodes: int) -> Goodput:
    """The goodput of training a model of `parameters` with `framework` on `nodes` nodes of `cluster`
    (a ClusterSpec: name, gpus_per_node, inter_node_bandwidth_gbps and its [operations] table)."""
    mtbf_node, b_mtbf = operation(cluster, "node_mtbf_hours")
    fs, b_fs = operation(cluster, "filesystem_bandwidth_gbps")
    restart_min, b_restart = operation(cluster, "restart_minutes")
    mtbf = mtbf_node * 3600.0 / nodes
    size_gb = parameters * CHECKPOINT_BYTES.get(framework, 14.0) / 1e9
    bandwidth = min(fs, nodes * cluster.inter_node_bandwidth_gbps)
    write = size_gb / bandwidth
    restart = restart_min * 60.0 + write                 # read back at the bandwidth it was written at
    tau = daly_interval(write, mtbf)
    basis = {"node_mtbf_hours": (mtbf_node, b_mtbf), "filesystem_bandwidth_gbps": (fs, b_fs),
             "restart_minutes": (restart_min, b_restart)}
    return Goodput(nodes, 24.0 * nodes / mtbf_node, size_gb, write, tau, restart,
                   wall_fraction(tau, write, restart, mtbf), basis)
