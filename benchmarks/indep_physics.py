"""The physics shared by the independent benchmark worlds: the drawn constants (Physics: one field per
BASE_RANGES and MODERN_RANGES key) and the primitive costs that read them (GEMMs, attention, collectives).

benchmarks/indep_worlds.py draws the constants per family and cluster and holds the worlds;
benchmarks/indep_modern.py composes these primitives into a step time and peak memory. Both import this
module, which imports neither, so the arrows run one way. Nothing here imports tuner.perfmodel.
"""

from __future__ import annotations

import math
from dataclasses import fields, make_dataclass

from tuner.specs import Workload

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


def _as_dict(self) -> dict:
    return {f.name: getattr(self, f.name) for f in fields(self)}


# The drawn constants of one world: one field per BASE_RANGES and MODERN_RANGES key (tile a (rows, cols)
# pair, flash and p2p_scatter booleans, n_cu, attn_block and grad_bytes integers, the rest floats).
Physics = make_dataclass("Physics", sorted(BASE_RANGES) + sorted(MODERN_RANGES), frozen=True,
                         namespace={"as_dict": _as_dict})


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
