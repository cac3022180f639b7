"""`tuner studies`, `tuner trials`, `tuner best`, `tuner db upgrade`: read the store."""

from __future__ import annotations

import click

from tuner.cli import DB_OPTION, FORMAT_OPTION, cli
from tuner.cli.render import flat_layout, render
from tuner.errors import TunerError
from tuner.specs import load_cluster, load_model
from tuner.store import open_store, upgrade
from tuner.trial import Status

TRIAL_COLUMNS = ["trial", "status", "tp", "pp", "dp", "mb", "zero", "ckpt", "tflops", "peak_%", "pred_%", "mem_gb",
                 "message"]


def trial_row(t) -> dict:
    pct = lambda v: None if v is None else 100 * v
    return {"trial": t.number, "status": str(t.status), **flat_layout(t.layout.as_dict()),
            "tflops": t.tflops_per_gpu, "peak_%": pct(t.peak_fraction), "pred_%": pct(t.predicted_peak_fraction),
            "mem_gb": t.peak_memory_gb, "message": (t.message or "")[:60]}


def trial_json(t) -> dict:
    return {"trial": t.number, "study": t.study, "layout": t.layout.as_dict(), "status": str(t.status),
            "tflops_per_gpu": t.tflops_per_gpu, "peak_fraction": t.peak_fraction,
            "samples_per_second": t.samples_per_second, "peak_memory_gb": t.peak_memory_gb,
            "predicted": {"tflops_per_gpu": t.predicted_tflops_per_gpu, "peak_fraction": t.predicted_peak_fraction,
                          "memory_gb": t.predicted_memory_gb, "step_time_s": t.predicted_step_time_s},
            "message": t.message, "log_path": t.log_path, "runner": t.runner,
            "started": t.started, "ended": t.ended}


def best_rows(trials, k: int) -> list[dict]:
    ok = sorted((t for t in trials if t.status == Status.OK and t.peak_fraction is not None),
                key=lambda t: -t.peak_fraction)
    return [trial_json(t) for t in ok[:k]]


def top_rows(store, study: str, k: int) -> list[dict]:
    ok = [t for t in store.trials(study, [Status.OK]) if t.peak_fraction is not None]
    ok.sort(key=lambda t: -t.peak_fraction)
    return [{k_: v for k_, v in trial_row(t).items() if k_ != "message"} for t in ok[:k]]


@cli.command()
@DB_OPTION
@FORMAT_OPTION
def studies(db, fmt):
    """List the studies in the store.

    Example: tuner studies --format csv
    """
    store = open_store(db)
    rows = []
    for s in store.list_studies():
        counts = store.counts(s.name)
        rows.append({"study": s.name, "model": s.model, "cluster": s.cluster, "nodes": s.nodes,
                     "searcher": s.searcher, "runner": s.runner, "state": s.state,
                     "trials": sum(v for k, v in counts.items() if k != "pruned"), "ok": counts.get("ok", 0),
                     "pruned": counts.get("pruned", 0), "created": str(s.created)[:19]})
    click.echo(render(rows, fmt))


@cli.command()
@click.argument("name")
@click.option("--status", "statuses", multiple=True, type=click.Choice([s.value for s in Status]),
              help="Only trials with this status (repeatable).")
@DB_OPTION
@FORMAT_OPTION
def trials(name, statuses, db, fmt):
    """List the trials of a study.

    Example: tuner trials my-study --status ok --format json
    """
    store = open_store(db)
    store.get_study(name)
    ts = store.trials(name, [Status(s) for s in statuses] or None)
    click.echo(render([trial_row(t) for t in ts], fmt, TRIAL_COLUMNS, json_obj=[trial_json(t) for t in ts]))


def best_json(t, measured: bool) -> dict:
    return {"layout": t.layout.as_dict(), "tflops_per_gpu": t.tflops_per_gpu, "peak_fraction": t.peak_fraction,
            "status": str(t.status), "runner": t.runner, "measured": measured,
            "study": t.study, "trial": t.number}


@cli.command()
@click.option("--model", required=True, help="Model preset or TOML path.")
@click.option("--nodes", required=True, type=click.IntRange(min=1))
@click.option("--cluster", default="frontier", show_default=True)
@click.option("--study", default=None, help="Only this study.")
@click.option("-k", "k", type=click.IntRange(min=1), default=1, show_default=True, help="How many layouts.")
@DB_OPTION
@FORMAT_OPTION
def best(model, nodes, cluster, study, k, db, fmt):
    """The best known layout for a model, cluster and node count, across all studies.

    Example: tuner best --model 175b --nodes 128
    """
    model_name = load_model(model).name
    cluster_name = load_cluster(cluster).name
    store = open_store(db)
    if study:
        store.get_study(study)
    found = store.best(model_name, cluster_name, nodes, k=k, study=study)
    if not found and study:
        raise TunerError(f"study '{study}' has no finished trial of {model_name} on {nodes} x {cluster_name} node(s)")
    if not found:
        return predicted_best(store, model, nodes, cluster, k, fmt)
    objs = [best_json(t, measured=t.runner != "sim") for t in found]
    if fmt == "json":
        click.echo(render([], "json", json_obj=objs[0] if k == 1 else objs))
        return
    rows = [{"study": t.study, "trial": t.number, **flat_layout(t.layout.as_dict()), "tflops": t.tflops_per_gpu,
             "peak_%": 100 * t.peak_fraction, "runner": t.runner,
             "kind": "measured" if o["measured"] else "predicted (simulator)"} for t, o in zip(found, objs)]
    click.echo(render(rows, fmt))


def workload_history(store, model: str, cluster: str, exclude: str | None = None) -> tuple[list, dict]:
    """Every stored trial of `model` on `cluster` at any node count, and the studies they belong to."""
    studies = {st.name: st for st in store.list_studies()
               if st.model == model and st.cluster == cluster and st.name != exclude}
    return [t for name in studies for t in store.trials(name)], studies


def predicted_best(store, model: str, nodes: int, cluster: str, k: int, fmt: str) -> None:
    """No measurement at this node count: the model's best, corrected by measurements at other counts."""
    from tuner.space import load_space
    from tuner.specs import make_workload
    from tuner.transfer import best_for_unmeasured
    w = make_workload(model, nodes, cluster)
    records, studies = workload_history(store, w.model.name, w.cluster.name)
    rows = best_for_unmeasured(w, load_space(), records, k=k, studies=studies)
    objs = [{"layout": r["layout"].as_dict(), "tflops_per_gpu": r["tflops_per_gpu"], "peak_fraction": r["peak_fraction"],
             "status": "predicted", "runner": None, "measured": False, "predicted": True, "study": None, "trial": None,
             "raw_peak_fraction": r["raw_peak_fraction"], "memory_gb": r["memory_gb"], "p_fit": r["p_fit"],
             "uncertainty": r["uncertainty"], "evidence": r["evidence"]} for r in rows]
    if fmt == "json":
        click.echo(render([], "json", json_obj=objs[0] if k == 1 else objs))
        return
    ev = rows[0]["evidence"] if rows else {}
    table_rows = [{**flat_layout(o["layout"]), "tflops": o["tflops_per_gpu"], "peak_%": 100 * o["peak_fraction"],
                   "model_%": 100 * o["raw_peak_fraction"], "mem_gb": o["memory_gb"], "p_fit": o["p_fit"]} for o in objs]
    click.echo(render(table_rows, fmt))
    if fmt == "table":
        basis = (f"corrected by {ev.get('trials', 0)} trial(s) of {len(ev.get('studies', []))} studies at node counts "
                 f"{', '.join(map(str, ev.get('node_counts', [])))}" if ev.get("trials") else "the model alone (no "
                 f"stored trials of {w.model.name} on {w.cluster.name})")
        click.echo(f"\nPREDICTED, not measured: no trial of {w.model.name} on {nodes} x {w.cluster.name} node(s) "
                   f"in {store.url}; {basis}. Measure it: tuner search --model {model} --nodes {nodes} "
                   f"--cluster {cluster} --warm-start")


@cli.group()
def db():
    """Manage the results store."""


@db.command("upgrade")
@DB_OPTION
def db_upgrade(db):
    """Upgrade the store's schema to this tuner's version.

    Example: tuner db upgrade --db sqlite:///results/tuner.db
    """
    click.echo(upgrade(db))
