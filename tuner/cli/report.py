"""`tuner report`, `tuner export`, `tuner launch`: a study's page, its trials as a file, the launch files."""

from __future__ import annotations

import dataclasses
import json
import shlex
import time
from pathlib import Path

import click

from tuner.cli import DB_OPTION, cli, read_store
from tuner.cli.options import CLUSTERS, GRAD_REDUCE_OPTION, MODELS, MOMENTS_OPTION, SEQ_LENGTH_OPTION
from tuner.study_options import OneNodeCount
from tuner.cli.outdir import write_files
from tuner.layout import DIMENSIONS
from tuner.cli.render import to_csv
from tuner.errors import MissingExtra, TunerError, UsageError
from tuner.launch import Source
from tuner.frameworks import runnable
from tuner.render.launch import FRAMEWORK_FILES, FRAMEWORKS, OPTIONAL_FILES, launch_files
from tuner.report import EXPORT_COLUMNS, FIGURES, build_report, export_rows, ok_trials
from tuner.specs import Workload, load_cluster, make_workload

EXPORT_FORMATS = ("csv", "json", "parquet", "optuna")


def check_out_dir(out: Path, force: bool) -> None:
    """Refuse a path that is a file, or a directory that exists and is not empty, unless --force."""
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} exists and is not a directory: choose another --out")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise UsageError(f"--out {out} exists and is not empty: choose another --out, or pass --force to "
                         "overwrite the files tuner writes there")


@cli.command()
@click.argument("name")
@click.option("--out", type=click.Path(path_type=Path), default=None,
              help="Directory for index.html and the PNGs (default results/reports/NAME).")
@click.option("--force", is_flag=True, help="Write into an --out directory that is not empty.")
@DB_OPTION
def report(name, out, force, db):
    """Write a study's HTML report: best so far, TP x PP heatmap, model error, status counts, top ten.

    index.html embeds its figures, so that one file is the whole report; the PNGs are written beside it.

    Example: tuner report my-study --out report/ && xdg-open report/index.html
    """
    t0 = time.perf_counter()
    store = read_store(db)
    rec = store.get_study(name)
    out = out or Path("results") / "reports" / name
    check_out_dir(out, force)
    trials = store.trials(name)
    rep = build_report(rec, trials)
    write_files(out, rep.files(), remove=FIGURES)     # and the figures of an earlier report that has none now
    dt = time.perf_counter() - t0
    if not rep.finished:
        click.echo(f"study {name} has no finished trials yet: the report says so and has no plots", err=True)
    click.echo(f"wrote {out / 'index.html'} ({len(trials)} trial(s), {rep.finished} finished, {rep.ok} ok, "
               f"{len(rep.figures)} figure(s)) in {dt:.2f} s")


def parquet_bytes(rows: list[dict]) -> bytes:
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise MissingExtra("pyarrow", "report") from None
    import io
    from datetime import datetime
    types = {"study": pa.string(), "trial": pa.int64(), "layout_key": pa.string(),
             **{d.name: {bool: pa.bool_(), int: pa.int64(), str: pa.string()}[d.type] for d in DIMENSIONS},
             "status": pa.string(), "runner": pa.string(),
             "attempts": pa.int64(), "started": pa.timestamp("us", tz="UTC"), "ended": pa.timestamp("us", tz="UTC"),
             "message": pa.string(), "log_path": pa.string()}
    schema = pa.schema([(c, types.get(c, pa.float64())) for c in EXPORT_COLUMNS])
    stamp = lambda v: None if v is None else datetime.fromisoformat(v)
    cols = {c: [stamp(r[c]) if c in ("started", "ended") else r[c] for r in rows] for c in EXPORT_COLUMNS}
    buf = io.BytesIO()
    pq.write_table(pa.table(cols, schema=schema), buf)
    return buf.getvalue()


@cli.command()
@click.argument("name")
@click.option("--format", "fmt", type=click.Choice(EXPORT_FORMATS), default="csv", show_default=True,
              help="csv and json (records) print to stdout without --out; parquet needs the 'report' extra; "
              "optuna writes an optuna study to --storage.")
@click.option("--out", type=click.Path(path_type=Path, dir_okay=False), default=None,
              help="File to write (default stdout; required for parquet).")
@click.option("--storage", default=None, help="--format optuna: the optuna storage URL to write the study to "
              "(e.g. sqlite:///optuna.db), a database of its own, not --db.")
@click.option("--force", is_flag=True, help="Overwrite an existing --out file (optuna: replace the study of that name "
              "in --storage).")
@DB_OPTION
def export(name, fmt, out, storage, force, db):
    """Export every trial of a study: layout, status, measured and predicted metrics.

    Read back with pandas: pd.read_csv(f), pd.read_json(f), pd.read_parquet(f). --format optuna writes an
    optuna study (value: MFU, maximised; params: the layout) for optuna-dashboard and optuna's importances.

    Example: tuner export my-study --format parquet --out trials.parquet
    """
    if fmt == "optuna":
        return export_optuna(name, out, storage, force, db)
    if storage is not None:
        raise UsageError(f"--storage is for --format optuna; --format {fmt} writes to --out or stdout: drop --storage")
    if fmt == "parquet" and out is None:
        raise UsageError("--format parquet is binary: pass --out FILE.parquet")
    if out is not None and out.exists() and not force:
        raise UsageError(f"--out {out} exists: choose another file, or pass --force to overwrite it")
    store = read_store(db)
    store.get_study(name)
    rows = export_rows(store.trials(name))
    if fmt == "parquet":
        data: bytes | str = parquet_bytes(rows)
    elif fmt == "json":
        data = json.dumps(rows, indent=1) + "\n"
    else:
        data = to_csv(rows, EXPORT_COLUMNS) or ",".join(EXPORT_COLUMNS) + "\n"
    if out is None:
        click.echo(data, nl=False)
        return
    if not out.parent.is_dir():
        nearest = next(p for p in out.parents if p.exists())         # "." at worst
        raise UsageError(f"--out {out}: a part of the path is a file, not a directory ({nearest}): choose another --out"
                         if not nearest.is_dir() else
                         f"--out {out}: directory {out.parent} does not exist: create it, or choose another --out")
    out.write_bytes(data) if isinstance(data, bytes) else out.write_text(data)
    click.echo(f"wrote {len(rows)} trial(s) of study {name} to {out} ({fmt})", err=True)


def export_optuna(name: str, out, storage: str | None, force: bool, db) -> None:
    """`export --format optuna`: the study as an optuna study in --storage (tuner.optuna_export)."""
    if storage is None:
        raise UsageError("--format optuna writes an optuna study: pass --storage URL, e.g. --storage sqlite:///optuna.db")
    if out is not None:
        raise UsageError("--format optuna writes to --storage, not to a file: drop --out")
    from tuner.optuna_export import write_study
    store = read_store(db)
    rec = store.get_study(name)
    click.echo(write_study(storage, rec, store.trials(name), store_url=store.engine.url, force=force).line())


def pick_layout(store, name, model, nodes, cluster, precision: str = "bf16", framework: str | None = None,
                grad_reduce: str | None = None, seq_length: int | None = None, global_batch: int | None = None,
                optimizer_moments: str | None = None):
    """(layout, workload, source) from a study, else from the store's best, else from the model (in
    `precision`, bf16 or fp8)."""
    if name:
        rec = store.get_study(name)
        w = Workload.from_dict(rec.workload)
        if framework and "framework" not in rec.workload:    # stored before frameworks: its files are the user's call
            w = dataclasses.replace(w, framework=framework)
        ok = runnable(ok_trials(store.trials(name)), w)
        if not ok:
            raise TunerError(f"study '{name}' has no successful trial that {w.framework} runs: continue it with "
                             f"`tuner resume {name}`, or take the model's best with `tuner launch --model "
                             f"{w.model.name} --nodes {w.nodes} --cluster {w.cluster.name} --framework {w.framework} "
                             "--out DIR --train-iters ITERS --data-path PATH --tokenizer NAME`")
        return ok[0].layout, w, Source("study", *_measured(ok[0]))
    from tuner.best import best
    w = make_workload(model, nodes, load_cluster(cluster), global_batch, precision=precision, framework=framework,
                      grad_reduce=grad_reduce, seq_length=seq_length, optimizer_moments=optimizer_moments)
    answer = best(store, w)
    if answer.trials:
        t = answer.trials[0]
        return t.layout, Workload.from_dict(store.get_study(t.study).workload), Source("store", *_measured(t))
    # nothing measured at this node count: the same answer as `tuner best` (the model, corrected by
    # the measurements at other node counts)
    top = answer.predicted[0]
    return top["layout"], w, Source("model", samples_per_second=top["samples_per_second"], mfu=top["mfu"],
                                    tflops_per_gpu=top["tflops_per_gpu"], peak_fraction=top["peak_fraction"])


def launch_framework(framework: str | None, w, name: str | None) -> str:
    """The framework the files are for: the study's (a study's layout was chosen for its framework's rules,
    memory and speed, so another is refused; one stored before frameworks takes --framework), or without
    NAME the workload's (--framework, else the cluster's)."""
    if name and framework and framework != w.framework:
        raise UsageError(f"study '{name}' was searched for {w.framework}: its layout's memory and speed are "
                         f"{w.framework}'s, so its launch files are too; drop --framework, or search again with "
                         f"--framework {framework}")
    return w.framework


def _measured(t) -> tuple:
    return t.study, t.number, t.runner, t.samples_per_second, t.mfu, t.tflops_per_gpu, t.peak_fraction


@cli.command()
@click.argument("name", required=False)
@click.option("--model", default=None, help=f"Without NAME: model {MODELS}.")
@click.option("--nodes", type=OneNodeCount(), default=None, help="Without NAME: number of nodes.")
@click.option("--cluster", default="frontier", show_default=True, help=f"Without NAME: cluster {CLUSTERS}.")
@click.option("--out", type=click.Path(path_type=Path), required=True, help="Directory for the launch files.")
@click.option("--force", is_flag=True, help="Write into an --out directory that is not empty.")
@click.option("--framework", type=click.Choice(FRAMEWORKS), default=None,
              help="Without NAME: the training stack whose best layout to launch (default: the cluster's); with NAME "
              "the study's framework applies. Megatron-DeepSpeed: ds_config.json + megatron_args.txt; Megatron-Core: "
              "megatron_args.txt; torchtitan: torchtitan.toml.")
@click.option("--megatron-dir", default=None, help="The framework's checkout on the cluster (megatron-deepspeed: "
              "default the cluster's [slurm] megatron_dir, else ./Megatron-DeepSpeed beside the files; "
              "megatron-core: default ./Megatron-LM; torchtitan: put on PYTHONPATH, default: installed, and --mock-data's "
              "tests/assets, default ./torchtitan).")
@click.option("--account", default=None, help="Slurm account (overrides the cluster's [slurm] table).")
@click.option("--time", "time_limit", default=None, help="Slurm time limit, minutes or [D-]HH:MM:SS.")
@click.option("--precision", type=click.Choice(["bf16", "fp16", "fp8", "mxfp8", "nvfp4"]), default=None,
              help="Training dtype (default: the [slurm] table's, else bf16); fp8, mxfp8, nvfp4: bf16 with those "
              "GEMMs, and without NAME the best layout of such studies. With NAME the study's own precision applies.")
@click.option("--data-path", default=None, help="The training data (Megatron's --data-path prefix; torchtitan's dataset "
              "path). One of --data-path or --mock-data is required.")
@click.option("--mock-data", is_flag=True, help="Random tokens instead of a dataset: a throughput run (Megatron-LM's "
              "--mock-data, torchtitan's c4_test; Megatron-DeepSpeed has none).")
@click.option("--tokenizer", default=None, help="Tokenizer the data was made with: a Hugging Face name or directory.")
@click.option("--save-dir", default=None, help="Checkpoint directory, saved to and resumed from (default: checkpoints).")
@click.option("--partition", default=None, help="Slurm partition (overrides the cluster's [slurm] table).")
@GRAD_REDUCE_OPTION
@MOMENTS_OPTION
@SEQ_LENGTH_OPTION
@click.option("--global-batch", type=click.IntRange(min=1), default=None,
              help="Without NAME: global batch in samples (default: the model's recipe).")
@click.option("--train-iters", type=click.IntRange(min=1), required=True,
              help="Training iterations of the real run (required: the [slurm] table's `iterations` are for short trials).")
@DB_OPTION
def launch(name, model, nodes, cluster, out, force, framework, megatron_dir, account, time_limit, precision, data_path,
           mock_data, tokenizer, save_dir, partition, grad_reduce, optimizer_moments, seq_length, global_batch,
           train_iters, db):
    """Write the launch files of the best layout for its framework: Megatron-DeepSpeed (ds_config.json,
    megatron_args.txt), Megatron-Core (Megatron-LM's megatron_args.txt) or torchtitan (torchtitan.toml),
    each with launch.sbatch and layout.json. A study's layout is launched with the study's framework.

    With NAME: the best trial of that study. With --model and --nodes: the best trial in the store for that
    model, cluster and node count, or, when none is stored, the performance model's top-ranked layout.

    Example: tuner launch --model 175b --nodes 16 --out launch/ --train-iters 5000 --data-path /data/gpt_text_document --tokenizer gpt2
    """
    if bool(name) == bool(model or nodes):
        raise UsageError("give a study NAME, or --model and --nodes (not both): "
                         "e.g. `tuner launch my-study --out launch/` or `tuner launch --model 175b --nodes 16 --out launch/`")
    if not name and not (model and nodes):
        raise UsageError("--model and --nodes go together: e.g. `tuner launch --model 175b --nodes 16 --out launch/`")
    check_out_dir(out, force)
    store = read_store(db, required=bool(name))
    settings = [flag for flag, v in (("--grad-reduce", grad_reduce), ("--optimizer-moments", optimizer_moments),
                                     ("--seq-length", seq_length), ("--global-batch", global_batch)) if v is not None]
    if name and settings:
        raise UsageError(f"{' and '.join(settings)}: study settings; study '{name}' keeps its own, so leave them out")
    low = precision in ("fp8", "mxfp8", "nvfp4")
    layout, w, src = pick_layout(store, name, model, nodes, cluster, precision if low else "bf16",
                                 framework, grad_reduce, seq_length, global_batch, optimizer_moments)
    if low:
        if w.precision != precision:
            raise UsageError(f"--precision {precision}: study '{name}' ran in {w.precision}; its launch files keep it")
        precision = None                          # the training dtype stays the [slurm] table's / bf16
    framework = launch_framework(framework, w, name)
    files = launch_files(layout, w, out.resolve(), source=src, study=src.study or "launch", trial=src.trial or 0,
                         framework=framework, megatron_dir=megatron_dir, account=account, time_limit=time_limit, precision=precision,
                         train_iters=train_iters, data_path=data_path, mock_data=mock_data, tokenizer=tokenizer,
                         save_dir=save_dir, partition=partition)
    write_files(out, files, executable=("launch.sbatch",),      # and another framework's files of an earlier launch
                remove=(*(n for names in FRAMEWORK_FILES.values() for n in names), *OPTIONAL_FILES))
    batch = json.loads(files["layout.json"])
    click.echo(f"layout {layout.key()} for {w.model.name} on {w.nodes} x {w.cluster.name} ({w.gpus} GPUs): "
               f"{src.describe()}")
    click.echo(f"micro-batch {batch['micro_batch']} x {batch['gradient_accumulation_steps']} accumulation steps x "
               f"dp {batch['dp']} = global batch {batch['global_batch']}")
    click.echo(f"wrote {', '.join(str(out / f) for f in files)}")
    if framework == "megatron-core" and not megatron_dir:
        click.echo(f"note: pretrain_gpt.py is taken from {batch['megatron_dir']}/ beside the files: pass "
                   "--megatron-dir to point at your Megatron-LM checkout", err=True)
    elif framework == "megatron-deepspeed" and not (megatron_dir or (w.cluster.slurm or {}).get("megatron_dir")):
        click.echo(f"note: pretrain_gpt.py is taken from {batch['megatron_dir']}/ beside the files: pass "
                   "--megatron-dir to point at your checkout", err=True)
    elif framework == "torchtitan" and mock_data and not megatron_dir:     # a pip-installed torchtitan has no tests/
        click.echo("note: --mock-data reads torchtitan's c4_test set" + ("" if tokenizer else " and test tokenizer") +
                   " from torchtitan/tests/assets beside the files (a torchtitan checkout): pass --megatron-dir to "
                   "point at yours", err=True)
    reminder = [ln[2:] for ln in files["launch.sbatch"].splitlines() if ln.startswith("# No #SBATCH")]
    if reminder:                                  # no account or time limit: the script's comment, said here too
        click.echo(f"note: {reminder[0]}", err=True)
    click.echo(f"submit: cd {shlex.quote(str(out))} && {batch['submit']}")
