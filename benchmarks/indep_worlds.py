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
per-kernel, per-micro-batch and per-step costs, poor overlap). Constants depend on (family, model, seed),
never on the node count: the same seed at 2N nodes is the same physics.
"""

from __future__ import annotations

import hashlib
import math
import zlib
from dataclasses import fields, make_dataclass
from functools import cached_property

import numpy as np

from tuner.layout import Layout
from tuner.space import load_space
from tuner.specs import Workload, make_workload
from tuner.trial import Status, TrialResult, TrialSpec

FAMILIES: tuple[str, ...] = ("compute-bound", "network-bound", "host-bound")
WORKLOADS: tuple[tuple[str, int], ...] = (("22b", 2), ("22b", 8), ("175b", 16), ("1t", 128))
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
TILES = ((128, 128), (256, 128), (128, 256), (256, 256))
ATTN_BLOCKS = (64, 128)
P_FLASH = 0.8
P_FP32_GRADS = 0.3


#: The search space of these worlds: the Frontier study's dimensions (no sp, cp, vp, selective recompute).
SPACE = "frontier-2023"

def _as_dict(self) -> dict:
    return {f.name: getattr(self, f.name) for f in fields(self)}


# The drawn constants of one world: one field per BASE_RANGES key (tile a (rows, cols) pair, flash and
# p2p_scatter booleans, n_cu, attn_block and grad_bytes integers, the rest floats).
Physics = make_dataclass("Physics", sorted(BASE_RANGES), frozen=True, namespace={"as_dict": _as_dict})


def draw_physics(family: str, model_name: str, seed: int) -> Physics:
    """The constants of (family, model, seed): uniform draws from the family's ranges."""
    if family not in FAMILIES:
        raise ValueError(f"unknown family '{family}'; families: {', '.join(FAMILIES)}")
    rng = np.random.default_rng([FAMILIES.index(family), zlib.crc32(model_name.encode()), int(seed)])
    ranges = {**BASE_RANGES, **FAMILY_RANGES[family]}
    raw = {k: float(rng.uniform(*ranges[k])) for k in sorted(ranges)}
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


def layer_s(ph: Physics, w: Workload, lay: Layout) -> dict:
    """Seconds of one transformer layer pass on one GPU for one micro-batch: fwd, bwd (with their TP
    all-reduces) and recompute, each the larger of GPU time and host launch time."""
    m, peak, b, t = w.model, w.cluster.peak_tflops, lay.micro_batch, lay.tp
    M, h, f = b * m.seq_length, m.hidden_size, m.ffn_hidden_size
    g_fwd, g_bwd = gemm_passes(ph, peak, ((M, 3 * h // t, h), (M, h, h // t), (M, f // t, h), (M, h, f // t)))
    a_fwd, a_bwd = attention_s(ph, w, b, t)
    ew = M * h * (ph.ew_rep + ph.ew_split / t) / (ph.hbm_gbps * GB * ph.hbm_eta)
    ar = 2 * collective_s(ph, w, t, 1, 2.0 * M * h, "ar")
    host, sync = ph.kernels * ph.launch_us * 1e-6, ph.sync_ms * 1e-3
    fwd = max(g_fwd + a_fwd + ew + ar, host) + sync
    bwd = max(g_bwd + a_bwd + 2.0 * ew + ar, 2.0 * host) + sync
    return {"fwd": fwd, "bwd": bwd, "rec": fwd * ph.recompute if lay.checkpointing else 0.0}


def ends_s(ph: Physics, w: Workload, lay: Layout) -> tuple[float, float]:
    """Extra seconds per micro-batch of the first stage (embedding) and the last (LM head, loss)."""
    m, peak, b, t = w.model, w.cluster.peak_tflops, lay.micro_batch, lay.tp
    M, h, V = b * m.seq_length, m.hidden_size, m.vocab_size
    hbm = ph.hbm_gbps * GB * ph.hbm_eta
    ar = collective_s(ph, w, t, 1, 2.0 * M * h, "ar")
    first = 14.0 * M * h / hbm + ar
    head_f, head_b = gemm_passes(ph, peak, ((M, V // t, h),))
    last = head_f + head_b + 3.0 * ph.logit_bytes * M * V / t / hbm + ar
    return first, last


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


def p2p_s(ph: Physics, w: Workload, lay: Layout) -> float:
    """Exposed seconds of a stage's pipeline sends per micro-batch (activation forward, gradient back)."""
    if lay.pp <= 1:
        return 0.0
    gpn, span = w.cluster.gpus_per_node, lay.tp * lay.dp
    nbytes = 2.0 * lay.micro_batch * w.model.seq_length * w.model.hidden_size / (lay.tp if ph.p2p_scatter else 1)
    if span * lay.pp <= gpn:
        bw, lat = intra_bw(ph, 2 * span), ph.lat_intra_us * 1e-6
    else:
        bw, lat = ph.nic_gbps / min(span, gpn), ph.lat_inter_us * 1e-6
    return ph.p2p_exposed * 2.0 * (nbytes / (bw * GB * ph.coll_eta) + lat)


# ------------------------------------------------------------------------------------------ step
def stage_params(w: Workload, lay: Layout) -> tuple[float, float]:
    """Parameters per GPU on the first and the last stage (tied embedding copy on the last)."""
    m, t = w.model, lay.tp
    h, f, V = m.hidden_size, m.ffn_hidden_size, m.vocab_size
    layers = m.num_layers // lay.pp * ((4 * h * h + 2 * h * f + 4 * h + f) / t + 4 * h)
    emb = V * h / t
    if lay.pp == 1:
        return layers + emb + m.seq_length * h, layers + emb + m.seq_length * h
    return layers + emb + m.seq_length * h, layers + emb


def zero_s(ph: Physics, w: Workload, lay: Layout, params: float, m: int, bwd_mb: float, compute: float) -> float:
    """Exposed seconds per step of the DP / ZeRO collectives."""
    d, t, z = lay.dp, lay.tp, lay.zero_stage
    if d <= 1:
        return 0.0
    grads, weights = params * ph.grad_bytes, params * 2.0
    overlap = ph.dp_overlap * (1.0 if lay.pp == 1 else 0.5)
    if z == 0:
        red = collective_s(ph, w, d, t, grads, "ar")
        return red - min(overlap * red, bwd_mb)
    gather = ph.zero_eff * collective_s(ph, w, d, t, weights, "ag")
    if z == 1:
        red = ph.zero_eff * collective_s(ph, w, d, t, grads, "rs")
        return red - min(overlap * red, bwd_mb) + gather
    red = m * ph.zero_eff * collective_s(ph, w, d, t, grads, "rs")
    exposed = red - min(overlap * red, m * bwd_mb) + gather
    if z == 3:
        passes = 3 if lay.checkpointing else 2
        layers = w.model.num_layers // lay.pp
        g3 = m * passes * (collective_s(ph, w, d, t, weights, "ag") + layers * ph.lat_inter_us * 1e-6)
        exposed += g3 - min(ph.z3_prefetch * g3, compute)
    return exposed


def step_s(ph: Physics, w: Workload, lay: Layout) -> float:
    """Seconds of one training step (global batch) of `lay`."""
    m = w.global_batch // (lay.micro_batch * lay.dp)
    layer = layer_s(ph, w, lay)
    per_layer = layer["fwd"] + layer["bwd"] + layer["rec"]
    body = w.model.num_layers // lay.pp * per_layer + p2p_s(ph, w, lay) + ph.mb_ms * 1e-3
    first, last = ends_s(ph, w, lay)
    stages = [body + first + last] if lay.pp == 1 else [body + first] + [body] * (lay.pp - 2) + [body + last]
    pipe = sum(stages) + (m - 1) * max(stages)
    p_first, p_last = stage_params(w, lay)
    params = max(p_first, p_last)
    bwd_mb = w.model.num_layers // lay.pp * layer["bwd"]
    dp = zero_s(ph, w, lay, params, m, bwd_mb, pipe)
    sync = collective_s(ph, w, 2, lay.tp * lay.dp * (lay.pp - 1), 2.0 * w.model.vocab_size * w.model.hidden_size
                        / lay.tp, "ar") if lay.pp > 1 else 0.0
    owned = params / lay.dp if lay.zero_stage >= 1 else params
    opt = owned * ph.opt_bytes / (ph.hbm_gbps * GB * ph.hbm_eta)
    return pipe + dp + sync + opt + ph.step_ms * 1e-3


# ------------------------------------------------------------------------------------------ memory
def stage_memory_gb(ph: Physics, w: Workload, lay: Layout, last: bool) -> float:
    """Peak GB per GPU on the first (last=False) or the last stage."""
    mo, t, d, z, b = w.model, lay.tp, lay.dp, lay.zero_stage, lay.micro_batch
    m = w.global_batch // (b * d)
    params = stage_params(w, lay)[1 if last else 0]
    states = params * ((2.0 / d if z >= 3 else 2.0) + (ph.grad_bytes / d if z >= 2 else ph.grad_bytes)
                       + (12.0 / d if z >= 1 else 12.0))
    M, h, layers = b * mo.seq_length, mo.hidden_size, mo.num_layers // lay.pp
    full = M * h * (ph.act_rep + ph.act_split / t)
    if not ph.flash:
        full += 5.0 * b * mo.num_attention_heads / t * mo.seq_length ** 2
    if lay.checkpointing:
        per_mb, working = layers * 2.0 * M * h, full
    else:
        per_mb, working = layers * full, 0.0
    in_flight = min(1 if last else lay.pp, m)
    dynamic = in_flight * (per_mb + (2.0 * M * h if lay.pp > 1 else 0.0)) + working
    if last or lay.pp == 1:
        dynamic += ph.logit_bytes * M * mo.vocab_size / t
    buffers = ph.bucket_gb * GB if z >= 1 and d > 1 else 0.0
    if z == 3 and d > 1:
        buffers += 2 * 2.0 * (4 * h * h + 2 * h * mo.ffn_hidden_size) / t
    comms = ph.comm_buf_gb * sum(g > 1 for g in (t, d, lay.pp))
    return (states + buffers + dynamic * ph.frag) / GB + ph.ctx_gb + comms


def peak_memory_gb(ph: Physics, w: Workload, lay: Layout) -> float:
    if lay.pp == 1:
        return stage_memory_gb(ph, w, lay, False)
    return max(stage_memory_gb(ph, w, lay, False), stage_memory_gb(ph, w, lay, True))


# ------------------------------------------------------------------------------------------ worlds
class World:
    """One drawn world for one workload: truth per layout, its optimum, and a runner."""

    def __init__(self, family: str, model: str, nodes: int, seed: int):
        self.workload = make_workload(model, nodes)
        self.family, self.seed = family, int(seed)
        self.physics = draw_physics(family, self.workload.model.name, seed)
        self.name = f"{family}/{model}@{nodes}n/s{seed}"
        self._truth: dict[Layout, tuple[float | None, float]] = {}

    @cached_property
    def candidates(self) -> list[Layout]:
        return load_space(SPACE).enumerate_layouts(self.workload)

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
    if (layout.sequence_parallel, layout.context_parallel, layout.virtual_pipeline) != (False, 1, 1) \
            or layout.recompute == "selective":
        raise ValueError(f"{layout.key()}: these worlds model the Frontier study's dimensions only ({SPACE})")
    mem = peak_memory_gb(ph, w, layout)
    if mem > ph.usable * w.cluster.memory_gb:
        return None, mem
    return w.global_batch / step_s(ph, w, layout), mem


def draw_world(family: str, model: str, nodes: int, seed: int) -> World:
    return World(family, model, nodes, seed)


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
