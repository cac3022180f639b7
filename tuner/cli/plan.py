"""`tuner predict` and `tuner plan`: the performance model's answers, no trials."""

from __future__ import annotations

import time

import click

from tuner.cli import FORMAT_OPTION, cli
from tuner.cli.options import layout_options, workload_options
from tuner.cli.render import render
from tuner.frameworks import of as framework_of
from tuner.perfmodel import RECOMMEND_AT, keeps_headroom, predict as model_predict, risk
from tuner.perfmodel.memory import buffers_name
from tuner.perfmodel.moe_exchange import moe_summary
from tuner.perfmodel.screening import BATCH_FROM, assemble, rank_shown, screen_run
from tuner.planning import complete_layout, prediction_row, workload_line
from tuner.space import load_space, valid_layouts
from tuner.specs import make_workload
from tuner.workers import collector_paused, fork_context, forked_map, usable_cpus


#: From this many layouts `plan_ranking` screens them in worker processes (below, a fork costs more than it saves),
#: each worker at least PER_WORKER of them.
PARALLEL_FROM, PER_WORKER = 20000, 5000
_PLAN: dict = {}           # what a forked plan worker reads: the layouts, the workload, the rows kept


def plan_ranking(layouts: list, w, top: int | None, show_all: bool, jobs: int | None = None):
    """plan's Ranking (tuner.perfmodel.screening.rank_shown: the same rows and counts) with runs of the layouts
    screened in `jobs` forked processes that read them as forked (default: the CPUs from PARALLEL_FROM layouts,
    at most one per PER_WORKER; one process where fork does not exist)."""
    jobs = jobs or (min(usable_cpus(), len(layouts) // PER_WORKER) if len(layouts) >= PARALLEL_FROM else 1)
    context = fork_context()
    if jobs < 2 or len(layouts) < 2 or context is None:
        return rank_shown(layouts, w, top, show_all)
    n = len(layouts)
    runs = min(jobs, n)            # one run a worker: each run builds its own memo (shapes, cuts, floors) again
    if n >= BATCH_FROM:            # numpy imported once, here, not in each worker
        import tuner.perfmodel.memory_batch  # noqa: F401
    _PLAN.update(layouts=layouts, workload=w, top=top)
    try:
        answers = forked_map(context, _plan_run, [(n * i // runs, n * (i + 1) // runs) for i in range(runs)])
    finally:
        _PLAN.clear()
    return assemble(layouts, w, answers, top, show_all)


def _plan_run(bounds: tuple[int, int]) -> tuple:
    return screen_run(_PLAN["layouts"], _PLAN["workload"], _PLAN["top"], *bounds)


@cli.command()
@workload_options
@layout_options(required=("tp", "pp", "micro_batch"))
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True,
              help="Output format.")
def predict(model, nodes, cluster, global_batch, seq_length, precision, framework, grad_reduce, optimizer_moments,
            layout, fmt):
    """Predict throughput and memory of one layout.

    Example: tuner predict --model llama3-70b --cluster h100 --nodes 64 --tp 4 --sequence-parallel --cp 2 --pp 4 --vp 5 --micro-batch 1 --recompute none
    """
    w = make_workload(model, nodes, cluster, global_batch, precision, framework, grad_reduce, seq_length,
                      optimizer_moments)
    fw = framework_of(w)
    lay = complete_layout(layout, w)             # what the framework runs where an option is left out
    p = model_predict(lay, w)
    if fmt == "json":
        click.echo(render([], "json", json_obj={**p.as_dict(), "p_fit_basis": fw.memory_note(w)}))
        return
    click.echo(f"{workload_line(w)}, layout {lay.key()}")
    click.echo(f"  {p.samples_per_second:.2f} samples/s, MFU {100 * p.mfu:.2f} %, step {p.step_time_s:.3f} s; "
               f"Megatron's count (recompute included): {p.tflops_per_gpu:.4g} TFLOPS/GPU = "
               f"{100 * p.peak_fraction:.2f} % of peak")
    fit = ("fits" if keeps_headroom(p, w) else f"may not fit: below the {100 * RECOMMEND_AT:g} % an unmeasured "
           "recommendation needs" if p.fits else f"DOES NOT FIT: {p.reason}")
    click.echo(f"  memory {p.memory_gb:.1f} GB of {w.cluster.memory_gb:.1f} GB per GPU "
               f"({100 * p.memory_gb / w.cluster.memory_gb:.1f} %; p_fit {p.p_fit:.3f}; {fit})")
    click.echo(f"  p_fit from {fw.memory_note(w)}")
    shown = {"zero3_buffers": buffers_name(lay, fw)}             # DeepSpeed's step copies where they are that entry
    memory_shown = {shown.get(k, k): v for k, v in p.memory_breakdown.items()}
    for title, table in (("memory (GB)", memory_shown), ("time (s per step)", p.time_breakdown)):
        click.echo(f"  {title}: " + ", ".join(f"{k} {v:.3g}" for k, v in table.items()))
    if w.model.is_moe:
        click.echo("  " + moe_summary(lay, w, p))


@cli.command()
@workload_options
@click.option("--space", default="default", show_default=True, help="Search space name or TOML path.")
@click.option("--top", type=click.IntRange(min=1), default=10, show_default=True, help="How many layouts to list.")
@click.option("--all", "show_all", is_flag=True, help="Include layouts that do not fit in memory.")
@layout_options(pins=True)
@FORMAT_OPTION
def plan(model, nodes, cluster, global_batch, seq_length, precision, framework, grad_reduce, optimizer_moments, space,
         top, show_all, layout, fmt):
    """Rank every valid layout by the performance model (a planner answer in seconds). A layout option
    (--tp, --cp, --vp, --recompute, ...) pins that dimension.

    Example: tuner plan --model 175b --nodes 128 --top 5
    """
    w = make_workload(model, nodes, cluster, global_batch, precision, framework, grad_reduce, seq_length,
                      optimizer_moments)
    sp = load_space(space).pinned(layout)
    with collector_paused():
        layouts = valid_layouts(sp, w)
        t0 = time.perf_counter()
        ranking = plan_ranking(layouts, w, top, show_all)   # rank's first `top` rows, each layout's memory
        dt = time.perf_counter() - t0
    if not show_all and not ranking.may_fit:    # tuner.best (numpy, the correction) only to say why
        from tuner.best import require_fit
        require_fit(ranking.screened, w, sp)
    shown = ranking.shown
    rows = [{"rank": i + 1, **prediction_row(p, w)} for i, p in enumerate(shown)]
    objs = [{"rank": i + 1, **p.as_dict(), "memory_used_fraction": p.memory_gb / w.cluster.memory_gb,
             "headroom_ok": keeps_headroom(p, w), "risk": risk(p, w), "p_fit_basis": framework_of(w).memory_note(w)}
            for i, p in enumerate(shown)]
    if fmt == "table":
        click.echo(workload_line(w))
    click.echo(render(rows, fmt, json_obj=objs))
    if fmt == "table":
        roomy = sum(keeps_headroom(p, w) for p in ranking.screened if p.fits)
        n = len(ranking.screened)
        click.echo(f"\n{n} valid {w.framework} layouts, {ranking.may_fit} may fit in memory, {roomy} with "
                   f"p_fit >= {RECOMMEND_AT:g} (fits = yes; maybe = not ruled out); ranked by predicted samples/s x "
                   f"p_fit in {dt * 1000:.0f} ms ({n / max(dt, 1e-9):,.0f} layouts/s)\n"
                   f"p_fit from {framework_of(w).memory_note(w)}, and per-layout terms")
