"""`tuner scale --out DIR`: the scaling table as one self-contained HTML page and its PNG figures, in the
style of `tuner report` (its CSS, tables and figure helpers). Pure: returns the files' bytes.

Figures: days and cost (GPU-hours without --price) against nodes, one line per machine (cluster and
framework) with best's 90 % band; the Pareto front of days against cost; MFU against nodes, measured
points filled, predicted ones open.
"""

from __future__ import annotations

import html
import re
from datetime import datetime, timezone

from tuner.report.plots import _plt, _png
from tuner.report.page import CSS, _img, html_table
from tuner.scaling import cost_axis

FIGURES = ("time_vs_nodes.png", "cost_vs_nodes.png", "pareto.png", "mfu_vs_nodes.png")
COLORS = ("#1565c0", "#c62828", "#2e7d32", "#6a1b9a", "#ef6c00", "#00838f", "#795548", "#9e9e9e")


def machines(rows: list[dict]) -> dict[str, list[dict]]:
    """'cluster / framework' -> its answered rows by node count (one line of a figure)."""
    out: dict[str, list[dict]] = {}
    for r in sorted((r for r in rows if r["status"] == "ok"), key=lambda r: r["nodes"]):
        out.setdefault(f"{r['cluster']} / {r['framework']}", []).append(r)
    return out


def _axis_words(rows: list[dict]) -> tuple[str, str]:
    axis = cost_axis(rows)
    return axis, ("cost ($)" if axis == "cost" else "GPU-hours")


def _node_ticks(ax, rows: list[dict]) -> None:
    """The node counts asked for as the x ticks of a log axis (16, 32, ..., not 2^4)."""
    from matplotlib.ticker import NullLocator
    nodes = sorted({r["nodes"] for r in rows if r["status"] == "ok"})
    ax.set_xticks(nodes, [str(n) for n in nodes])
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xlabel("nodes")


def fig_against_nodes(rows: list[dict], key: str, label: str, title: str, band: str | None = None) -> bytes | None:
    """One line per machine of `key` against nodes (log-log), the 90 % band shaded where given."""
    lines = machines(rows)
    if not lines:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for (name, rs), color in zip(lines.items(), COLORS * 4):
        xs = [r["nodes"] for r in rs]
        ys = [r[key] for r in rs]
        ax.plot(xs, ys, "-", color=color, lw=1.5, label=name)
        for r in rs:
            ax.plot(r["nodes"], r[key], "o", color=color, mfc=color if r["measured"] else "white", ms=5)
        if band and all(r.get(band) for r in rs):
            scale = [r[key] / r["days"] for r in rs]           # cost and GPU-hours follow the days
            ax.fill_between(xs, [r[band][0] * s for r, s in zip(rs, scale)],
                            [r[band][1] * s for r, s in zip(rs, scale)], color=color, alpha=0.12, lw=0)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    _node_ticks(ax, rows)
    ax.set_ylabel(label)
    ax.set_title(title + ("" if not band else " (band: best's 90 % interval)"), fontsize=9)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    return _png(fig)


def fig_pareto(rows: list[dict], chosen: dict | None, deadline: float | None) -> bytes | None:
    """Every answered point, days against cost; the Pareto front joined; the deadline's choice ringed."""
    lines = machines(rows)
    if not lines:
        return None
    axis, label = _axis_words(rows)
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for (name, rs), color in zip(lines.items(), COLORS * 4):
        ax.scatter([r["days"] for r in rs], [r[axis] for r in rs], s=22, color=color, label=name, zorder=3)
        for r in rs:
            ax.annotate(str(r["nodes"]), (r["days"], r[axis]), fontsize=7, xytext=(3, 3), textcoords="offset points")
    front = sorted((r for r in rows if r.get("pareto")), key=lambda r: r["days"])
    ax.plot([r["days"] for r in front], [r[axis] for r in front], "--", color="black", lw=1, label="Pareto front")
    if deadline:
        ax.axvline(deadline, color="#c62828", ls=":", lw=1, label=f"deadline {deadline:g} days")
    if chosen:
        ax.scatter([chosen["days"]], [chosen[axis]], s=160, facecolors="none", edgecolors="#d50000", lw=2,
                   label="cheapest within the deadline", zorder=4)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("days to train")
    ax.set_ylabel(label)
    ax.set_title("Days against " + label + " (labels: nodes)", fontsize=9)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7)
    return _png(fig)


def fig_mfu(rows: list[dict]) -> bytes | None:
    lines = machines(rows)
    if not lines:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    for (name, rs), color in zip(lines.items(), COLORS * 4):
        ax.plot([r["nodes"] for r in rs], [100 * r["mfu"] for r in rs], "-", color=color, lw=1.5, label=name)
        for r in rs:
            ax.plot(r["nodes"], 100 * r["mfu"], "o", color=color, mfc=color if r["measured"] else "white", ms=5)
    ax.set_xscale("log", base=2)
    ax.set_ylim(bottom=0)
    _node_ticks(ax, rows)
    ax.set_ylabel("MFU (%)")
    ax.set_title("MFU against nodes (filled: measured, open: predicted)", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _png(fig)


def figures(rows: list[dict], chosen: dict | None = None, deadline: float | None = None) -> dict[str, bytes | None]:
    axis, label = _axis_words(rows)
    return dict(zip(FIGURES, (
        fig_against_nodes(rows, "days", "days to train", "Time to train against nodes", band="days_90"),
        fig_against_nodes(rows, axis, label, label[0].upper() + label[1:] + " against nodes", band="days_90"),
        fig_pareto(rows, chosen, deadline), fig_mfu(rows))))


def table_rows(rows: list[dict]) -> list[dict]:
    """The table `tuner scale` prints (and the page shows): one line per row, figures rounded by the
    renderer; `note` says why a node count has no layout."""
    axis = cost_axis(rows)
    out = []
    for r in rows:
        ok = r["status"] == "ok"
        get = lambda k: r.get(k) if ok else None     # noqa: E731
        out.append({"cluster": r["cluster"], "framework": r["framework"], "nodes": r["nodes"], "gpus": r["gpus"],
                    "gbs": r["global_batch"] if isinstance(r["global_batch"], int) else "schedule",
                    "layout": get("layout_key"), "samples_s": get("samples_per_second"),
                    "mfu_%": ok and 100 * r["mfu"] or None,
                    "measured": ("yes" if r["measured"] else "no") if ok else None,
                    "goodput_%": ok and 100 * r["goodput"] or None, "days": get("days"),
                    "days_90%": "{:.3g}-{:.3g}".format(*r["days_90"]) if ok and r.get("days_90") else None,
                    "gpu_hours": _whole(get("gpu_hours")), **({"cost": _whole(get("cost"))} if axis == "cost" else {}),
                    "energy_mwh": get("energy_mwh"), "eff_%": ok and 100 * r["scaling_efficiency"] or None,
                    "pareto": ("*" if r.get("pareto") else "") + (" chosen" if r.get("chosen") else ""),
                    "note": "" if ok else r["note"]})
    return out


def _whole(v):
    """A large figure as a whole number (1234978, not 1.235e+06)."""
    return None if v is None else round(v)


#: The report's style, and one line per row (a layout key unbroken; the table scrolls sideways).
PAGE_CSS = CSS + "td{white-space:nowrap}"


def prose(text: str) -> str:
    """A line of `tuner scale`'s text output as HTML: escaped, its `backticked` commands as <code>."""
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", html.escape(text))


def build_page(result, *, generated: datetime | None = None) -> dict[str, bytes]:
    """index.html (figures embedded) and the PNGs of a ScaleResult (tuner.planning.scale)."""
    e = html.escape
    rows = result.rows
    drawn = figures(rows, result.chosen, result.deadline)
    stamp = (generated or datetime.now(timezone.utc)).strftime("%Y-%m-%d %H:%M UTC")
    ok = [r for r in rows if r["status"] == "ok"]
    parts = [f"<h1>Scaling {e(result.model)}</h1>",
             f"<p class='meta'>{e(result.notes[0] if result.notes else '')}. {len(ok)} of {len(rows)} point(s) "
             f"answered. Generated {stamp}.</p>"]
    if result.sentence:
        parts.append(f"<p class='{'best' if result.chosen else 'note'}'>{prose(result.sentence)}</p>")
    none = "no node count has a layout to draw"
    img = lambda i, alt: _img(FIGURES[i], drawn[FIGURES[i]], alt, none)       # noqa: E731
    parts += ["<h2>Every point</h2>", html_table(table_rows(rows)),
              "<div class='row'><div><h2>Time to train</h2>", img(0, "days against nodes"),
              "</div><div><h2>Cost</h2>", img(1, "cost against nodes"), "</div></div>",
              "<div class='row'><div><h2>Pareto front</h2>", img(2, "days against cost"),
              "</div><div><h2>MFU</h2>", img(3, "MFU against nodes"), "</div></div>",
              "<h2>What the figures rest on</h2><ul>" + "".join(f"<li>{prose(n)}</li>" for n in result.notes) + "</ul>"]
    page = (f"<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'><title>tuner scale: {e(result.model)}"
            f"</title><style>{PAGE_CSS}</style></head><body>\n" + "\n".join(parts) + "\n</body></html>\n")
    return {"index.html": page.encode(), **{k: v for k, v in drawn.items() if v is not None}}
