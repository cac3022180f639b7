"""The pure half of `tuner calibrate`: fitting the measurements and writing the cluster file.

No torch, no processes: `fit_gemm` places the matmul sizes on eta(F) = eff * F / (F + knee);
`cluster_from_measurements` turns the ranks' measurements into cluster keys; `overhead_points` and
`fit_overhead` fit the framework overheads to the harness runs (T = P0 + k*o + c + n*dl, see
tuner/calibrate.py); `with_overhead` applies that fit; `render_toml` writes the file, each key with
where its value came from. tuner/calibrate.py measures and calls these.
"""

from __future__ import annotations

import dataclasses
import json
import textwrap

from tuner.specs import CLUSTER_KEYS, ClusterSpec

HEADER = "# Written by `tuner calibrate`"  # the first line of every file calibrate writes


def fit_gemm(points: list[tuple[float, float]], peak_tflops: float) -> tuple[float, float]:
    """Fit eta(F) = eff * F / (F + knee) to (GFLOP per GEMM, TFLOPS) points; return (eff, knee).
    eff is the best rate of the larger half of the sizes over peak (what large GEMMs reach); knee then
    puts the smallest size on the curve. Robust to noisy, non-monotone points (a shared machine)."""
    pts = sorted((f, t / peak_tflops) for f, t in points if f > 0 and t > 0)
    if not pts:
        return 1.0, 1e-4
    eff = min(1.0, max(0.05, max(e for _, e in pts[len(pts) // 2:])))
    f_small, eta_small = pts[0]
    knee = f_small * (eff / eta_small - 1.0) if eta_small < eff else 0.0
    return round(eff, 4), float(f"{max(knee, 1e-4):.4g}")


def overhead_points(runs: list[dict], cluster: dict, model) -> list[tuple[float, float, float, float]]:
    """(T, P0, k, n) per harness run: the measured post-warm-up step time T (median, seconds); the
    model's step time P0 with the constants of `cluster` and no fixed overhead; and how the model's
    step time grows with each unknown: k micro-batch slots (m + p - 1) per ms of micro-batch overhead,
    n seconds per extra microsecond of collective latency (2(g-1) per all-reduce, 1 per p2p message).
    `runs` are {"layout", "global_batch", "step_s"} (see `measure_overhead`)."""
    from tuner.layout import Layout
    from tuner.perfmodel import predict
    from tuner.specs import Workload
    spec = ClusterSpec.from_dict({k: v for k, v in cluster.items()
                                  if k not in ("microbatch_overhead_ms", "step_overhead_ms")})
    none = dataclasses.replace(spec, microbatch_overhead_ms=0.0, step_overhead_ms=0.0)
    variants = (none, dataclasses.replace(none, microbatch_overhead_ms=1.0),
                dataclasses.replace(none, latency_us=none.latency_us + 1.0))
    out = []
    for r in runs:
        lay = r["layout"] if isinstance(r["layout"], Layout) else Layout.from_dict(r["layout"])
        p0, p_mb, p_lat = (predict(lay, Workload(model, c, 1, r["global_batch"])).step_time_s for c in variants)
        out.append((float(r["step_s"]), p0, (p_mb - p0) / 1e-3, p_lat - p0))
    return out


def fit_overhead(points: list[tuple]) -> tuple[float, float, float]:
    """Fit T = P0 + k*o + c + n*dl to (T, P0, k[, n]) points (see `overhead_points`) and return
    (o, c, dl), all >= 0: o the fixed cost per micro-batch per stage (ms), c per iteration (ms), dl
    the latency each collective message costs inside a training step beyond the tight-loop figure
    (us: a collective between kernels waits for the slower rank and wakes up late).

    Least squares on relative error (each residual over its T), so the short m = 1 runs count as
    much as the long ones; non-negative (the unknowns driven below 0 are dropped and the rest
    refitted). Runs that differ only in m separate o from c; runs with tensor parallelism (many
    messages per micro-batch) give dl. An unknown no point has a coefficient for stays 0."""
    pts = [(float(p[0]), float(p[1]), [float(p[2]) * 1e-3, 1.0, float(p[3]) if len(p) > 3 else 0.0])
           for p in points if p[0] > 0]
    if not pts:
        return 0.0, 0.0, 0.0
    w = [1.0 / t for t, _, _ in pts]
    rows = [[wi * a for a in x] for wi, (_, _, x) in zip(w, pts)]
    ys = [wi * (t - p0) for wi, (t, p0, _) in zip(w, pts)]
    best, best_res = (0.0, 0.0, 0.0), sum(y * y for y in ys)
    for mask in range(1, 8):                       # every subset of the unknowns: the best feasible one
        cols = [j for j in range(3) if mask >> j & 1]
        if any(all(abs(r[j]) < 1e-15 for r in rows) for j in cols):
            continue
        sol = _lstsq([[r[j] for j in cols] for r in rows], ys)
        if sol is None or any(v < 0 for v in sol):
            continue
        x = [0.0, 0.0, 0.0]
        for j, v in zip(cols, sol):
            x[j] = v
        res = sum((y - sum(a * b for a, b in zip(r, x))) ** 2 for r, y in zip(rows, ys))
        if res < best_res - 1e-18:
            best, best_res = tuple(x), res
    o, c, dl = best
    return _r(o), _r(c * 1e3), _r(dl)


def _lstsq(a: list[list[float]], y: list[float]) -> list[float] | None:
    """Least squares by the normal equations (at most 3 unknowns); None when singular."""
    n = len(a[0])
    m = [[sum(r[i] * r[j] for r in a) for j in range(n)] + [sum(r[i] * yi for r, yi in zip(a, y))]
         for i in range(n)]
    for i in range(n):                              # Gauss-Jordan with partial pivoting
        piv = max(range(i, n), key=lambda k: abs(m[k][i]))
        if abs(m[piv][i]) < 1e-12 * max(1e-300, max(abs(m[k][k]) for k in range(n))):
            return None
        m[i], m[piv] = m[piv], m[i]
        for k in range(n):
            if k != i:
                f = m[k][i] / m[i][i]
                m[k] = [a - f * b for a, b in zip(m[k], m[i])]
    return [m[i][n] / m[i][i] for i in range(n)]


def cluster_from_measurements(m: dict, gpus: int, name: str = "local") -> dict:
    """The cluster dict (keys of CLUSTER_KEYS) from the ranks' measurements (see `measure`)."""
    ranks = m["ranks"]
    best = [max(t for _, t in r["matmul"]) for r in ranks]
    peak = sum(best) / len(best)
    points = [(2.0 * n ** 3 / 1e9, sum(dict(r["matmul"])[n] for r in ranks) / len(ranks))
              for n, _ in ranks[0]["matmul"]]
    eff, knee = fit_gemm(points, peak)
    copy = min(r["copy_gbps"] for r in ranks)
    attention = sum(r["attention_tflops"] for r in ranks) / len(ranks)
    if gpus > 1:
        t_big = max(r["allreduce_big_s"] for r in ranks)
        t_small = max(r["allreduce_small_s"] for r in ranks)
        bus = 2.0 * (gpus - 1) / gpus * m["allreduce_big_bytes"] / t_big / 1e9
        latency_us = t_small / (2.0 * (gpus - 1)) * 1e6
    else:
        bus, latency_us = copy, 10.0     # nothing to communicate with: any positive figure
    reserved = max(r["baseline_gb"] for r in ranks)
    return {
        "name": name, "gpus_per_node": gpus, "peak_tflops": _r(peak), "memory_gb": _r(m["memory_gb"]),
        "hbm_bandwidth_gbps": _r(copy), "intra_node_bandwidth_gbps": _r(bus), "inter_node_bandwidth_gbps": _r(bus),
        "matmul_efficiency": eff, "latency_us": _r(max(latency_us, 0.1)), "gemm_knee_gflop": knee,
        "attention_efficiency": _r(min(1.0, max(1e-3, attention / peak))),
        "memory_bandwidth_efficiency": 1.0, "network_efficiency": 1.0,
        "microbatch_overhead_ms": CLUSTER_KEYS["microbatch_overhead_ms"][1],
        "step_overhead_ms": CLUSTER_KEYS["step_overhead_ms"][1],
        "memory_reserved_gb": _r(max(reserved, 0.05)),
        "flash_attention": all(r.get("flash_attention", True) for r in ranks),
        **({"device": "cpu"} if m.get("device") == "cpu" else {}),
    }


def _r(x: float) -> float:
    return float(f"{x:.4g}")


def with_overhead(cluster: dict, overhead: dict | None) -> dict:
    """`cluster` with the overheads fitted from the harness runs (see `measure_overhead`), if any."""
    if not overhead or not overhead.get("runs"):
        return dict(cluster)
    from tuner.specs import load_model
    o, c, dl = fit_overhead(overhead_points(overhead["runs"], cluster, load_model(overhead["model"])))
    return {**cluster, "microbatch_overhead_ms": o, "step_overhead_ms": c,
            "latency_us": _r(cluster["latency_us"] + dl)}


def render_toml(cluster: dict, m: dict) -> str:
    """The cluster file: each key with where its value came from."""
    how = {"peak_tflops": f"best sustained {m['dtype']} matmul per rank, {m['gpus']} ranks at once",
           "memory_gb": "per rank: " + ("device memory" if m["device"] == "cuda"
                                         else "the local runner's cap, 80 % of RAM / ranks"),
           "hbm_bandwidth_gbps": "tensor copy (read + write), slowest rank",
           "intra_node_bandwidth_gbps": f"{m['backend']} all-reduce bus bandwidth, {m['allreduce_big_bytes'] >> 20} MiB",
           "inter_node_bandwidth_gbps": "one machine is one node: same as intra",
           "matmul_efficiency": "large GEMMs / peak: eta(F) = eff * F / (F + knee)",
           "gemm_knee_gflop": "puts the smallest size on eta(F)",
           "latency_us": "small all-reduce / 2(G-1) steps", "attention_efficiency": "causal SDPA / peak",
           "memory_bandwidth_efficiency": "bandwidth above is already sustained",
           "network_efficiency": "bandwidth above is already sustained", "microbatch_overhead_ms": "default",
           "step_overhead_ms": "default",
           "memory_reserved_gb": "resident memory of an idle rank",
           "flash_attention": "whether causal SDPA picks its fused kernel here",
           "device": "measured on CPU cores: the local runner trains on them for this file"}
    ov = m.get("overhead") or {}
    lines = [f"{HEADER} on {m['host']} ({m['device']}, {m['gpus']} ranks, "
             f"torch {m['torch']}) in {m['seconds']:.0f} s.", "# Measured figures; rerun with --force to refresh."]
    if ov.get("runs"):
        lines.append(f"# Overheads fitted to harness runs of `{ov['model']}` (median post-warm-up step time):")
        lines += [f"#   {_key(r['layout'])} m={r['m']} (global batch {r['global_batch']}): "
                  f"{r['step_s'] * 1e3:.1f} ms" for r in ov["runs"]]
        how["microbatch_overhead_ms"] = "per micro-batch: the m = 4 runs against the m = 1 runs"
        how["step_overhead_ms"] = "per iteration: what the m = 1 runs leave"
        tight = ov.get("latency_tight_us")
        if tight is not None and cluster.get("latency_us", tight) > tight:
            how["latency_us"] = (f"tight-loop small all-reduce / 2(G-1) steps measured {tight:.4g}, plus the wait "
                                 "per message inside a training step (the tensor-parallel runs)")
    elif ov.get("error"):
        why = textwrap.shorten(ov["error"], 150, placeholder=" ...")      # one line, cut between words
        how["microbatch_overhead_ms"] = how["step_overhead_ms"] = f"default, not measured: harness run failed ({why})"
    for k, v in cluster.items():
        val = json.dumps(v) if isinstance(v, str) else ("true" if v is True else "false" if v is False else repr(v))
        lines.append(f"{k} = {val}" + (f"    # {how[k]}" if k in how else ""))
    return "\n".join(lines) + "\n"


def _key(layout) -> str:
    from tuner.layout import Layout
    return (layout if isinstance(layout, Layout) else Layout.from_dict(layout)).key()
