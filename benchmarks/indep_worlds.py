"""Benchmark worlds whose physics is written independently of tuner's performance model.

A world is a drawn set of constants and the formulas below that turn a layout into samples per second or
an out-of-memory. Nothing here imports tuner.perfmodel, tuner.correction or benchmarks/world.py, so a
searcher that trusts the tuner's model gets no help from the world being that model in disguise.

- GEMMs: every (M, N, K) of the forward, data- and weight-gradient products at peak x eta x tile
  quantisation x wave quantisation over the CUs (drawn stream-K softening) x K / (K + k_half), HBM-bound
  when that is slower. Attention: FlashAttention (causal; batch x heads x query blocks over the CUs) or
  materialised scores (s^2 GEMMs, score traffic and memory). Element-wise: HBM bytes per token.
- Host: a layer pass takes the longer of GPU time and kernel launches, plus a host sync; a cost per
  micro-batch and stage, and one per step.
- Collectives: the faster of ring and tree, latency per hop, aligned in-node blocks with their own links,
  node injection shared by the node's groups, congestion growing with log2 of the nodes spanned; pipeline
  p2p partly exposed. 1F1B: step = sum of stage times + (m - 1) x the slowest (embedding on the first
  stage, LM head and loss on the last).
- DP / ZeRO: gradient reduction overlapped with backward by a drawn fraction, ZeRO-2 reduce-scatter per
  micro-batch, ZeRO-3 gathers per layer pass with a drawn prefetch; recompute at a drawn extra cost.
- Memory: model states per ZeRO stage (fp32 or bf16 gradients), 1F1B in-flight activations, logits,
  buckets, communicator buffers, allocator fragmentation and usable capacity, all drawn. A trial runs out of
  memory when all of it exceeds the usable capacity; one that ran reports the bytes its tensors allocated (no
  context, communicator buffers or fragmentation), as a GPU run's max_memory_allocated and every tuner runner do.

Families (FAMILIES): "compute-bound" (GEMM shape, tile and wave effects dominate; fast network, light
host), "network-bound" (slow, congested, high-latency network, little overlap), "host-bound" (heavy
per-kernel, per-micro-batch and per-step costs, poor overlap). Constants depend on (family, model,
cluster, seed), never on the node count: the same seed at 2N nodes is the same physics.

Today's dimensions (sequence and context parallelism, interleaved stages, selective recompute, FP8) and
Llama models (GQA, SwiGLU, untied head) on H100 are in benchmarks/indep_modern.py, which also holds the
step and memory formulas above; with those dimensions off, a GPT model on Frontier gets the formulas of
the Frontier-only worlds unchanged. Their drawn constants (MODERN_RANGES) come from a second random
stream, so the constants above are those the Frontier-only worlds drew for the same seed. The worlds of
WORKLOADS search the Frontier study's space ("frontier-2023"), those of MODERN the default space.
The constants' fields and the primitive costs (GEMM, attention, collectives) are benchmarks/indep_physics.py,
which this module and indep_modern.py both import (this module -> indep_modern -> indep_physics).
"""

from __future__ import annotations

import hashlib
import math
import sys
import zlib
from functools import cached_property
from pathlib import Path

import numpy as np

from tuner.layout import Layout
from tuner.space import load_space
from tuner.specs import Workload, make_workload
from tuner.trial import Status, TrialResult, TrialSpec

if str(Path(__file__).resolve().parent) not in sys.path:    # indep_modern.py sits beside this file
    sys.path.insert(0, str(Path(__file__).resolve().parent))

import indep_modern as mod  # noqa: E402  the step and memory formulas
from pytorch_oom import oom_message  # noqa: E402
from indep_physics import (BASE_RANGES, GB, MODERN_RANGES, Physics, attention_s, collective_s,  # noqa: E402,F401
                           gemm_passes, gemm_s, group_geometry, intra_bw)

FAMILIES: tuple[str, ...] = ("compute-bound", "network-bound", "host-bound")
WORKLOADS: tuple[tuple[str, int], ...] = (("22b", 2), ("22b", 8), ("175b", 16), ("1t", 128))
#: (model, nodes, cluster, precision) of the worlds of today's dimensions (the default space).
MODERN: tuple[tuple[str, int, str, str], ...] = (
    ("llama3-8b", 4, "h100", "bf16"), ("llama3-8b", 8, "h100", "fp8"),
    ("llama3-70b", 16, "h100", "bf16"), ("llama3-70b", 32, "h100", "fp8"))
# Per family: the ranges that override BASE_RANGES (indep_physics.py, which holds the drawn constants' fields
# and the primitive costs that read them).
FAMILY_RANGES: dict[str, dict[str, tuple[float, float]]] = {
    "compute-bound": {"tile": (1, 3.999), "gemm_eta": (0.6, 0.85), "k_half": (128, 768), "wave_exp": (0.7, 1.0),
                      "n_cu": (104, 120), "nic_gbps": (150, 250), "link_node": (0.5, 1.0), "link_quad": (0.5, 1.0),
                      "lat_inter_us": (3, 8), "mb_ms": (0.2, 1.0), "step_ms": (2, 20), "launch_us": (2, 6),
                      "dp_overlap": (0.6, 0.95), "attn_eta": (0.15, 0.45)},
    "network-bound": {"nic_gbps": (20, 50), "link_node": (0.25, 0.7), "link_quad": (0.3, 0.8), "link_pair": (80, 150),
                      "coll_eta": (0.45, 0.7), "lat_intra_us": (8, 25), "lat_inter_us": (20, 80),
                      "congestion": (0.15, 0.6), "dp_overlap": (0.0, 0.4), "p2p_exposed": (0.8, 1.0),
                      "z3_prefetch": (0.0, 0.4), "zero_eff": (1.1, 1.5)},
    "host-bound": {"mb_ms": (30.0, 120.0), "step_ms": (500, 3000), "launch_us": (60, 160), "kernels": (35, 60),
                   "sync_ms": (0.5, 2.5), "dp_overlap": (0.0, 0.2), "z3_prefetch": (0.0, 0.2),
                   "p2p_exposed": (0.9, 1.0), "opt_bytes": (40, 90)},
}
# Hardware other than Frontier's MI250X GCDs (whose ranges are those above): datasheet-anchored ranges
# per cluster, and per family where the family is about that hardware. H100 SXM: 132 SMs, 3.35 TB/s HBM3,
# NVLink 4 at 450 GB/s per direction through NVSwitch (every block size alike), 8 x 400 Gb/s NICs.
HARDWARE_RANGES: dict[str, dict[str, tuple[float, float]]] = {
    # flash < P_FLASH always: Transformer Engine's fused attention (8K-token scores would not fit anyway)
    "h100": {"flash": (0, 0.5), "n_cu": (132, 132.5), "hbm_gbps": (2900, 3350), "hbm_eta": (0.7, 0.9),
             "link_pair": (300, 450),
             "link_quad": (0.85, 1.0), "link_node": (0.85, 1.0), "nic_gbps": (250, 400), "lat_intra_us": (2, 6),
             "lat_inter_us": (5, 15)},
}
HARDWARE_FAMILY: dict[str, dict[str, dict[str, tuple[float, float]]]] = {
    "h100": {"compute-bound": {"nic_gbps": (340, 400), "link_pair": (380, 450), "lat_inter_us": (3, 8)},
             "network-bound": {"nic_gbps": (80, 200), "link_pair": (200, 350), "link_quad": (0.7, 1.0),
                               "link_node": (0.6, 1.0), "lat_intra_us": (5, 15), "lat_inter_us": (15, 50)}},
}
# Today's dimensions (indep_modern.py) per family, drawn from their own stream (MODERN_RANGES:
# indep_physics.py).
MODERN_FAMILY: dict[str, dict[str, tuple[float, float]]] = {
    "compute-bound": {"fp8_speedup": (1.4, 1.9), "mc_overlap": (0.7, 0.98), "cp_overlap": (0.7, 1.0)},
    "network-bound": {"sp_overlap": (0.1, 0.6), "sp_coll": (1.1, 1.4), "cp_overlap": (0.2, 0.7),
                      "mc_overlap": (0.2, 0.6), "mc_p2p": (0.0, 0.5), "vp_p2p": (1.2, 2.0), "cp_eff": (0.6, 0.85)},
    "host-bound": {"vp_mb": (0.6, 1.5), "fp8_kernels": (12, 30), "cp_kernels": (4, 12), "mc_overlap": (0.2, 0.7),
                   "fp8_speedup": (1.3, 1.6)},
}
TILES = ((128, 128), (256, 128), (128, 256), (256, 256))
ATTN_BLOCKS = (64, 128)
P_FLASH = 0.8
P_FP32_GRADS = 0.3


#: The search space of the worlds of WORKLOADS (GPT on Frontier): the Frontier study's dimensions.
SPACE = "frontier-2023"
#: ... and of the worlds of MODERN (and of any other cluster): today's dimensions.
MODERN_SPACE = "default"


def draw_physics(family: str, model_name: str, seed: int, cluster: str = "frontier") -> Physics:
    """The constants of (family, model, cluster, seed): uniform draws from the family's ranges (and the
    cluster's hardware ranges away from Frontier); today's dimensions from a second stream."""
    if family not in FAMILIES:
        raise ValueError(f"unknown family '{family}'; families: {', '.join(FAMILIES)}")
    if cluster != "frontier" and cluster not in HARDWARE_RANGES:
        raise ValueError(f"no hardware ranges for cluster '{cluster}'; clusters: frontier, {', '.join(HARDWARE_RANGES)}")
    key = [FAMILIES.index(family), zlib.crc32(model_name.encode()), int(seed)]
    if cluster != "frontier":
        key.append(zlib.crc32(cluster.encode()))
    rng, rng2 = np.random.default_rng(key), np.random.default_rng(key + [2])
    ranges = {**BASE_RANGES, **FAMILY_RANGES[family], **HARDWARE_RANGES.get(cluster, {}),
              **HARDWARE_FAMILY.get(cluster, {}).get(family, {})}
    raw = {k: float(rng.uniform(*ranges[k])) for k in sorted(ranges)}
    modern = {**MODERN_RANGES, **MODERN_FAMILY[family]}
    raw.update({k: float(rng2.uniform(*modern[k])) for k in sorted(modern)})
    quad = raw["link_pair"] * raw["link_quad"]          # in-node blocks of 4 and 8: a fraction of the pair's
    return Physics(**{**raw, "link_quad": quad, "link_node": quad * raw["link_node"], "n_cu": int(raw["n_cu"]),
                      "tile": TILES[int(raw["tile"])], "attn_block": ATTN_BLOCKS[int(raw["attn_block"])],
                      "flash": raw["flash"] < P_FLASH, "p2p_scatter": raw["p2p_scatter"] < 0.5,
                      "grad_bytes": 4 if raw["grad_bytes"] < P_FP32_GRADS else 2})


# ------------------------------------------------------------------------------------------ worlds
class World:
    """One drawn world for one workload: truth per layout, its optimum, and a runner."""

    def __init__(self, family: str, model: str, nodes: int, seed: int, cluster: str = "frontier",
                 precision: str = "bf16", space: str | None = None):
        self.workload = make_workload(model, nodes, cluster, precision=precision)
        self.family, self.seed = family, int(seed)
        self.physics = draw_physics(family, self.workload.model.name, seed, self.workload.cluster.name)
        self.space = space or (SPACE if cluster == "frontier" and precision == "bf16" else MODERN_SPACE)
        where = "" if cluster == "frontier" else f" {cluster}"
        self.name = f"{family}/{model}@{nodes}n{where}{'' if precision == 'bf16' else ' ' + precision}/s{seed}"
        self._truth: dict[Layout, tuple[float | None, float]] = {}

    @cached_property
    def candidates(self) -> list[Layout]:
        return load_space(self.space).enumerate_layouts(self.workload)

    def truth(self, layout: Layout) -> tuple[float | None, float]:
        """(samples per second, or None when it does not fit; peak memory GB per GPU) of `layout`."""
        if layout not in self._truth:
            self._truth[layout] = evaluate(self.physics, self.workload, layout)
        return self._truth[layout]

    def optimum(self) -> tuple[Layout, float]:
        """The fastest candidate that really runs, and its samples per second."""
        runs = [(v, lay) for lay in self.candidates if (v := self.truth(lay)[0]) is not None]
        if not runs:
            raise ValueError(f"{self.name}: no candidate layout fits in memory")
        v, lay = max(runs, key=lambda p: (p[0], p[1]))
        return lay, v

    def runner(self, noise: float = 0.02, seed: int = 0) -> "WorldRunner":
        return WorldRunner(self, noise, seed)


def evaluate(ph: Physics, w: Workload, layout: Layout) -> tuple[float | None, float]:
    """(samples per second or None when out of memory, peak GB per GPU) of a layout in a world."""
    mem = mod.peak_memory_gb(ph, w, layout)
    if mem > ph.usable * w.cluster.memory_gb:
        return None, mem
    return w.global_batch / mod.step_s(ph, w, layout), mem


def draw_world(family: str, model: str, nodes: int, seed: int, cluster: str = "frontier",
               precision: str = "bf16", space: str | None = None) -> World:
    """The world of (family, workload, seed); the space: frontier-2023 for bf16 on Frontier, else default."""
    return World(family, model, nodes, seed, cluster, precision, space)


class WorldRunner:
    """The world behind the runner protocol; multiplicative log-normal noise seeded by (seed, layout)."""

    name = "world"
    measured = True

    def __init__(self, world: World, noise: float = 0.02, seed: int = 0):
        self.world, self.noise, self.seed = world, float(noise), int(seed)

    def factor(self, layout: Layout, nodes: int) -> float:
        digest = hashlib.sha256(f"{self.world.family}:{self.seed}:{nodes}:{layout.key()}".encode()).digest()
        z = np.random.default_rng(int.from_bytes(digest[:8], "little")).standard_normal()
        return math.exp(self.noise * z)

    def run(self, trial: TrialSpec) -> TrialResult:
        w = trial.workload
        if w == self.world.workload:
            sps, mem = self.world.truth(trial.layout)
        else:   # another node count of the same model: the same physics
            sps, mem = evaluate(self.world.physics, w, trial.layout)
        if sps is None:     # PyTorch's message, which says what the process had (tuner reads it), not the need
            ph = self.world.physics
            outside = mem - mod.peak_memory_gb(ph, w, trial.layout, reserved=True)   # context, communicator buffers
            return TrialResult(Status.OOM, peak_memory_gb=mem, message=oom_message(
                w.cluster.memory_gb, ph.usable * w.cluster.memory_gb, mem, outside,
                f"indep-oom:{self.world.family}:{self.seed}:{w.nodes}:{trial.layout.key()}",
                rocm=w.cluster.software == "rocm"))
        allocated = mod.peak_memory_gb(self.world.physics, w, trial.layout, allocated=True)  # as a GPU run reports
        reserved = mod.peak_memory_gb(self.world.physics, w, trial.layout, reserved=True)    # its own fragmentation
        return TrialResult(Status.OK, samples_per_second=sps * self.factor(trial.layout, w.nodes),
                           peak_memory_gb=allocated, peak_reserved_gb=reserved, message="world")

    def cancel(self) -> None:
        pass

    def resources(self, trial: TrialSpec) -> dict[str, float]:
        return {"CPU": 0.1}
