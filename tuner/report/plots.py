"""The report's figures, drawn with matplotlib's Agg backend into PNG bytes: best so far, MFU by TP x PP,
the model's error (measured against predicted MFU and memory), trials by status. Pure: no file is written.
"""

from __future__ import annotations

import io
import math

from tuner.report.rows import (COLLAPSED, best_so_far, memory_pairs, model_error, ok_trials, pairs, simulated,
                               status_counts, tp_pp_cells, tp_pp_grid)
from tuner.trial import Status

STATUS_COLORS = {"ok": "#2e7d32", "oom": "#c62828", "timeout": "#ef6c00", "failed": "#6a1b9a",
                 "pruned": "#9e9e9e", "stopped": "#1565c0", "running": "#00838f", "interrupted": "#795548"}
FIGURES = ("best_so_far.png", "tp_pp_heatmap.png", "model_error.png", "status_counts.png")


def _plt():
    import matplotlib
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt
    return plt


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    _plt().close(fig)
    return buf.getvalue()


def fig_best_so_far(trials) -> bytes | None:
    xs, ys, ok_x, ok_y = best_so_far(trials)
    if not ok_x:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    ax.scatter(ok_x, [100 * v for v in ok_y], s=14, color="#90a4ae", label="trial (ok)", zorder=2)
    ax.step(xs, [100 * v for v in ys], where="post", color="#1565c0", lw=2, label="best so far", zorder=3)
    ax.set_xlabel("trial number")
    ax.set_ylabel("MFU (%): training speed")
    ax.set_title("Best so far" + (" (simulated)" if all(simulated(t) for t in trials if t.mfu is not None) else ""))
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    return _png(fig)


def fig_tp_pp_heatmap(trials) -> bytes | None:
    """Each cell: the best MFU at that TP and PP over every other dimension, and how many ok trials it
    holds; the cell of the best layout outlined, its whole key in the title."""
    tps, pps, grid = tp_pp_grid(trials)
    if not tps:
        return None
    cells = tp_pp_cells(trials)
    top = ok_trials(trials)[0]
    plt = _plt()
    import numpy as np
    data = np.array([[math.nan if v is None else 100 * v for v in row] for row in grid])
    fig, ax = plt.subplots(figsize=(1.3 * len(tps) + 2.6, 0.55 * len(pps) + 1.8))
    im = ax.imshow(np.ma.masked_invalid(data), cmap="viridis", aspect="auto", origin="lower")
    ax.set_xticks(range(len(tps)), [str(v) for v in tps])
    ax.set_yticks(range(len(pps)), [str(v) for v in pps])
    ax.set_xlabel("TP")
    ax.set_ylabel("PP")
    ax.set_title(f"MFU (%) by TP x PP: each cell the best trial over {', '.join(COLLAPSED)} (n: ok trials)\n"
                 f"best (outlined): {top.layout.key()}", fontsize=8)
    finite = data[~np.isnan(data)]
    mid = (finite.min() + finite.max()) / 2 if finite.size else 0
    for i in range(len(pps)):
        for j in range(len(tps)):
            v = data[i, j]
            n = cells.get((tps[j], pps[i]), (None, 0))[1]
            ax.text(j, i, "-" if math.isnan(v) else f"{v:.1f}\nn={n}", ha="center", va="center", fontsize=8,
                    color="#9e9e9e" if math.isnan(v) else ("black" if v > mid else "white"))
    bj, bi = tps.index(top.layout.tp), pps.index(top.layout.pp)
    ax.add_patch(plt.Rectangle((bj - 0.5, bi - 0.5), 1, 1, fill=False, edgecolor="#d50000", lw=2.5))
    fig.colorbar(im, ax=ax, label="MFU (%)")
    return _png(fig)


def fig_model_error(trials, memory_capacity_gb: float | None = None, reserve_gb: float = 0.0) -> bytes | None:
    tf_p, tf_m = pairs(trials, "mfu", "predicted_mfu")
    mem_p, mem_m = memory_pairs(trials, reserve_gb)     # allocated + the reserve, as the prediction holds it
    oom_pred = [t.predicted_memory_gb for t in trials if t.status == Status.OOM and t.predicted_memory_gb is not None]
    if not tf_p and not mem_p:
        return None
    plt = _plt()
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4.2))
    for ax, p, m, what, unit in ((a1, tf_p, tf_m, "MFU", " (fraction)"), (a2, mem_p, mem_m, "peak memory", " (GB)")):
        ax.set_title(f"Measured vs predicted {what}")
        ax.set_xlabel(f"predicted{unit}")
        ax.set_ylabel(f"measured{unit}")
        ax.grid(alpha=0.3)
        if not p:
            ax.text(0.5, 0.5, "no trial with both values", ha="center", va="center", transform=ax.transAxes)
            continue
        ax.scatter(p, m, s=16, color="#1565c0", alpha=0.8, label="ok trial", zorder=3)
        lo, hi = min(p + m), max(p + m)
        if ax is a2 and memory_capacity_gb:
            hi = max(hi, memory_capacity_gb)
            edge = 1.5 * hi                      # OOMs predicted far beyond are drawn at the edge, not to scale
            ax.axhline(memory_capacity_gb, color="#c62828", ls=":", lw=1, label="GPU memory")
            if oom_pred:
                beyond = sum(v > edge for v in oom_pred)
                ax.scatter([min(v, edge) for v in oom_pred], [memory_capacity_gb] * len(oom_pred), marker="x",
                           color="#c62828", label="oom (at capacity)", zorder=3)
                hi = max(hi, min(max(oom_pred), edge))
                if beyond:
                    ax.text(0.03, 0.90, f"{beyond} oom predicted > {edge:.0f} GB, drawn at the right edge",
                            transform=ax.transAxes, va="top", fontsize=7, color="#c62828")
        pad = 0.05 * (hi - lo or 1)
        ax.plot([lo - pad, hi + pad], [lo - pad, hi + pad], color="black", lw=1, ls="--", label="y = x", zorder=2)
        err = model_error(p, m)
        if err:
            ax.text(0.03, 0.97, f"n={err['n']}  MAPE {100 * err['mape']:.1f} %  bias {100 * err['bias']:+.1f} %",
                    transform=ax.transAxes, va="top", fontsize=8)
        ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    return _png(fig)


def fig_status_counts(trials) -> bytes | None:
    counts = status_counts(trials)
    if not counts:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.4, 3.2))
    names = list(counts)
    bars = ax.bar(names, [counts[n] for n in names], color=[STATUS_COLORS.get(n, "#607d8b") for n in names])
    ax.bar_label(bars)
    ax.set_ylabel("trials")
    ax.set_title("Trials by status")
    ax.margins(y=0.15)
    return _png(fig)


def figures(trials, memory_capacity_gb: float | None = None, reserve_gb: float = 0.0) -> dict[str, bytes | None]:
    """Every figure as PNG bytes, None where there is nothing to draw (keys: FIGURES). `reserve_gb`: the cluster's
    fixed reserve, added to a measured peak (allocated bytes) before it is set against the prediction."""
    measured = [t for t in trials if not simulated(t)]        # the simulator's numbers are the model's own
    return dict(zip(FIGURES, (fig_best_so_far(trials), fig_tp_pp_heatmap(trials),
                              fig_model_error(measured, memory_capacity_gb, reserve_gb), fig_status_counts(trials))))
