"""`tuner search` and `tuner resume`: parse, call tuner.study, render."""

from __future__ import annotations

import random
import re
import sys

import click

from tuner.cli import DB_OPTION, FORMAT_OPTION, cli
from tuner.cli.options import layout_options, workload_options
from tuner.cli.progress import ProgressView
from tuner.cli.query import best_rows, top_rows
from tuner.cli.render import render
from tuner.errors import UsageError
from tuner.runners import RUNNERS
from tuner.search import SEARCHERS
from tuner.search import STUDY_DEFAULTS
from tuner.space import load_space
from tuner.specs import make_workload, stored_framework

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,79}$")
ADJECTIVES = ("brisk", "calm", "eager", "keen", "lucid", "nimble", "quiet", "rapid", "steady", "swift", "vivid")
NOUNS = ("otter", "falcon", "lynx", "heron", "marten", "orca", "puffin", "raven", "tapir", "wren", "yak")


def check_study_name(name: str) -> str:
    if not NAME_RE.match(name) or ".." in name:
        raise UsageError(f"study name {name!r} is not allowed: use letters, digits, '.', '_' and '-' "
                         "(at most 80, starting with a letter or digit)")
    return name


def generated_name(model: str, nodes: int, taken: set[str]) -> str:
    rng = random.Random()
    while True:
        name = f"{model}-{nodes}n-{rng.choice(ADJECTIVES)}-{rng.choice(NOUNS)}-{rng.randint(100, 999)}"
        if name not in taken:
            return name


def _note(msg: str) -> None:
    click.echo(msg, err=True)


def run_and_show(store, rec, fmt: str, run, budget: int | None = None) -> None:
    """Run a study with the live view on stderr, then print the fastest layouts and the recommendation."""
    with ProgressView(rec.name, budget or rec.settings["budget"], sys.stderr) as view:
        result = run(on_progress=view.update)
    show_result(store, rec.name, result, fmt)


def show_result(store, name: str, result, fmt: str) -> None:
    outcome, searcher = result.outcome, result.searcher
    if fmt == "json":
        click.echo(render([], "json", json_obj={"study": name, "ran": outcome.ran, "pruned": outcome.pruned,
                                                "stopped_by": outcome.reason, "confidence": searcher.confidence,
                                                "stop_reason": searcher.stop_reason,
                                                "top": best_rows(store.trials(name), 5)}))
        return
    click.echo(render(top_rows(store, name, 5), fmt))
    if fmt != "table":
        return
    why = {"budget": "budget reached", "exhausted": "search space exhausted", "time-limit": "time limit reached",
           "converged": f"stopped early: {searcher.stop_reason}"}
    click.echo(f"\nstudy {name}: {outcome.ran} trial(s) ran, {outcome.pruned} pruned ({why[outcome.reason]}).")
    from tuner import study as studies
    fast = studies.fastest(store, name)
    if fast:
        t = fast[0]
        fw = stored_framework(store.get_study(name).workload)
        data = "--data-path PATH --tokenizer NAME" + ("" if fw == "megatron-deepspeed" else " (or --mock-data)")
        click.echo(f"recommended: {t.layout.key()} (trial {t.number}): {t.samples_per_second:.4g} samples/s, "
                   f"MFU {100 * t.mfu:.2f} %. Launch files ({fw}): tuner launch {name} --out launch/ "
                   f"--train-iters ITERS {data}")
    else:
        click.echo(f"no trial succeeded: see `tuner trials {name}` for why")


@cli.command()
@workload_options
@click.option("--space", default="default", show_default=True, help="Search space name or TOML path.")
@click.option("--runner", type=click.Choice(RUNNERS), default="sim", show_default=True,
              help="What runs a trial: the simulator (the model's prediction), your --command, DeepSpeed on "
              "this machine, or Slurm jobs.")
@click.option("--searcher", type=click.Choice(SEARCHERS), default=SEARCHERS[0], show_default=True,
              help="What proposes the next layout (guided: the model corrected by every measurement).")
@click.option("--budget", type=click.IntRange(min=1), default=50, show_default=True,
              help="Trials to run (pruned layouts cost nothing).")
@click.option("--parallel", type=click.IntRange(min=1), default=1, show_default=True, help="Trials in flight.")
@click.option("--study", default=None, help="Study name (default: a readable generated one).")
@DB_OPTION
@click.option("--seed", type=int, default=0, show_default=True, help="Random seed of the searcher and the simulator's noise.")
@FORMAT_OPTION
@click.option("--time-limit", type=click.FloatRange(min=0, min_open=True), default=None, help="Seconds; no new trials after it.")
@click.option("--no-prune", is_flag=True, help="Launch layouts the memory model says cannot fit.")
@click.option("--noise", type=click.FloatRange(min=0), default=0.0, show_default=True, help="sim: relative noise.")
@click.option("--sim-delay", type=click.FloatRange(min=0), default=0.0, show_default=True, help="sim: seconds per trial.")
@click.option("--command", "command", default=None, help="command runner: the training command per trial.")
@click.option("--gpus", type=click.IntRange(min=1), default=None, help="local runner: devices per trial.")
@click.option("--trial-timeout", type=click.FloatRange(min=0, min_open=True), default=None, help="Seconds per trial.")
@click.option("--template", type=click.Choice(["harness", "megatron"]), default=None, help="slurm: launch template.")
@click.option("--executor", type=click.Choice(["thread", "ray"]), default="thread", show_default=True,
              help="Where trials run: threads of this process, or a Ray worker pool.")
@click.option("--ray-address", default=None, help="Ray cluster address for --executor ray (default: start a local one).")
@click.option("--results-dir", default="results", show_default=True, help="Where trial directories go.")
@click.option("--warm-start", is_flag=True,
              help="guided: correct the model with every stored trial of this model and cluster (any node count).")
@click.option("--stop-threshold", type=click.FloatRange(0, 1, min_open=True, max_open=True),
              default=STUDY_DEFAULTS["stop_threshold"], show_default=True,
              help="guided: stop once 95 % confident that no layout trains more than this fraction faster "
                   "than the recommended one.")
@click.option("--no-stop", is_flag=True, help="guided: never stop before the budget.")
@click.option("--keep-going", is_flag=True,
              help="Run on even when trials fail the same way (default: stop after 3 in a row with no success).")
@click.option("--early-stop", type=click.FloatRange(0, 1, min_open=True, max_open=True), default=None,
              help="Stop a real trial whose throughput after warm-up is below this fraction of the best so far.")
@layout_options(pins=True)
def search(model, nodes, cluster, global_batch, precision, framework, layout, space, runner, searcher, budget, parallel, study, db, seed, fmt,
           time_limit, no_prune, noise, sim_delay, command, gpus, trial_timeout, template, executor, ray_address,
           results_dir, warm_start, stop_threshold, no_stop, keep_going, early_stop):
    """Start a study: propose layouts, run trials, store every result.

    Example: tuner search --model 175b --nodes 128 --budget 30
    """
    if nodes is None and runner == "local":
        nodes = 1
    w = make_workload(model, nodes, cluster, global_batch, precision, framework)
    sp = load_space(space).pinned(layout)
    from tuner import study as studies
    from tuner.store import open_store
    store = open_store(db)
    name = check_study_name(study) if study else generated_name(w.model.name, nodes, set(store.study_names()))
    if runner == "local" and gpus and gpus != w.gpus:
        raise UsageError(f"--gpus {gpus} but {w.model.name} on {nodes} x {w.cluster.name} node(s) is {w.gpus} "
                         f"GPUs: use --cluster local with --nodes 1, or --gpus {w.gpus}")
    settings = {"seed": seed, "budget": budget, "parallel": parallel, "time_limit": time_limit,
                "prune": not no_prune, "executor": executor, "results_dir": results_dir, "early_stop": early_stop,
                "warm_start": warm_start, "stop_threshold": stop_threshold, "no_stop": no_stop, "keep_going": keep_going,
                "executor_options": {"address": ray_address} if executor == "ray" else {},
                "runner_options": {k: v for k, v in {"noise": noise, "sim_delay": sim_delay, "command": command,
                                   "gpus": gpus, "trial_timeout": trial_timeout, "template": template}.items() if v}}
    rec = studies.create(store, studies.new_record(name, w, sp, searcher=searcher, runner=runner, **settings))
    click.echo(f"study {name}: {w.model.name} on {nodes} x {w.cluster.name} ({w.gpus} GPUs), {w.framework}, "
               f"searcher {searcher}, runner {runner}, store {store.url}", err=True)
    run_and_show(store, rec, fmt, lambda **kw: studies.run(store, rec, on_note=_note, **kw))


@cli.command()
@click.argument("name")
@click.option("--budget", type=click.IntRange(min=1), default=None, help="New total trial budget for the study.")
@click.option("--join", is_flag=True, help="Another driver is live on this study: leave its running trials alone.")
@click.option("--force", is_flag=True, help="Take the study over even if another driver seems to run it.")
@click.option("--ray-address", default=None, help="Run the rest of the study on this Ray cluster.")
@click.option("--keep-going", is_flag=True, help="Run on even when every trial fails the same way.")
@DB_OPTION
@FORMAT_OPTION
def resume(name, budget, join, force, ray_address, keep_going, db, fmt):
    """Continue an interrupted or finished study; nothing is lost or measured twice.

    Example: tuner resume my-study --budget 80
    """
    from tuner import study as studies
    from tuner.store import open_store
    store = open_store(db)
    rec = store.get_study(name)
    mode = "join" if join else "force" if force else "run"
    run_and_show(store, rec, fmt, lambda **kw: studies.resume(
        store, name, budget=budget, mode=mode, ray_address=ray_address, keep_going=keep_going, on_note=_note, **kw),
        budget)
