"""`tuner search` and `tuner resume`: run a study through the driver."""

from __future__ import annotations

import random
import re
import sys
from pathlib import Path

import click

from tuner.cli import DB_OPTION, FORMAT_OPTION, cli
from tuner.cli.plan import require_fit, workload_options
from tuner.cli.progress import ProgressView
from tuner.cli.query import best_rows, fastest, top_rows, workload_history
from tuner.cli.render import render
from tuner import lease
from tuner.driver import Driver
from tuner.errors import UsageError
from tuner.perfmodel import predict as model_predict
from tuner.executors import make_executor
from tuner.runners import RUNNERS, make_runner
from tuner.search import SEARCHERS, make_searcher
from tuner.search.guided import STUDY_DEFAULTS
from tuner.space import SearchSpace, load_space, no_layout_reason
from tuner.specs import Workload, make_workload
from tuner.store import StudyRecord, open_store
from tuner.trial import Status

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


def runner_for(name: str, opts: dict, workload: Workload, seed: int, results_dir: Path):
    """The runner of a study, from the options stored with it."""
    if name == "sim":
        return make_runner("sim", noise=opts.get("noise", 0.0), delay=opts.get("sim_delay", 0.0), seed=seed)
    common = {"trial_timeout": opts.get("trial_timeout"), "results_dir": results_dir}
    if name == "command":
        if not opts.get("command"):
            raise UsageError("--runner command needs --command \"CMD ...\" (the training command to run per trial)")
        return make_runner("command", command=opts["command"], **common)
    if name == "local":
        return make_runner("local", gpus=opts.get("gpus") or workload.gpus, **common)
    if name == "slurm":
        # node failures: the driver retries a retryable result once, so the runner does not resubmit too
        return make_runner("slurm", cluster=workload.cluster, template=opts.get("template") or "harness",
                           node_fail_retries=0, **common)
    return make_runner(name)


def warm_start_history(store, rec: StudyRecord, workload: Workload) -> tuple[list, dict]:
    """Stored trials of the same model and cluster at any node count, from other studies."""
    from tuner.transfer import warm_start_records
    records, studies = workload_history(store, workload.model.name, workload.cluster.name, exclude=rec.name)
    ev = warm_start_records(records, workload, studies).evidence
    if not ev.get("trials"):
        click.echo(f"warning: --warm-start found no stored trials of {workload.model.name} on "
                   f"{workload.cluster.name}: starting cold", err=True)
        return [], {}
    click.echo(f"warm start from {ev['trials']} trial(s) of {len(studies)} studies at node counts "
               f"{', '.join(map(str, ev.get('node_counts', [])))}", err=True)
    return records, studies


def run_study(store, rec: StudyRecord, fmt: str, budget: int | None = None, resumed: bool = False,
              lease_mode: str = "run", keep_going: bool = False) -> None:
    s = rec.settings
    workload = Workload.from_dict(rec.workload)
    space = SearchSpace.from_dict({k: v for k, v in rec.space.items() if k != "name"}, rec.space.get("name", "space"))
    candidates = space.enumerate_layouts(workload)
    if not candidates:
        raise UsageError(f"no valid layout for {workload.model.name} on {workload.nodes} node(s) "
                         f"({workload.gpus} GPUs): {no_layout_reason(space, workload)}")
    results_dir = Path(s.get("results_dir", "results"))
    runner = runner_for(rec.runner, s.get("runner_options", {}), workload, s.get("seed", 0), results_dir)
    if resumed and hasattr(runner, "cancel_study_jobs"):   # no orphan jobs or processes from a dead driver
        gone = runner.cancel_study_jobs(rec.name)
        if gone:
            what = "Slurm job(s)" if rec.runner == "slurm" else "trial(s) whose processes were still running"
            click.echo(f"stopped {len(gone)} {what} left by the stopped driver: {', '.join(map(str, gone))}",
                       err=True)
    options = {}
    if rec.searcher == "guided":
        options.update(STUDY_DEFAULTS)
        threshold = s.get("stop_threshold", STUDY_DEFAULTS["stop_threshold"])
        options["stop_threshold"] = None if s.get("no_stop") or not threshold else threshold   # 0: an old study's "never"
        if s.get("warm_start"):
            options["history"], options["history_studies"] = warm_start_history(store, rec, workload)
    searcher = make_searcher(rec.searcher, candidates, seed=s.get("seed", 0), workload=workload,
                             parallel=s.get("parallel", 1), **options)
    executor = make_executor(s.get("executor", "thread"), s.get("parallel", 1), **s.get("executor_options", {}))
    view = ProgressView(rec.name, budget or s["budget"], sys.stderr)
    driver = Driver(store=store, study=rec.name, workload=workload, space=space, searcher=searcher, runner=runner,
                    executor=executor, budget=budget or s["budget"], parallel=s.get("parallel", 1),
                    time_limit=s.get("time_limit"), prune=s.get("prune", True), results_dir=results_dir,
                    on_progress=view.update, early_stop=s.get("early_stop"), lease_mode=lease_mode,
                    keep_going=keep_going or s.get("keep_going", False))
    store.set_study_state(rec.name, "running")
    with view:
        outcome = driver.run()
    executor.shutdown()
    store.set_study_state(rec.name, "done")
    rows = top_rows(store, rec.name, 5)
    if fmt == "json":
        click.echo(render([], "json", json_obj={"study": rec.name, "ran": outcome.ran, "pruned": outcome.pruned,
                                                "stopped_by": outcome.reason, "confidence": searcher.confidence,
                                                "stop_reason": searcher.stop_reason,
                                                "top": best_rows(store.trials(rec.name), 5)}))
        return
    click.echo(render(rows, fmt))
    if fmt == "table":
        why = {"budget": "budget reached", "exhausted": "search space exhausted", "time-limit": "time limit reached",
               "converged": f"stopped early: {searcher.stop_reason}"}
        click.echo(f"\nstudy {rec.name}: {outcome.ran} trial(s) ran, {outcome.pruned} pruned ({why[outcome.reason]}).")
        fast = fastest(store.trials(rec.name, [Status.OK]))
        if fast:
            t = fast[0]
            click.echo(f"recommended: {t.layout.key()} (trial {t.number}): {t.samples_per_second:.4g} samples/s, "
                       f"MFU {100 * t.mfu:.2f} %. Launch files: tuner launch {rec.name} --out launch/")
        else:
            click.echo(f"no trial succeeded: see `tuner trials {rec.name}` for why")


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
def search(model, nodes, cluster, global_batch, space, runner, searcher, budget, parallel, study, db, seed, fmt,
           time_limit, no_prune, noise, sim_delay, command, gpus, trial_timeout, template, executor, ray_address,
           results_dir, warm_start, stop_threshold, no_stop, keep_going, early_stop):
    """Start a study: propose layouts, run trials, store every result.

    Example: tuner search --model 175b --nodes 128 --budget 30
    """
    if nodes is None and runner == "local":
        nodes = 1
    w = make_workload(model, nodes, cluster, global_batch)
    sp = load_space(space)
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
    rec = StudyRecord(name=name, workload=w.as_dict(), space={"name": sp.name, "dimensions": sp.dimensions,
                      "constraints": sp.constraints}, searcher=searcher, runner=runner, settings=settings)
    layouts = sp.enumerate_layouts(w)
    if not layouts:
        raise UsageError(f"no valid layout for {w.model.name} on {nodes} node(s) ({w.gpus} GPUs): "
                         f"{no_layout_reason(sp, w)}")
    runner_for(runner, settings["runner_options"], w, seed, Path(results_dir))  # bad runner input fails before storing
    if not no_prune:                # a study that can only prune would store a dead study
        require_fit([model_predict(lay, w) for lay in layouts], w)
    if executor == "ray" and ray_address:
        from tuner.ray_pool import check_address
        check_address(ray_address)
    store.create_study(rec)
    click.echo(f"study {name}: {w.model.name} on {nodes} x {w.cluster.name} ({w.gpus} GPUs), searcher {searcher}, "
               f"runner {runner}, store {store.url}", err=True)
    run_study(store, store.get_study(name), fmt)


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
    store = open_store(db)
    store.get_study(name)
    mode = "join" if join else "force" if force else "run"
    store.modify_study_settings(name, lambda st: lease.take(st, name, mode))   # one driver gets in, atomically
    if not join:
        n = store.mark_interrupted(name)
        if n:
            click.echo(f"{n} trial(s) left running by a stopped driver will run again", err=True)
    if ray_address:
        from tuner.ray_pool import check_address
        check_address(ray_address)
        store.update_study_settings(name, {"executor": "ray", "executor_options": {"address": ray_address}})
    if budget:
        store.update_study_settings(name, {"budget": budget})
    rec = store.get_study(name)
    run_study(store, rec, fmt, resumed=not join, lease_mode=mode, keep_going=keep_going)
