"""`tuner search` and `tuner resume`: parse, call tuner.study, render."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from tuner.cli import DB_OPTION, FORMAT_OPTION, cli
from tuner.cli.options import layout_options, workload_options
from tuner.cli.progress import ProgressView
from tuner.cli.query import best_rows, top_rows
from tuner.cli.render import render
from tuner.errors import UsageError
from tuner.specs import Workload, stored_framework
from tuner.study_options import SETTINGS

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
    with ProgressView(rec.name, budget or rec.settings["budget"], sys.stderr) as view:
        result = run(on_progress=view.update)
    show_result(store, rec.name, result, fmt)


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
    why = {"budget": "budget reached", "exhausted": "search space exhausted", "time-limit": "time limit reached",
           "converged": f"stopped early: {searcher.stop_reason}"}
    stored = len(store.trials(name))      # this driver's, and those of earlier runs or of drivers that joined
    in_all = f"; {stored} in the study" if stored != outcome.ran + outcome.pruned else ""
    out.echo(f"\nstudy {name}: {outcome.ran} trial(s) ran, {outcome.pruned} pruned ({why[outcome.reason]}){in_all}.")
    from tuner import study as studies
    fast = studies.fastest(store, name)
    if fast:
        t = fast[0]
        out.echo(f"recommended: {t.layout.key()} (trial {t.number}): {t.samples_per_second:.4g} samples/s, "
                 f"MFU {100 * t.mfu:.2f} %. {_launch_hint(store, name, t.layout)}")
    else:
        out.echo(f"no trial succeeded: see `tuner trials {name}` for why")


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
@workload_options
@study_settings
@layout_options(pins=True)
def search(layout, db, fmt, config, **options):
    """Start a study: propose layouts, run trials, store every result.

    Every option may also come from a study.toml (--config; `tuner config NAME` writes a stored
    study's): a flag given here wins over the file.

    Example: tuner search --model 175b --nodes 128 --budget 30
    """
    from tuner import study as studies
    from tuner.config import record
    from tuner.store import open_store
    tables = click.get_current_context().meta.get(CONFIG_TABLES, {})
    options = {**options, **layout, **{k: v for k, v in tables.items() if options.get(k) in (placeholder(k), None)}}
    store = open_store(db)
    rec = studies.create(store, record(options, set(store.study_names())))
    w = Workload.from_dict(rec.workload)
    click.echo(f"study {rec.name}: {w.model.name} on {w.nodes} x {w.cluster.name} ({w.gpus} GPUs), {w.framework}, "
               f"searcher {rec.searcher}, runner {rec.runner}, store {store.url}", err=True)
    run_and_show(store, rec, fmt, lambda **kw: studies.run(store, rec, **kw))


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
