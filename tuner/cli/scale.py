"""`tuner scale`: how many nodes, which machine, how long and how much (tuner.planning.scale answers)."""

from __future__ import annotations

import time
from pathlib import Path

import click

from tuner.cli import DB_OPTION, FORMAT_OPTION, cli
from tuner.cli.options import CLUSTERS, GRAD_REDUCE_OPTION, MODELS, MOMENTS_OPTION, SEQ_LENGTH_OPTION
from tuner.cli.render import render
from tuner.specs import PRECISIONS

#: What a JSON or CSV row carries (CSV: these columns; JSON: these and the phases, band and sources).
CSV_COLUMNS = ["cluster", "framework", "nodes", "gpus", "global_batch", "status", "layout_key", "samples_per_second",
               "mfu", "measured", "goodput", "failures_per_day", "checkpoint_interval_min", "raw_days", "days",
               "gpu_hours", "price_per_gpu_hour", "cost", "energy_mwh", "scaling_efficiency", "pareto",
               "meets_deadline", "chosen", "note"]


@cli.command()
@click.option("--model", required=True, help=f"Model {MODELS}.")
@click.option("--cluster", default="frontier", show_default=True,
              help=f"Cluster, or several comma-separated (h100,frontier): {CLUSTERS}.")
@click.option("--nodes", required=True,
              help="Node counts: 16,32,64, or FROM:TO doubling from FROM (16:512), or both (8,16:128).")
@click.option("--tokens", type=float, default=None, help="Tokens to train on (15e12); or --steps.")
@click.option("--steps", type=click.IntRange(min=1), default=None, help="Optimizer steps to train for; or --tokens.")
@click.option("--framework", default=None,
              help="Training stack(s): one, several comma-separated, or all (those that run the model there); "
                   "default: each cluster's.")
@click.option("--global-batch", type=click.IntRange(min=1), default=None,
              help="Global batch in sequences, the same at every node count (default: the model's recipe).")
@click.option("--batch-schedule", default=None,
              help="Global batch by tokens seen: GB@TOKENS,... from 0 (1024@0,2048@2.5e11).")
@click.option("--batch-per-gpu", type=click.IntRange(min=1), default=None,
              help="Weak scaling: sequences per GPU per step (global batch = this x GPUs).")
@SEQ_LENGTH_OPTION
@click.option("--precision", type=click.Choice(PRECISIONS), default="bf16", show_default=True, help="GEMM precision.")
@GRAD_REDUCE_OPTION
@MOMENTS_OPTION
@click.option("--price", default=None,
              help="Price per GPU-hour: one for all clusters (2.5) or per cluster (h100=2.5,frontier=1.8).")
@click.option("--deadline", type=float, default=None, help="Days: pick the cheapest point that trains within them.")
@click.option("--max-gpus", type=click.IntRange(min=1), default=None, help="Leave out node counts with more GPUs.")
@click.option("--space", default="default", show_default=True, help="Search space name or TOML path.")
@click.option("--jobs", type=click.IntRange(min=1), default=None,
              help="Worker processes for the predictions (default: the CPUs).")
@click.option("--out", type=click.Path(path_type=Path), default=None,
              help="Also write index.html and PNGs (time and cost against nodes, Pareto front, MFU) here.")
@click.option("--force", is_flag=True, help="Write into an --out directory that is not empty.")
@DB_OPTION
@FORMAT_OPTION
def scale(model, cluster, nodes, tokens, steps, framework, global_batch, batch_schedule, batch_per_gpu, seq_length,
          precision, grad_reduce, optimizer_moments, price, deadline, max_gpus, space, jobs, out, force, db, fmt):
    """How many nodes, which machine, how long, how much: for every cluster, framework and node count the
    best layout and its samples/s (measured where a stored study measured it, else `tuner best`'s corrected
    prediction), days to train with goodput (failures, checkpoints, restarts), GPU-hours, cost and energy;
    the Pareto set of days against cost, and with --deadline the cheapest point that meets it.

    Example: tuner scale --model 175b --cluster frontier --nodes 16:512 --tokens 3e11 --price 1.8 --deadline 30
    """
    from tuner.cli import read_store
    from tuner.scale_answer import answer_scale, scale_request
    t0 = time.perf_counter()
    req, notes = scale_request(model, cluster, nodes, tokens=tokens, steps=steps, framework=framework,
                               global_batch=global_batch, batch_schedule=batch_schedule, batch_per_gpu=batch_per_gpu,
                               seq_length=seq_length, precision=precision, grad_reduce=grad_reduce,
                               optimizer_moments=optimizer_moments, price=price, deadline=deadline, max_gpus=max_gpus)
    if out is not None:
        from tuner.cli.report import check_out_dir
        check_out_dir(out, force)
    result = answer_scale(req, notes, read_store(db, required=False), space, jobs, framework)
    if out is not None:
        from tuner.cli.outdir import write_files
        from tuner.scale_report import FIGURES, build_page
        write_files(out, build_page(result), remove=FIGURES)
    dt = time.perf_counter() - t0
    if fmt == "table":
        _print_table(result, out, dt)
    else:
        click.echo(render(result.rows, fmt, CSV_COLUMNS))


def _print_table(result, out, seconds: float) -> None:
    from tuner.scale_report import table_rows
    rows = table_rows(result.rows)
    width = 70
    for r in rows:
        r["note"] = r["note"] if len(r["note"]) <= width else r["note"][:width - 3] + "..."
    click.echo(render(rows, "table"))
    if result.sentence:
        click.echo(f"\n{result.sentence}")
    click.echo("")
    for n in result.notes:
        click.echo(f"- {n}")
    written = f"; wrote {out / 'index.html'}" if out is not None else ""
    click.echo(f"answered {sum(r['status'] == 'ok' for r in result.rows)} of {len(result.rows)} point(s) in "
               f"{seconds:.1f} s{written} (--format json: every row whole)")
