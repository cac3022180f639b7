"""A study's report: rows, figure data, PNG figures and one self-contained HTML page. Pure.

Nothing here touches the store or the file system: the CLI (`tuner report`, `tuner export`) reads the
trials, calls these functions and writes what they return. Figures are drawn with matplotlib's Agg
backend into PNG bytes; the page embeds them as base64 data URIs, so `index.html` alone is the report.
"""

from __future__ import annotations

import base64
import html
import io
import math
from dataclasses import dataclass, field
from datetime import datetime, timezone

from tuner.layout import DIMENSIONS, LAYOUT_FIELDS, flat_layout
from tuner.metrics import trial_rank_key
from tuner.specs import stored_framework
from tuner.trial import SIMULATED, Status

STATUS_ORDER = [s.value for s in Status]
STATUS_COLORS = {"ok": "#2e7d32", "oom": "#c62828", "timeout": "#ef6c00", "failed": "#6a1b9a",
                 "pruned": "#9e9e9e", "stopped": "#1565c0", "running": "#00838f", "interrupted": "#795548"}
EXPORT_COLUMNS = ["study", "trial", "layout_key", *LAYOUT_FIELDS, "status", "samples_per_second", "mfu",
                  "tflops_per_gpu", "peak_fraction", "peak_memory_gb", "predicted_mfu", "predicted_tflops_per_gpu",
                  "predicted_peak_fraction",
                  "predicted_memory_gb", "predicted_step_time_s", "runner", "attempts", "started", "ended",
                  "duration_s", "message", "log_path"]
FIGURES = ("best_so_far.png", "tp_pp_heatmap.png", "model_error.png", "status_counts.png")
#: Runners whose numbers are the performance model's own prediction, not a measurement.
#: What each TP x PP cell of the heatmap takes the best over: every other dimension (table columns).
COLLAPSED = tuple(d.column for d in DIMENSIONS if d.name not in ("tp", "pp"))


# ------------------------------------------------------------------------------------------- rows

def _iso(t: datetime | None) -> str | None:
    return None if t is None else t.astimezone(timezone.utc).isoformat()


def export_row(t) -> dict:
    """One trial as a flat row: layout, status, measured and predicted metrics (EXPORT_COLUMNS)."""
    dur = (t.ended - t.started).total_seconds() if t.started and t.ended else None
    return {"study": t.study, "trial": t.number, "layout_key": t.layout.key(), **t.layout.as_dict(),
            "status": str(t.status), "samples_per_second": t.samples_per_second, "mfu": t.mfu,
            "tflops_per_gpu": t.tflops_per_gpu, "peak_fraction": t.peak_fraction, "peak_memory_gb": t.peak_memory_gb,
            "predicted_mfu": t.predicted_mfu, "predicted_tflops_per_gpu": t.predicted_tflops_per_gpu,
            "predicted_peak_fraction": t.predicted_peak_fraction, "predicted_memory_gb": t.predicted_memory_gb,
            "predicted_step_time_s": t.predicted_step_time_s, "runner": t.runner, "attempts": t.attempts,
            "started": _iso(t.started), "ended": _iso(t.ended), "duration_s": dur,
            "message": t.message or "", "log_path": t.log_path}


def export_rows(trials) -> list[dict]:
    return [export_row(t) for t in sorted(trials, key=lambda t: t.number)]


def ok_trials(trials) -> list:
    """Successful trials with a measured speed, fastest (highest MFU) first (ties: tuner.metrics.rank_key)."""
    ok = [t for t in trials if t.status == Status.OK and t.mfu is not None]
    return sorted(ok, key=trial_rank_key)


def top_rows(trials, k: int = 10) -> list[dict]:
    """The `k` fastest layouts as table rows (percentages, not fractions). mfu_% ranks; mgt_* is
    Megatron's count with recompute (the Frontier study's figure)."""
    pct = lambda v: None if v is None else 100 * v
    return [{"rank": i + 1, "trial": t.number, **flat_layout(t.layout.as_dict()),
             "samples_s": t.samples_per_second, "mfu_%": pct(t.mfu), "pred_mfu_%": pct(t.predicted_mfu),
             "mgt_tflops": t.tflops_per_gpu, "mgt_peak_%": pct(t.peak_fraction),
             "mem_gb": t.peak_memory_gb, "pred_mem_gb": t.predicted_memory_gb}
            for i, t in enumerate(ok_trials(trials)[:k])]


def columns_at_default(rows: list[dict]) -> set[str]:
    """The layout columns a layout key names only when set (sp, cp, vp, ep, etp) that every row leaves at
    their default: tables leave them out (a dense study's ep and etp are 1 throughout)."""
    return {d.column for d in DIMENSIONS if d.in_key == "set" and rows
            and all(r.get(d.column, d.default) == d.default for r in rows)}


def status_counts(trials) -> dict[str, int]:
    """Trials per status, in Status order, statuses with no trial left out."""
    counts = {s: 0 for s in STATUS_ORDER}
    for t in trials:
        counts[str(t.status)] += 1
    return {s: n for s, n in counts.items() if n}


def best_so_far(trials) -> tuple[list[int], list[float], list[int], list[float]]:
    """(numbers, running best, ok numbers, ok values) of MFU (training speed) over launched trials.

    Pruned trials were never launched and are left out; the running best starts at the first success.
    """
    launched = sorted((t for t in trials if t.status not in (Status.PRUNED, Status.RUNNING)), key=lambda t: t.number)
    xs, ys, ok_x, ok_y, best = [], [], [], [], None
    for t in launched:
        if t.status == Status.OK and t.mfu is not None:
            ok_x.append(t.number)
            ok_y.append(t.mfu)
            best = t.mfu if best is None else max(best, t.mfu)
        if best is not None:
            xs.append(t.number)
            ys.append(best)
    return xs, ys, ok_x, ok_y


def tp_pp_cells(trials) -> dict[tuple[int, int], tuple]:
    """(tp, pp) -> (the fastest ok trial with that TP and PP, whatever its other dimensions (COLLAPSED),
    how many ok trials the cell holds)."""
    cells: dict[tuple[int, int], tuple] = {}
    for t in ok_trials(trials):                       # fastest first: a cell's first trial is its best
        key = (t.layout.tp, t.layout.pp)
        best, n = cells.get(key, (t, 0))
        cells[key] = (best, n + 1)
    return cells


def tp_pp_grid(trials) -> tuple[list[int], list[int], list[list[float | None]]]:
    """(tps, pps, grid[pp index][tp index]): the best MFU of each TP x PP over the other dims."""
    cells = tp_pp_cells(trials)
    tps = sorted({tp for tp, _ in cells})
    pps = sorted({pp for _, pp in cells})
    return tps, pps, [[cells[(tp, pp)][0].mfu if (tp, pp) in cells else None for tp in tps] for pp in pps]


def simulated(t) -> bool:
    """Whether a trial's numbers are the simulator's (the model's prediction), not a measurement."""
    return t.runner in SIMULATED


def pairs(trials, measured: str, predicted: str) -> tuple[list[float], list[float]]:
    """(predicted, measured) of the successful trials that have both."""
    got = [(getattr(t, predicted), getattr(t, measured)) for t in trials if t.status == Status.OK]
    got = [(p, m) for p, m in got if p is not None and m is not None]
    return [p for p, _ in got], [m for _, m in got]


def model_error(predicted: list[float], measured: list[float]) -> dict | None:
    """Mean absolute and mean signed relative error of the prediction against the measurement."""
    rel = [(p - m) / m for p, m in zip(predicted, measured) if m]
    if not rel:
        return None
    return {"n": len(rel), "mape": sum(abs(r) for r in rel) / len(rel), "bias": sum(rel) / len(rel)}


# ---------------------------------------------------------------------------------------- figures

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


def fig_model_error(trials, memory_capacity_gb: float | None = None) -> bytes | None:
    tf_p, tf_m = pairs(trials, "mfu", "predicted_mfu")
    mem_p, mem_m = pairs(trials, "peak_memory_gb", "predicted_memory_gb")
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


def figures(trials, memory_capacity_gb: float | None = None) -> dict[str, bytes | None]:
    """Every figure as PNG bytes, None where there is nothing to draw (keys: FIGURES)."""
    measured = [t for t in trials if not simulated(t)]        # the simulator's numbers are the model's own
    return dict(zip(FIGURES, (fig_best_so_far(trials), fig_tp_pp_heatmap(trials),
                              fig_model_error(measured, memory_capacity_gb), fig_status_counts(trials))))


# ------------------------------------------------------------------------------------------- page

@dataclass
class Report:
    """What `tuner report` writes: index.html (self-contained) and the same figures as PNG files."""

    html: str
    figures: dict[str, bytes] = field(default_factory=dict)
    finished: int = 0
    ok: int = 0

    def files(self) -> dict[str, bytes]:
        return {"index.html": self.html.encode(), **self.figures}


CSS = """body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2em auto;max-width:1100px;
color:#212121;padding:0 1em}h1{margin-bottom:.2em}.meta{color:#616161}table{border-collapse:collapse;margin:1em 0;
font-size:.9em}.scroll{overflow-x:auto}
td,th{border:1px solid #ddd;padding:3px 6px;font-variant-numeric:tabular-nums}th{background:#f5f5f5}
td.n{text-align:right}.note{background:#fff8e1;border-left:4px solid #ffb300;padding:.6em 1em}
.best{background:#e8f5e9;border-left:4px solid #2e7d32;padding:.6em 1em}figure{margin:1.2em 0}
figure img{max-width:100%;border:1px solid #eee}.row{display:flex;flex-wrap:wrap;gap:0 2em}.row>div{flex:1 1 45%;min-width:320px}code{background:#f5f5f5;padding:1px 4px}"""


def _fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:.1f}" if abs(v) >= 10 else f"{v:.3g}"
    return str(v)


def html_table(rows: list[dict]) -> str:
    """The rows as an HTML table; layout columns every row leaves at their default are left out, and
    the headers may wrap after an underscore (pred_<wbr>mem_<wbr>gb), so the top table fits a 1,400 px window."""
    if not rows:
        return "<p>(none)</p>"
    e = html.escape
    dropped = columns_at_default(rows)
    rows = [{k: v for k, v in r.items() if k not in dropped} for r in rows]
    head = "".join(f"<th>{e(c).replace('_', '_<wbr>')}</th>" for c in rows[0])
    body = "".join("<tr>" + "".join(
        f"<td class='n'>{e(_fmt(v))}</td>" if isinstance(v, (int, float)) and not isinstance(v, bool)
        else f"<td>{e(_fmt(v))}</td>" for v in r.values()) + "</tr>" for r in rows)
    return f"<div class='scroll'><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>"


def _img(name: str, png: bytes | None, alt: str, missing: str) -> str:
    if png is None:
        return f"<p class='note'>{html.escape(missing)}</p>"
    data = base64.b64encode(png).decode()
    return f"<figure><img src='data:image/png;base64,{data}' alt='{html.escape(alt)}' data-file='{name}'></figure>"


def heatmap_section(trials, png: bytes | None) -> list[str]:
    """The TP x PP heatmap, what its cells collapse, and each cell's best layout in full."""
    e, cells = html.escape, tp_pp_cells(trials)
    if not cells:
        return ["<h2>MFU by TP x PP</h2>", _img(FIGURES[1], png, "MFU by TP and PP", "no successful trial yet")]
    top = ok_trials(trials)[0]
    rows = [{"tp": tp, "pp": pp, "mfu_%": 100 * b.mfu, "ok trials": n, "best layout": b.layout.key(),
             "trial": b.number} for (tp, pp), (b, n) in sorted(cells.items(), key=lambda c: (-c[1][0].mfu, c[0]))]
    return ["<h2>MFU by TP x PP</h2>", _img(FIGURES[1], png, "MFU by TP and PP", "no successful trial yet"),
            f"<p>Each cell is the best successful trial with that TP and PP over every other dimension "
            f"({e(', '.join(COLLAPSED))}); <i>n</i> is how many successful trials the cell holds. The outlined "
            f"cell holds the best layout, <code>{e(top.layout.key())}</code>.</p>",
            f"<details><summary>The best layout of each of the {len(cells)} cells</summary>{html_table(rows)}"
            "</details>"]


def model_error_section(trials, png: bytes | None) -> list[str]:
    """Measured against predicted, from measured trials only: a simulated trial's numbers are the
    model's prediction (times its --noise), so comparing the two would show the noise, not the error."""
    finished = [t for t in trials if t.status.finished and t.status != Status.PRUNED]
    sims = sum(simulated(t) for t in finished)
    if finished and sims == len(finished):
        return ["<h2>The model's error</h2>",
                f"<p class='note'>Every trial of this study ran in the simulator (runner {html.escape(', '.join(SIMULATED))}): its MFU "
                "and memory are the performance model's own prediction (times the <code>--noise</code> factor, if "
                "set), so comparing them with the prediction would show that noise, not the model's error; no "
                "plot. Trials on real hardware (<code>--runner local</code>, <code>slurm</code> or "
                "<code>command</code>) measure it.</p>"]
    left_out = (f"<p>{sims} simulated trial(s) are left out: their numbers are the model's own.</p>"
                if sims else "")
    return ["<h2>The model's error: measured vs predicted</h2>",
            _img(FIGURES[2], png, "measured vs predicted MFU and memory",
                 "no successful measured trial has both a measurement and a prediction"), left_out]


def build_report(study, trials, *, generated: datetime | None = None) -> Report:
    """The report of `study` (a StudyRecord) from its `trials` (TrialRecords)."""
    e = html.escape
    w = study.workload
    cluster = w.get("cluster", {})
    gpus = int(w["nodes"]) * int(cluster.get("gpus_per_node", 0) or 0)
    finished = [t for t in trials if t.status.finished]
    ok = ok_trials(trials)
    counts = status_counts(trials)
    stamp = (generated or datetime.now(timezone.utc)).strftime("%Y-%m-%d %H:%M UTC")
    parts = [f"<h1>Study {e(study.name)}</h1>",
             f"<p class='meta'>{e(study.model)} on {study.nodes} x {e(study.cluster)} node(s) = {gpus} GPUs, "
             f"global batch {study.global_batch}; searcher {e(study.searcher)}, runner {e(study.runner)}, "
             f"state {e(study.state)}; {len(trials)} trial(s): "
             + e(", ".join(f"{n} {s}" for s, n in counts.items()) or "none") + f". Generated {stamp}.</p>"]
    figs: dict[str, bytes] = {}
    if not finished:
        parts.append("<p class='note'>This study has no finished trials yet, so there is nothing to plot. "
                     f"Run some with <code>tuner resume {e(study.name)}</code> and report again.</p>")
    else:
        drawn = figures(trials, cluster.get("memory_gb"))
        figs = {k: v for k, v in drawn.items() if v is not None}
        if ok:
            b = ok[0]
            kind = "predicted by the simulator" if simulated(b) else "measured"
            parts.append(f"<p class='best'><b>Best layout</b> (trial {b.number}, {kind}): <code>{e(b.layout.key())}"
                         f"</code>: {_fmt(b.samples_per_second)} samples/s, MFU {100 * b.mfu:.2f} % (Megatron's "
                         f"count with recompute: {_fmt(b.tflops_per_gpu)} TFLOPS per GPU = "
                         f"{100 * b.peak_fraction:.2f} % of peak), {e(stored_framework(study.workload))}, "
                         f"{e((study.workload or {}).get('precision', 'bf16'))}. Launch files: <code>tuner launch "
                         f"{e(study.name)} --out launch/ --train-iters ITERS --data-path PATH --tokenizer NAME</code></p>")
        else:
            parts.append(f"<p class='note'>None of the {len(finished)} finished trial(s) succeeded, so there is no "
                         "best layout, no best-so-far curve, no heatmap and no model-error plot; see the status "
                         "counts below and the trials' messages (<code>tuner trials "
                         f"{e(study.name)}</code>).</p>")
        none = "no successful trial yet"
        sim = " (simulated: the model's predictions)" if ok and all(simulated(t) for t in ok) else ""
        parts += ["<div class='row'><div><h2>Best so far</h2>",
                  _img(FIGURES[0], drawn[FIGURES[0]], "best so far by trial number", none),
                  "</div><div><h2>Trials by status</h2>",
                  _img(FIGURES[3], drawn[FIGURES[3]], "trial status counts", none), "</div></div>",
                  f"<h2>Top ten layouts{sim}</h2>", html_table(top_rows(trials, 10)),
                  *heatmap_section(trials, drawn[FIGURES[1]]),
                  *model_error_section(trials, drawn[FIGURES[2]])]
    page = (f"<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'><title>tuner report: {e(study.name)}"
            f"</title><style>{CSS}</style></head><body>\n" + "\n".join(parts) + "\n</body></html>\n")
    return Report(html=page, figures=figs, finished=len(finished), ok=len(ok))
