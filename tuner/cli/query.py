"""`tuner studies`, `tuner trials`, `tuner best`, `tuner db upgrade` / `current`: read the store."""

from __future__ import annotations

import click

from tuner.cli import DB_OPTION, FORMAT_OPTION, cli, read_store
from tuner.cli.options import CLUSTERS, FRAMEWORK_OPTION, GRAD_REDUCE_OPTION, MODELS, MOMENTS_OPTION, SEQ_LENGTH_OPTION
from tuner.study_options import OneNodeCount
from tuner.cli.render import flat_layout, render
from tuner.perfmodel.fit import trial_need_gb
from tuner.planning import best_json, predicted_json, stored_reserve_gb
from tuner.report import ok_trials
from tuner.errors import TunerError
from tuner.frameworks import of as framework_of
from tuner.layout import DIMENSIONS
from tuner.specs import PRECISIONS, stored_framework
from tuner.trial import Status

# Speed columns: samples_s and mfu_% (model FLOPs, no recompute: the ranking); mgt_tflops and mgt_peak_%
# are Megatron's count with recompute (the Frontier study's figure), reported beside it, never ranked on.
SPEED_COLUMNS = ["samples_s", "mfu_%", "mgt_tflops", "mgt_peak_%"]
TRIAL_COLUMNS = ["trial", "status", *(d.column for d in DIMENSIONS), *SPEED_COLUMNS, "pred_mfu_%", "mem_gb", "message"]


def pct(v):
    return None if v is None else 100 * v


def speed_cells(t) -> dict:
    """The speed columns of a trial, or of a dict, with samples_per_second, mfu, tflops_per_gpu, peak_fraction."""
    get = t.get if isinstance(t, dict) else lambda k: getattr(t, k)
    return {"samples_s": get("samples_per_second"), "mfu_%": pct(get("mfu")), "mgt_tflops": get("tflops_per_gpu"),
            "mgt_peak_%": pct(get("peak_fraction"))}


def trial_row(t, reserve_gb: float, width: int | None = None) -> dict:
    """A trial as a table/CSV row; the message cut to `width` characters (None: whole); `mem_gb` is plan's
    quantity for its layout (tuner.perfmodel.fit.trial_need_gb with the study's cluster reserve `reserve_gb`)."""
    msg = t.message or ""
    if width is not None and len(msg) > width:
        msg = msg[:width - 3] + "..."
    return {"trial": t.number, "status": str(t.status), **flat_layout(t.layout.as_dict()), **speed_cells(t),
            "pred_mfu_%": pct(t.predicted_mfu), "mem_gb": trial_need_gb(t, reserve_gb), "message": msg}


def trial_json(t) -> dict:
    return {"trial": t.number, "study": t.study, "layout": t.layout.as_dict(), "status": str(t.status),
            "samples_per_second": t.samples_per_second, "mfu": t.mfu,
            "tflops_per_gpu": t.tflops_per_gpu, "peak_fraction": t.peak_fraction, "peak_memory_gb": t.peak_memory_gb,
            "predicted": {"mfu": t.predicted_mfu, "tflops_per_gpu": t.predicted_tflops_per_gpu,
                          "peak_fraction": t.predicted_peak_fraction, "memory_gb": t.predicted_memory_gb,
                          "step_time_s": t.predicted_step_time_s},
            "message": t.message, "log_path": t.log_path, "runner": t.runner,
            "started": t.started, "ended": t.ended}


def best_rows(trials, k: int) -> list[dict]:
    return [trial_json(t) for t in ok_trials(trials)[:k]]


def top_rows(store, study: str, k: int) -> list[dict]:
    reserve = stored_reserve_gb(store.get_study(study).workload)
    return [{k_: v for k_, v in trial_row(t, reserve).items() if k_ != "message"}
            for t in ok_trials(store.trials(study, [Status.OK]))[:k]]


@cli.command()
@DB_OPTION
@FORMAT_OPTION
def studies(db, fmt):
    """List the studies in the store.

    Example: tuner studies --format csv
    """
    store = read_store(db)
    rows = []
    for s in store.list_studies():
        counts = store.counts(s.name)
        rows.append({"study": s.name, "model": s.model, "cluster": s.cluster, "nodes": s.nodes,
                     "global_batch": s.global_batch, "precision": s.workload.get("precision") or "bf16",  # older: bf16
                     "framework": stored_framework(s.workload), "searcher": s.searcher, "runner": s.runner, "state": s.state,
                     "trials": sum(v for k, v in counts.items() if k != "pruned"), "ok": counts.get("ok", 0),
                     "pruned": counts.get("pruned", 0), "created": str(s.created)[:19]})
    click.echo(render(rows, fmt))


@cli.command()
@click.argument("name")
@click.option("--status", "statuses", multiple=True, type=click.Choice([s.value for s in Status]),
              help="Only trials with this status (repeatable).")
@click.option("--wide", is_flag=True, help="Whole messages in the table (CSV and JSON always have them whole).")
@DB_OPTION
@FORMAT_OPTION
def trials(name, statuses, wide, db, fmt):
    """List the trials of a study, fastest first.

    Example: tuner trials my-study --status ok --format json
    """
    store = read_store(db)
    reserve = stored_reserve_gb(store.get_study(name).workload)
    ts = store.trials(name, [Status(s) for s in statuses] or None)
    ts = ok_trials(ts) + [t for t in ts if t.status != Status.OK or t.mfu is None]   # fastest first
    width = None if wide or fmt != "table" else 60
    click.echo(render([trial_row(t, reserve, width) for t in ts], fmt, TRIAL_COLUMNS, json_obj=[trial_json(t) for t in ts]))


@cli.command()
@click.option("--model", required=True, help=f"Model {MODELS}.")
@click.option("--nodes", required=True, type=OneNodeCount(),
              help="Node count to answer for (measured studies at it, else a corrected prediction).")
@click.option("--cluster", default="frontier", show_default=True, help=f"Cluster {CLUSTERS}.")
@click.option("--global-batch", type=click.IntRange(min=1), default=None,
              help="Global batch in samples (default: the model's). Studies at another one are evidence only.")
@SEQ_LENGTH_OPTION
@click.option("--precision", type=click.Choice(PRECISIONS), default="bf16", show_default=True,
              help="Only studies in this precision answer (bf16 and fp8 speeds do not compare).")
@FRAMEWORK_OPTION
@GRAD_REDUCE_OPTION
@MOMENTS_OPTION
@click.option("--study", default=None, help="Only this study.")
@click.option("-k", "k", type=click.IntRange(min=1), default=1, show_default=True, help="How many layouts.")
@DB_OPTION
@FORMAT_OPTION
def best(model, nodes, cluster, global_batch, seq_length, precision, framework, grad_reduce, optimizer_moments, study,
         k, db, fmt):
    """The fastest known layout (samples/s) for a model, cluster and node count, across all studies.

    Measured trials at that node count and global batch answer first; otherwise the performance model,
    corrected by every stored trial of the model and cluster, predicts one (with a 90 % interval on
    samples/s, p_fit = the probability that it fits in memory, and the memory headroom it keeps).

    Example: tuner best --model 175b --nodes 128
    """
    from tuner.best import best as best_layouts
    from tuner.specs import make_workload
    store = read_store(db, required=bool(study))
    if study and framework is None:           # one study's trials answer in its own framework
        framework = stored_framework(store.get_study(study).workload)
    w = make_workload(model, nodes, cluster, global_batch, precision, framework, grad_reduce, seq_length,
                      optimizer_moments)
    answer = best_layouts(store, w, k=k, study=study)
    found = answer.trials
    if not found and study:
        raise TunerError(f"study '{study}' has no finished trial of {w.model.name} on {nodes} x {w.cluster.name} "
                         f"node(s) at global batch {w.global_batch}")
    if not found:
        return predicted_best(store, w, answer.predicted, model, cluster, k, fmt)
    objs = [{**best_json(t, w.cluster.memory_reserved_gb), "framework": w.framework} for t in found]
    if fmt == "json":
        click.echo(render([], "json", json_obj=objs[0] if k == 1 else objs))
        return
    rows = [{"study": t.study, "trial": t.number, **flat_layout(t.layout.as_dict()), **speed_cells(t),
             "mem_gb": o["memory_gb"], "mem_%_of_hbm": pct(o["memory_gb"] and o["memory_gb"] / w.cluster.memory_gb),
             "runner": t.runner, "kind": "measured" if o["measured"] else "predicted (simulator)"}
            for t, o in zip(found, objs)]
    click.echo(render(rows, fmt))
    if fmt == "table" and all(o["simulated"] for o in objs):
        click.echo(f"\nSIMULATED, not measured: these trials are the simulator's (the performance model's own "
                   f"prediction); no study measured {w.model.name} on {w.nodes} x {w.cluster.name} node(s) at global "
                   f"batch {w.global_batch} with {w.framework}, and simulated trials correct no prediction. Measure "
                   f"it: tuner search --model {model} --nodes {w.nodes} --cluster {cluster} --framework {w.framework} "
                   "--runner local|slurm|command")


def predicted_best(store, w, rows: list, model: str, cluster: str, k: int, fmt: str) -> None:
    """No measurement at this node count: the model's fastest, corrected by measurements at other counts."""
    objs = [predicted_json(r, w.framework) for r in rows]
    if fmt == "json":
        click.echo(render([], "json", json_obj=objs[0] if k == 1 else objs))
        return
    table_rows = [{**flat_layout(o["layout"]), **speed_cells(o),
                   "samples_s_90%": "{:.4g}-{:.4g}".format(*o["samples_per_second_90"]),
                   "model_mfu_%": pct(o["raw_mfu"]), "mem_gb": o["memory_gb"],
                   "mem_%_of_hbm": pct(o["memory_used_fraction"]), "p_fit": o["p_fit"]} for o in objs]
    click.echo(render(table_rows, fmt))
    if fmt == "table":
        ev = rows[0]["evidence"]
        basis = (f"corrected by {ev.get('trials', 0)} measured trial(s) of {len(ev.get('studies', []))} studies at node "
                 f"counts {', '.join(map(str, ev.get('node_counts', [])))}" if ev.get("trials") else "the model alone (no "
                 f"stored measurements of {w.model.name} on {w.cluster.name} with {w.framework})")
        extra = f"; {ev['note'].split('; ', 1)[1]}" if "; " in ev.get("note", "") else ""   # what was left out
        click.echo(f"\nPREDICTED, not measured: no trial of {w.model.name} on {w.nodes} x {w.cluster.name} node(s) "
                   f"at global batch {w.global_batch} in {store.url if store else 'any store'}; {basis}{extra}. Layouts come "
                   f"first when they fit with probability >= 0.95 (p_fit: from {framework_of(w).memory_note(w)}; "
                   f"narrowed by measured peaks of this model). Measure it: tuner search --model "
                   f"{model} --nodes {w.nodes} --cluster {cluster} --framework {w.framework} --warm-start")
        riskier = objs[0].get("faster_if_it_fits")
        if riskier:
            click.echo(f"Faster if it fits: {riskier['key']}, predicted {riskier['faster_by']:+.1%} samples/s, at p_fit "
                       f"{riskier['p_fit']:.2f} ({riskier['memory_gb']:.1f} GB of {w.cluster.memory_gb:.1f}); one trial "
                       f"decides: tuner search --model {model} --nodes {w.nodes} --cluster {cluster} --framework "
                       f"{w.framework} {riskier['flags']} --budget 1")
        capped = [o for o in objs if o.get("p_fit_limited_by")]
        if capped:
            click.echo(f"p_fit of {len(capped)} listed layout(s) capped by a measured OOM (e.g. "
                       f"{capped[0]['p_fit_limited_by']}): a layout whose activations follow the OOM'd one's account (tp, cp, recompute) "
                       "fits only if the OOM was over by less than it saves")


@cli.group()
def db():
    """Manage the results store."""


@db.command("upgrade")
@DB_OPTION
def db_upgrade(db):
    """Upgrade the store's schema to this tuner's version (creating it if empty); say from which to which.

    Example: tuner db upgrade --db sqlite:///results/tuner.db
    """
    from tuner.store import upgrade
    click.echo(upgrade(db))


@db.command("current")
@DB_OPTION
def db_current(db):
    """Print the store's schema version and revision, and whether this tuner can use it as it is.

    Example: tuner db current --db sqlite:///results/tuner.db
    """
    from tuner.store import current
    click.echo(current(db))
