"""`tuner search` and `tuner resume`: parse, call tuner.study, render."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from tuner.cli import DB_OPTION, FORMAT_OPTION, cli
from tuner.cli.options import layout_options
from tuner.cli.progress import ProgressView
from tuner.cli.query import best_rows, top_rows
from tuner.cli.render import render
from tuner.errors import StudyExists, UsageError
from tuner.specs import Workload, stored_framework
from tuner.study_options import SETTINGS, search_workload


def search_workload_options(fn):
    """The workload's options as search takes them (--nodes: one count or several, study_options.NodeCounts)."""
    for o in reversed(search_workload()):
        fn = o.decorator()(fn)
    return fn


CONFIG_TABLES = "tuner.config_tables"


def placeholder(key: str) -> str:
    """What --config puts in place of a [model] / [cluster] / [space] table until search() reads it."""
    return f"<[{key}] of --config>"


def _read_config(ctx, param, path):
    """--config: the file's keys become this command's defaults (a flag given on the command line wins)."""
    if path is None:
        return None
    from tuner.config import TABLES, check, read
    o = check(read(path), f"--config {path}")
    ctx.meta[CONFIG_TABLES] = {k: v for k, v in o.items() if k in TABLES and isinstance(v, dict)}
    defaults = {k: placeholder(k) if k in ctx.meta[CONFIG_TABLES] else v for k, v in o.items()}
    defaults.pop("runner_options", None)
    ctx.default_map = {**(ctx.default_map or {}), **defaults}
    return path


def study_settings(fn):
    """The study's settings (tuner.study_options.SETTINGS) as this command's options, --db after --study and
    --format after --seed, in the order --help has always listed them."""
    after = {"study": DB_OPTION, "seed": FORMAT_OPTION}
    for o in reversed(SETTINGS):
        fn = after[o.name](fn) if o.name in after else fn
        fn = o.decorator()(fn)
    return fn


def run_and_show(store, rec, fmt: str, run, budget: int | None = None) -> None:
    """Run a study with the live view on stderr, then print the fastest layouts and the recommendation."""
    try:
        with ProgressView(rec.name, budget or rec.settings["budget"], sys.stderr) as view:
            result = run(on_progress=view.update)
    except KeyboardInterrupt as exc:    # Ctrl-C / SIGTERM outside the driver's loop (its searcher being set up)
        raise _interrupted(exc, f"while study {rec.name} was being set up (no trial running)",
                           f"with `tuner resume {rec.name}`") from None
    show_result(store, rec.name, result, fmt)


def _interrupted(exc: KeyboardInterrupt, where: str, resume: str):
    """A Ctrl-C / SIGTERM (`exc`) outside the driver's loop as the driver's Interrupted: what it stopped, how to go on
    (exit 130, or 128 + the signal's number)."""
    from tuner.driver import Interrupted
    signum = getattr(exc, "signum", None)
    err = Interrupted(f"{f'terminated by {exc}' if signum else 'interrupted'} {where}; continue {resume}")
    err.exit_code = 128 + signum if signum else err.exit_code
    return err


class _Closing:
    """stdout for a study's closing lines; once its reader has gone (`tuner search ... | head -1`) the lines
    that say how the study ended go to stderr instead, the study is done either way, and the exit stays 0."""

    def __init__(self):
        self.broken = False

    def echo(self, text: str, listing: bool = False) -> None:
        if not self.broken:
            try:
                click.echo(text)
                sys.stdout.flush()
                return
            except BrokenPipeError:
                self.broken = True
                from tuner.cli import _quiet_stdout
                _quiet_stdout()          # so that the interpreter's last flush does not fail again
        if not listing:
            click.echo(text, err=True)


WHY = {"budget": "budget reached", "exhausted": "search space exhausted", "time-limit": "time limit reached",
       "converged": "stopped early"}


def show_result(store, name: str, result, fmt: str) -> None:
    outcome, searcher = result.outcome, result.searcher
    out = _Closing()
    if fmt == "json":
        out.echo(render([], "json", json_obj={"study": name, "ran": outcome.ran, "pruned": outcome.pruned,
                                                "stopped_by": outcome.reason, "confidence": searcher.confidence,
                                                "stop_reason": searcher.stop_reason,
                                                "top": best_rows(store.trials(name), 5)}))
        return
    out.echo(render(top_rows(store, name, 5), fmt), listing=True)
    if fmt != "table":
        return
    why = {**WHY, "converged": f"stopped early: {searcher.stop_reason}"}
    trials = store.trials(name)           # this driver's, and those of earlier runs or of drivers that joined
    stored = len(trials)
    in_all = f"; {stored} in the study" if stored != outcome.ran + outcome.pruned else ""
    out.echo(f"\nstudy {name}: {outcome.ran} trial(s) ran, {outcome.pruned} pruned ({why[outcome.reason]}){in_all}.")
    from tuner import study as studies
    fast = studies.fastest(store, name)
    if fast:
        t = fast[0]
        out.echo(f"recommended: {t.layout.key()} (trial {t.number}): {t.samples_per_second:.4g} samples/s, "
                 f"MFU {100 * t.mfu:.2f} %. {_launch_hint(store, name, t.layout)}")
        note = belief_note(name, trials, searcher, t)
        if note:
            out.echo(note)
        if t.mfu > 1:
            _above_peak(store, name, t)
    else:
        out.echo(f"no trial succeeded: see `tuner trials {name}` for why")


def belief_note(name: str, trials, searcher, recommended) -> str | None:
    """Where the guided searcher's belief (the model corrected by every trial: GuidedSearcher.believed_fastest) puts
    another trial of study `name` that ran ahead of the recommendation, the fastest measured: the lines that name it
    and the commands that measure both again (issue 30 round 30: under a few percent of run-to-run noise the fastest
    measurement is not always the fastest layout); else None."""
    from tuner.trial import Status
    pick = getattr(searcher, "believed_fastest", None)
    ran = [t for t in trials if t.status == Status.OK and t.samples_per_second]
    lay = pick([t.layout for t in ran]) if pick else None
    other = next((t for t in ran if t.layout == lay), None)
    if other is None or lay == recommended.layout:
        return None
    gap = 100 * (1 - other.samples_per_second / recommended.samples_per_second)
    again = "; ".join(f"tuner search --config study.toml --study {name}-again-{k} --budget 1 {t.layout.flags()}"
                      for k, t in ((recommended.number, recommended), (other.number, other)))
    return (f"within the noise: the study's belief (the model corrected by every trial) puts trial {other.number}, "
            f"{lay.key()}, measured {f'{gap:.1f} %' if gap >= 0.05 else 'under 0.05 %'} slower, ahead of it. Measure "
            f"both again to settle it: "
            f"tuner config {name} --out study.toml; {again}")


def _above_peak(store, name: str, trial) -> None:
    """A measured MFU above 100 %: the cluster's peak is too low (a calibration on a busy machine, a typo)."""
    c = Workload.from_dict(store.get_study(name).workload).cluster
    click.echo(f"warning: trial {trial.number} ran at MFU {100 * trial.mfu:.0f} %, faster than cluster {c.name}'s "
               f"peak_tflops ({c.peak_tflops:.4g} TFLOPS per GPU) allows: that peak is too low, so every MFU of this "
               f"study is overstated; measure it again (tuner calibrate --force, on an idle machine) or correct "
               f"peak_tflops in the cluster file", err=True)


def _launch_hint(store, name: str, layout) -> str:
    """The `tuner launch` command for the recommendation, or why its framework's files cannot express it."""
    from tuner.errors import UsageError as Refused
    from tuner.render.launch import launch_files
    w = Workload.from_dict(store.get_study(name).workload)
    try:
        launch_files(layout, w, framework=w.framework, data_path="PATH", tokenizer="NAME")
    except Refused as exc:
        return f"No launch files ({w.framework}): {exc}"
    data = "--data-path PATH --tokenizer NAME" + ("" if w.framework == "megatron-deepspeed" else " (or --mock-data)")
    return f"Launch files ({w.framework}): tuner launch {name} --out launch/ --train-iters ITERS {data}"


@cli.command()
@click.option("--config", type=click.Path(dir_okay=False, path_type=Path), default=None, is_eager=True,
              callback=_read_config, help="A study.toml: every option below as a key (`tuner config NAME` writes one).")
@search_workload_options
@study_settings
@layout_options(pins=True)
def search(layout, db, fmt, config, **options):
    """Start a study: propose layouts, run trials, store every result.

    Every option may also come from a study.toml (--config; `tuner config NAME` writes a stored
    study's): a flag given here wins over the file.

    Example: tuner search --model 175b --nodes 128 --budget 30

    Several node counts (the curve's shape, a few trials each): tuner search --model 22b --nodes 4,8 --budget 4
    """
    from tuner import study as studies, study_group as group
    from tuner.config import record
    from tuner.store import open_store
    tables = click.get_current_context().meta.get(CONFIG_TABLES, {})
    options = {**options, **layout, **{k: v for k, v in tables.items() if options.get(k) in (placeholder(k), None)}}
    if isinstance(options["nodes"], tuple):           # several counts (study_options.NodeCounts)
        return search_group(options, options["nodes"], db, fmt)
    store = open_store(db)
    groups = group.names(store)                   # a multi-node search's name is no single study's
    if options.get("study") in groups:
        raise StudyExists(options["study"])
    rec = studies.create(store, record(options, set(store.study_names()) | groups))
    w = Workload.from_dict(rec.workload)
    click.echo(f"study {rec.name}: {w.model.name} on {w.nodes} x {w.cluster.name} ({w.gpus} GPUs), {w.framework}, "
               f"searcher {rec.searcher}, runner {rec.runner}, store {store.url}", err=True)
    run_and_show(store, rec, fmt, lambda **kw: studies.run(store, rec, **kw))


def search_group(options: dict, counts: tuple[int, ...], db, fmt: str) -> None:
    """`tuner search --nodes 32,64`: one linked study per count (tuner.study_group), run in turn."""
    from tuner import study as studies, study_group as group
    from tuner.config import record
    from tuner.store import open_store
    store = open_store(db)
    taken = set(store.study_names())
    build = lambda n, name: record({**options, "nodes": n, "study": studies.check_study_name(name)}, taken)  # noqa: E731
    first = Workload.from_dict(record({**options, "nodes": counts[0], "study": None}, taken).workload)
    name = studies.check_study_name(options["study"]) if options.get("study") else studies.generated_name(
        first.model.name, f"{counts[0]}-{counts[-1]}", taken)
    recs = group.create(store, group.records(build, name, counts, taken))
    click.echo(f"study group {name}: {first.model.name} on {', '.join(map(str, counts))} x {first.cluster.name} nodes, "
               f"{first.framework}: studies {', '.join(r.name for r in recs)}, {recs[0].settings['budget']} trial(s) "
               f"each, searcher {recs[0].searcher}, runner {recs[0].runner}, store {store.url}", err=True)
    run_members(store, name, recs, fmt, lambda rec, **kw: studies.run(store, rec, **kw))


def run_members(store, name: str, recs: list, fmt: str, run, budget: int | None = None) -> None:
    """Run a group's members in turn with the live view, then print the curve: per count the fastest trial."""
    from tuner import study_group as group
    from tuner.driver import Interrupted
    ran = []
    for rec in recs:
        try:
            with ProgressView(rec.name, budget or rec.settings["budget"], sys.stderr) as view:
                result = run(rec, on_progress=view.update)
        except Interrupted as exc:          # the resume hint names the group: the later counts have not run
            exc.args = (f"{exc}; the whole multi-node search: `tuner resume {name}`",)
            raise
        except KeyboardInterrupt as exc:    # Ctrl-C / SIGTERM outside the driver's loop (a count being set up)
            raise _interrupted(exc, f"at study {rec.name}", f"the multi-node search with `tuner resume {name}`") \
                from None
        ran.append({"study": rec.name, "nodes": rec.nodes, "ran": result.outcome.ran, "pruned": result.outcome.pruned,
                    "stopped_by": result.outcome.reason, "stop_reason": result.searcher.stop_reason})
    rows = group.curve(store, [store.get_study(r.name) for r in recs])
    out = _Closing()
    if fmt == "json":
        out.echo(render([], "json", json_obj={"group": name, "studies": ran, "curve": rows}))
        return
    out.echo(render([{**r, "layout": r["layout"] or "-"} for r in rows], fmt), listing=True)
    if fmt != "table":
        return
    for r in ran:
        why = f"stopped early: {r['stop_reason']}" if r["stopped_by"] == "converged" else WHY[r["stopped_by"]]
        out.echo(f"study {r['study']}: {r['ran']} trial(s) ran, {r['pruned']} pruned ({why}).")
    sim = [r["study"] for r in rows if r["layout"] and not r["measured"]]
    out.echo(("\nsimulated, not measured: " + ", ".join(sim) + " (the model's own prediction). " if sim else "\n") +
             f"efficiency: per-GPU samples/s over the first count's. At {', '.join(str(r['nodes']) for r in rows)} "
             f"nodes `tuner best` answers with these and `tuner scale` with the measured ones; "
             f"`tuner resume {name}` continues them all.")


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
    """Continue an interrupted or finished study; nothing is lost or measured twice. NAME may be a multi-node
    search's group (`tuner search --nodes 32,64`): its studies continue in turn (--budget: each one's).

    Example: tuner resume my-study --budget 80
    """
    from tuner import study as studies, study_group as group
    from tuner.store import open_store
    store = open_store(db, create=False)      # nothing to resume where no store is: never create one
    click.echo(f"store: {store.url}", err=True)
    mode = "join" if join else "force" if force else "run"
    members = group.members(store, name) if name not in store.study_names() else []
    if members:                     # a multi-node search's group: every member, in turn
        run_members(store, name, members, fmt, lambda rec, **kw: studies.resume(
            store, rec.name, budget=budget, mode=mode, ray_address=ray_address, keep_going=keep_going, **kw), budget)
        return
    rec = store.get_study(name)
    run_and_show(store, rec, fmt, lambda **kw: studies.resume(
        store, name, budget=budget, mode=mode, ray_address=ray_address, keep_going=keep_going, **kw),
        budget)


@cli.command("config")
@click.argument("name")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="File to write (default stdout).")
@click.option("--force", is_flag=True, help="Overwrite an existing --out file.")
@DB_OPTION
def config_cmd(name, out, force, db):
    """Write a stored study's settings as a study.toml that `tuner search --config` reads.

    Example: tuner config my-study --out study.toml && tuner search --config study.toml --study my-study-2
    """
    from tuner.cli import read_store
    from tuner.config import dumps
    text = dumps(read_store(db).get_study(name))
    if out is None:
        click.echo(text, nl=False)
        return
    if out.exists() and not force:
        raise UsageError(f"--out {out} exists: choose another file, or pass --force to overwrite it")
    if not out.parent.is_dir():
        raise UsageError(f"--out {out}: directory {out.parent} does not exist: create it, or choose another --out")
    out.write_text(text)
    click.echo(f"wrote study {name}'s settings to {out}", err=True)
