"""A study's report as one self-contained HTML page: the best layout, best so far, trials by status, the
top ten layouts, MFU by TP x PP and the model's error, the figures embedded as base64 data URIs (so
`index.html` alone is the report) and written beside it as PNG files. Pure: returns a Report.
"""

from __future__ import annotations

import base64
import html
from dataclasses import dataclass, field
from datetime import datetime, timezone

from tuner.cluster_spec import CLUSTER_KEYS
from tuner.report.plots import FIGURES, figures
from tuner.report.rows import COLLAPSED, columns_at_default, ok_trials, simulated, status_counts, top_rows, tp_pp_cells
from tuner.specs import stored_framework
from tuner.trial import SIMULATED, Status


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
    reserve = float(cluster.get("memory_reserved_gb", CLUSTER_KEYS["memory_reserved_gb"][1]))
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
        drawn = figures(trials, cluster.get("memory_gb"), reserve)
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
                  f"<h2>Top ten layouts{sim}</h2>", html_table(top_rows(trials, 10, reserve)),
                  *heatmap_section(trials, drawn[FIGURES[1]]),
                  *model_error_section(trials, drawn[FIGURES[2]])]
    page = (f"<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'><title>tuner report: {e(study.name)}"
            f"</title><style>{CSS}</style></head><body>\n" + "\n".join(parts) + "\n</body></html>\n")
    return Report(html=page, figures=figs, finished=len(finished), ok=len(ok))
