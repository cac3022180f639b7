"""Measured kernel speeds, interpolated: GEMM FLOP/s per shape and collective bytes/s per message size.

The rows (data/xla_matmul.csv, data/xla_collectives.csv) are OpenXLA's measured performance tables
(extract_xla.py names the file and commit): H100 SXM ("sm_90") and MI300X ("gfx942"). Every other
accelerator is one of those curves rescaled by a drawn factor (the world's own constant), never a
formula of tuner's model.

- GEMM: FLOP/s at (M, N, K) by inverse-distance weighting of the log FLOP/s of the nearest measured shapes
  in (log2 M, log2 N, log2 K), batched rows (b > 1) counted as b * M rows; a shape beyond the table is
  clamped to its edge (the largest measured shapes run at the plateau).
- Collectives: bytes/s of an op on a group of 2, 4 or 8 GPUs of one node at a message size, linear in
  log-log between measured sizes (several measurements of one size: their geometric mean), clamped at the
  ends (the largest message runs at the plateau bandwidth; below the smallest, time is the smallest's).
"""

from __future__ import annotations

import csv
import math
from functools import lru_cache
from pathlib import Path

import numpy as np

DATA = Path(__file__).resolve().parent / "data"
NEIGHBOURS = 6


@lru_cache(maxsize=None)
def _matmul(hardware: str, dtype: str) -> tuple[np.ndarray, np.ndarray]:
    """(log2 (M, N, K) rows, log FLOP/s) of the measured shapes; repeated shapes averaged in log."""
    acc: dict[tuple[int, int, int], list[float]] = {}
    with open(DATA / "xla_matmul.csv") as f:
        for r in csv.DictReader(f):
            if r["hardware"] == hardware and r["dtype"] == dtype:
                key = (int(r["b"]) * int(r["m"]), int(r["n"]), int(r["k"]))
                acc.setdefault(key, []).append(math.log(float(r["flops_per_s"])))
    if not acc:
        raise ValueError(f"no measured GEMMs for {hardware} {dtype}")
    keys = sorted(acc)
    X = np.log2(np.array(keys, dtype=float))
    y = np.array([sum(acc[k]) / len(acc[k]) for k in keys])
    return X, y


def gemm_flops(hardware: str, dtype: str, M: float, N: float, K: float) -> float:
    """Measured FLOP/s of an M x N x K GEMM (interpolated, clamped to the measured range)."""
    return _gemm_flops(hardware, dtype, int(round(M)), int(N), int(K))


@lru_cache(maxsize=1 << 16)
def _gemm_flops(hardware: str, dtype: str, M: int, N: int, K: int) -> float:
    X, y = _matmul(hardware, dtype)
    p = np.clip(np.log2([max(M, 1), max(N, 1), max(K, 1)]), X.min(0), X.max(0))
    d = np.sqrt(((X - p) ** 2).sum(1))
    near = np.argsort(d)[:NEIGHBOURS]
    if d[near[0]] < 1e-9:
        return float(math.exp(y[near[0]]))
    w = 1.0 / d[near] ** 2
    return float(math.exp((w * y[near]).sum() / w.sum()))


def gemm_peak(hardware: str, dtype: str) -> float:
    """The fastest measured FLOP/s of the table (its plateau)."""
    return float(math.exp(_matmul(hardware, dtype)[1].max()))


@lru_cache(maxsize=None)
def _collective(hardware: str, op: str, size: int) -> tuple[np.ndarray, np.ndarray]:
    acc: dict[int, list[float]] = {}
    with open(DATA / "xla_collectives.csv") as f:
        for r in csv.DictReader(f):
            if r["hardware"] == hardware and r["op"] == op and int(r["group_size"]) == size:
                acc.setdefault(int(r["bytes"]), []).append(math.log(float(r["bytes_per_s"])))
    if not acc:
        raise ValueError(f"no measured {op} for {hardware} on {size} GPUs")
    sizes = sorted(acc)
    return np.log(np.array(sizes, dtype=float)), np.array([sum(acc[s]) / len(acc[s]) for s in sizes])


def collective_seconds(hardware: str, op: str, size: int, nbytes: float) -> float:
    """Seconds of `op` ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")
    over `nbytes` (the buffer XLA's table is keyed by) on an in-node group of `size` GPUs (2, 4 or 8)."""
    if size <= 1 or nbytes <= 0:
        return 0.0
    size = min((s for s in (2, 4, 8) if s >= size), default=8)
    lx, ly = _collective(hardware, op, size)
    lb = math.log(nbytes)
    if lb <= lx[0]:
        return float(math.exp(lx[0] - ly[0]))          # latency-bound: no faster than the smallest message
    return float(nbytes / math.exp(np.interp(lb, lx, ly)))
