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
  buckets, communicator buffers, allocator fragmentation and usable capacity, all drawn.

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
"""

from __future__ import annotations

import hashlib
import math
import sys
import zlib
from dataclasses import fields, make_dataclass
from functools import cached_property
from pathlib import Path

import numpy as np

from tuner.layout import Layout
from tuner.space import load_space
from tuner.specs import Workload, make_workload
from tuner.trial import Status, TrialResult, TrialSpec

if str(Path(__file__).resolve().parent) not in sys.path:    # indep_modern.py sits beside this file
    sys.path.insert(0, str(Path(__file__).resolve().parent))

FAMILIES: tuple[str, ...] = ("compute-bound", "network-bound", "host-bound")
WORKLOADS: tuple[tuple[str, int], ...] = (("22b", 2), ("22b", 8), ("175b", 16), ("1t", 128))
#: (model, nodes, cluster, precision) of the worlds of today's dimensions (the default space).
MODERN: tuple[tuple[str, int, str, str], ...] = (
    ("llama3-8b", 4, "h100", "bf16"), ("llama3-8b", 8, "h100", "fp8"),
    ("llama3-70b", 16, "h100", "bf16"), ("llama3-70b", 32, "h100", "fp8"))
GB = 1e9

# parameter -> (low, high) shared by every family; FAMILY_RANGES override some of them. link_quad and
# link_node are drawn as ratios (block of 4 / pair, block of 8 / block of 4): a switch-like node has ~1.
BASE_RANGES: dict[str, tuple[float, float]] = {
    # compute
    "n_cu": (100, 120), "tile": (0, 3.999), "gemm_eta": (0.55, 0.75), "k_half": (32, 256), "wave_exp": (0.2, 0.6),
    "attn_eta": (0.25, 0.45), "attn_block": (0, 1.999), "flash": (0, 1), "hbm_gbps": (1300, 1700),
    "hbm_eta": (0.55, 0.8), "ew_rep": (16, 30), "ew_split": (16, 34), "recompute": (1.0, 1.15),
    # host
    "kernels": (25, 45), "launch_us": (4, 12), "sync_ms": (0.0, 0.05), "mb_ms": (0.5, 2.5), "step_ms": (5, 60),
    # network and overlap
    "link_pair": (120, 200), "link_quad": (0.35, 0.9), "link_node": (0.35, 0.9), "nic_gbps": (60, 120),
    "coll_eta": (0.65, 0.9), "tree_eta": (0.5, 0.8), "lat_intra_us": (3, 10), "lat_inter_us": (8, 20),
    "congestion": (0.0, 0.15), "p2p_exposed": (0.5, 1.0), "p2p_scatter": (0, 1), "dp_overlap": (0.3, 0.8),
    "z3_prefetch": (0.3, 0.8), "zero_eff": (1.0, 1.2), "opt_bytes": (20, 40),
    # memory
    "grad_bytes": (0, 1), "act_rep": (7, 13), "act_split": (16, 28), "logit_bytes": (2, 8), "frag": (1.0, 1.1),
    "ctx_gb": (0.5, 2.5), "bucket_gb": (0.1, 1.0), "comm_buf_gb": (0.05, 0.3), "usable": (0.95, 1.0),
}
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
# Today's dimensions (indep_modern.py), drawn from their own stream. Sources: Korthikanti et al. 2022
# (sequence parallelism, selective recompute), Narayanan et al. 2021 (interleaved 1F1B), ring attention /
# Megatron context parallelism, Transformer Engine FP8, Megatron-Core's communication overlap.
MODERN_RANGES: dict[str, tuple[float, float]] = {
    "sp_coll": (1.0, 1.25),     # SP all-gather + reduce-scatter time / the TP all-reduce they replace
    "sp_overlap": (0.3, 0.9),   # share of SP's all-gather / reduce-scatter hidden under GEMMs (overlapping stack)
    "sel_cost": (1.0, 1.4),     # selective recompute: re-running the attention core, x its forward time
    "sel_save": (0.0, 2.0),     # bytes per token x h it frees with flash attention (buffers, masks, stats)
    "vp_p2p": (1.0, 1.5),       # interleaving: contention of its v-times more pipeline transfers
    "vp_mb": (0.2, 1.0),        # interleaving: per-micro-batch cost of each extra model chunk, x mb_ms
    "cp_eff": (0.7, 0.95),      # CP: attention efficiency of the ring's smaller blocks
    "cp_overlap": (0.5, 1.0),   # CP: share of a ring step's attention that hides its K/V transfer
    "cp_kernels": (2, 6),       # CP: extra launches per ring step
    "cp_buf": (2, 4),           # CP: K/V receive buffers held, x one rank's K and V
    "fp8_speedup": (1.3, 1.9),  # FP8 GEMM rate / bf16
    "fp8_cast": (3.0, 8.0),     # FP8: HBM bytes per element of a cast GEMM input (read, write, amax, transpose)
    "fp8_wcast": (0.0, 1.0),    # FP8: share of micro-batches that re-cast the weights (0: cached)
    "fp8_kernels": (6, 16),     # FP8: extra launches per layer pass (casts, amax, scale updates)
    "fp8_wbytes": (1.0, 2.0),   # FP8: extra bytes per parameter (FP8 weight copy and transpose)
    "fp8_act": (0.7, 1.0),      # FP8: activation memory / bf16 (linear inputs saved in FP8)
    "glu_bytes": (4.0, 10.0),   # SwiGLU: HBM bytes per token x f / t (silu, product and their gradients)
    "mc_overlap": (0.5, 0.95),  # overlapping stack: share of the DP gradient reduce and parameter gather hidden
    "mc_p2p": (0.3, 0.9),       # overlapping stack: share of pipeline p2p hidden
}
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

def _as_dict(self) -> dict:
    return {f.name: getattr(self, f.name) for f in fields(self)}


# The drawn constants of one world: one field per BASE_RANGES and MODERN_RANGES key (tile a (rows, cols)
# pair, flash and p2p_scatter booleans, n_cu, attn_block and grad_bytes integers, the rest floats).
Physics = make_dataclass("Physics", sorted(BASE_RANGES) + sorted(MODERN_RANGES), frozen=True,
                         namespace={"as_dict": _as_dict})


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


# ------------------------------------------------------------------------------------------ compute
def gemm_s(ph: Physics, peak_tflops: float, M: int, N: int, K: int) -> float:
    """Seconds of one M x N x K GEMM: tile and wave quantisation, short-K loss, HBM roofline."""
    tm, tn = ph.tile
    tiles_m, tiles_n = math.ceil(M / tm), math.ceil(N / tn)
    tiles = tiles_m * tiles_n
    q_tile = M * N / (tiles_m * tm * tiles_n * tn)
    q_wave = (tiles / (math.ceil(tiles / ph.n_cu) * ph.n_cu)) ** ph.wave_exp
    rate = peak_tflops * 1e12 * ph.gemm_eta * q_tile * q_wave * K / (K + ph.k_half)
    hbm = 2.0 * (M * K + K * N + M * N) / (ph.hbm_gbps * GB * ph.hbm_eta)
    return max(2.0 * M * N * K / rate, hbm)


def gemm_passes(ph: Physics, peak: float, shapes) -> tuple[float, float]:
    """(forward, backward) seconds of GEMMs given their forward (M, N, K): backward = data + weight grad."""
    fwd = sum(gemm_s(ph, peak, M, N, K) for M, N, K in shapes)
    bwd = sum(gemm_s(ph, peak, M, K, N) + gemm_s(ph, peak, K, N, M) for M, N, K in shapes)
    return fwd, bwd


def attention_s(ph: Physics, w: Workload, b: int, t: int) -> tuple[float, float]:
    """(forward, backward) seconds of the attention core of one layer."""
    m, peak = w.model, w.cluster.peak_tflops
    s, heads, d = m.seq_length, m.num_attention_heads // t, m.hidden_size // m.num_attention_heads
    hbm = ph.hbm_gbps * GB * ph.hbm_eta
    if ph.flash:
        blocks = b * heads * math.ceil(s / ph.attn_block)
        q_wave = (blocks / (math.ceil(blocks / ph.n_cu) * ph.n_cu)) ** ph.wave_exp
        fwd = 2.0 * b * heads * s * s * d / (peak * 1e12 * ph.attn_eta * q_wave)   # causal: half of 4 b a s^2 d
        return fwd, 2.5 * fwd
    score_gemms = b * heads * (gemm_s(ph, peak, s, s, d) + gemm_s(ph, peak, s, d, s))   # QK^T, PV per head
    scores = 11.0 * b * heads * s * s / hbm                                        # write, softmax, mask, read
    return score_gemms + scores, 2.0 * (score_gemms + scores)


# ------------------------------------------------------------------------------------------ network
def intra_bw(ph: Physics, block: int) -> float:
    return {1: math.inf, 2: ph.link_pair, 4: ph.link_quad}.get(block, ph.link_node)


def group_geometry(ph: Physics, gpn: int, size: int, stride: int) -> tuple[float, float, int]:
    """(per-rank GB/s, latency s, nodes spanned) of a group of `size` ranks `stride` apart."""
    block = size * stride
    if block <= gpn and gpn % block == 0:
        return intra_bw(ph, block), ph.lat_intra_us * 1e-6, 1
    per_node = min(size, gpn // stride) if stride < gpn else 1
    spanned = math.ceil(size / per_node)
    bw = ph.nic_gbps * per_node / gpn / (1.0 + ph.congestion * math.log2(spanned))
    if per_node > 1:
        bw = min(bw, intra_bw(ph, min(per_node * stride, gpn)))
    return bw, ph.lat_inter_us * 1e-6, spanned


def collective_s(ph: Physics, w: Workload, size: int, stride: int, nbytes: float, kind: str) -> float:
    """Seconds of an all-reduce ("ar"), reduce-scatter ("rs") or all-gather ("ag"): the faster of a
    ring and a tree; rs and ag move half of an all-reduce."""
    if size <= 1 or nbytes <= 0:
        return 0.0
    bw, lat, _ = group_geometry(ph, w.cluster.gpus_per_node, size, stride)
    rate = bw * GB * ph.coll_eta
    ring = 2.0 * (size - 1) / size * nbytes / rate + 2.0 * (size - 1) * lat
    tree = 2.0 * nbytes / (rate * ph.tree_eta) + 2.0 * math.ceil(math.log2(size)) * lat
    return min(ring, tree) * (0.5 if kind in ("rs", "ag") else 1.0)


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
    import indep_modern as mod          # the step and memory formulas; it imports this module's primitives
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
        if sps is None:
            cap = self.world.physics.usable * w.cluster.memory_gb
            return TrialResult(Status.OOM, peak_memory_gb=mem,
                               message=f"world OOM: needs {mem:.1f} GB per GPU of {cap:.1f} usable")
        return TrialResult(Status.OK, samples_per_second=sps * self.factor(trial.layout, w.nodes),
                           peak_memory_gb=mem, message="world")

    def cancel(self) -> None:
        pass

    def resources(self, trial: TrialSpec) -> dict[str, float]:
        return {"CPU": 0.1}
