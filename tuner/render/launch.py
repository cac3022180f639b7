"""The files that start the real training run of a chosen layout. Pure: returns text, writes nothing.

`launch_files` renders, from one layout and one workload:
- `ds_config.json`: the DeepSpeed config (tuner.render.megatron.deepspeed_config);
- `megatron_args.txt`: Megatron-DeepSpeed's `pretrain_gpt.py` arguments, one per line
  (`mapfile -t ARGS < megatron_args.txt`), from tuner.render.megatron.pretrain_args;
- `launch.sbatch`: the Slurm script for the cluster's [slurm] table (tuner.render.sbatch, template
  `megatron`), which writes the same DeepSpeed config next to itself and runs the same arguments;
- `layout.json`: the layout, the workload, where the layout came from and the batch arithmetic.
Every one of them comes from the same layout and global batch, so the micro-batch, the accumulation
steps and the global batch agree by construction: global batch = micro_batch * accumulation * dp.

That is `framework="megatron-deepspeed"` (the default). `megatron-core` writes `megatron_args.txt` for
Megatron-LM's `pretrain_gpt.py` (tuner.render.mcore; no DeepSpeed config), `torchtitan` writes
`torchtitan.toml` (tuner.render.torchtitan); each with its `launch.sbatch` (template `command`) and
`layout.json`.

What a framework cannot express is refused with one line naming the framework that can (UsageError, exit
status 2), never rendered as something else: Megatron-DeepSpeed refuses context and interleaved pipeline
parallelism and FP8 outside its Transformer Engine model (tuner.render.megatron.refusal), Megatron-Core
ZeRO-2/3, torchtitan fp16 and models without a registered flavor.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from tuner.errors import UsageError
from tuner.launch import Source
from tuner.layout import Layout, validate
from tuner.render import mcore, megatron, torchtitan
from tuner.render.dsconfig import check_batch
from tuner.render.sbatch import missing_table_message, render_sbatch, validate_slurm
from tuner.specs import Workload
from tuner.trial import TrialSpec

LAUNCH_FILES = ("ds_config.json", "megatron_args.txt", "launch.sbatch", "layout.json")
FRAMEWORKS = ("megatron-deepspeed", "megatron-core", "torchtitan")
FRAMEWORK_FILES = {"megatron-deepspeed": LAUNCH_FILES,
                   "megatron-core": ("megatron_args.txt", "launch.sbatch", "layout.json"),
                   "torchtitan": ("torchtitan.toml", "launch.sbatch", "layout.json")}
DEFAULT_MEGATRON_DIR = "Megatron-DeepSpeed"
DEFAULT_DIRS = {"megatron-deepspeed": DEFAULT_MEGATRON_DIR, "megatron-core": "Megatron-LM", "torchtitan": None}


def batch_arithmetic(layout: Layout, workload: Workload) -> dict:
    """micro_batch, accumulation steps, dp and global batch, checked: global = micro * accum * dp."""
    return {"micro_batch": layout.micro_batch, "gradient_accumulation_steps": check_batch(layout, workload),
            "dp": layout.dp, "global_batch": workload.global_batch}


def slurm_table(workload: Workload, *, framework: str = "megatron-deepspeed", megatron_dir: str | None = None, account: str | None = None,
                partition: str | None = None, time_limit: str | None = None, precision: str | None = None,
                train_iters: int | None = None) -> dict:
    """The cluster's [slurm] table with the launch's overrides, validated (UsageError names the bad key)."""
    base = workload.cluster.slurm
    if base is None:
        raise UsageError(missing_table_message(workload.cluster.name))
    overrides = {"megatron_dir": megatron_dir, "account": account, "partition": partition,
                 "time_limit": time_limit, "precision": precision, "iterations": train_iters}
    table = {**base, **{k: v for k, v in overrides.items() if v is not None}}
    if framework != "megatron-deepspeed":
        # the table's megatron_dir is a Megatron-DeepSpeed checkout: only the launch's own override counts
        table["megatron_dir"] = megatron_dir or DEFAULT_DIRS[framework]
    table.setdefault("megatron_dir", DEFAULT_MEGATRON_DIR)
    return validate_slurm(table, f"cluster '{workload.cluster.name}' [slurm]")


def launch_files(layout: Layout, workload: Workload, out_dir: str | Path, *, source: Source | None = None,
                 study: str = "launch", trial: int = 0, framework: str = "megatron-deepspeed",
                 **slurm_overrides) -> dict[str, str]:
    """{file name: text} for launching `layout` on `workload` from `out_dir` (the sbatch script cds there).

    `framework`: megatron-deepspeed (default), megatron-core or torchtitan. `slurm_overrides`: megatron_dir,
    account, partition, time_limit, precision, train_iters (see `slurm_table`). Raises InvalidLayout when
    the layout breaks a rule of the workload, UsageError when the framework cannot express it.
    """
    if framework not in FRAMEWORKS:
        raise UsageError(f"unknown framework {framework!r}; frameworks: {', '.join(FRAMEWORKS)}")
    validate(layout, workload)
    batch = batch_arithmetic(layout, workload)
    table = slurm_table(workload, framework=framework, **slurm_overrides)
    precision, iters = table["precision"], table["iterations"]
    spec = TrialSpec(study=study, number=trial, layout=layout, workload=workload, trial_dir=Path(out_dir))
    files = _framework_files(framework, spec, table, str(out_dir))
    src = source or Source(kind="model")
    summary = {"layout": layout.as_dict(), "layout_key": layout.key(), "source": src.as_dict(),
               "model": workload.model.name, "cluster": workload.cluster.name, "nodes": workload.nodes,
               "gpus": workload.gpus, **batch, "precision": precision, "train_iters": iters,
               "megatron_dir": table["megatron_dir"],
               "submit": f"cd {shlex.quote(str(out_dir))} && sbatch launch.sbatch"}
    if workload.precision == "fp8":
        summary["fp8"] = True        # FP8 matmuls on top of the training dtype `precision`
    if framework != "megatron-deepspeed":
        summary["framework"] = framework
    return {**files, "layout.json": json.dumps(summary, indent=2) + "\n"}


def _framework_files(framework: str, spec: TrialSpec, table: dict, out_dir: str) -> dict[str, str]:
    """The framework's own files and the launch.sbatch that runs them (layout.json is the caller's)."""
    layout, workload = spec.layout, spec.workload
    precision, iters, extra = table["precision"], table["iterations"], table["megatron_args"]
    if framework == "megatron-deepspeed":
        megatron.check(layout, workload)
        ds = megatron.deepspeed_config(layout, workload, precision=precision)
        args = megatron.pretrain_args(layout, workload, deepspeed_config_path="ds_config.json",
                                      precision=precision, iterations=iters, extra=extra)
        return {"ds_config.json": json.dumps(ds, indent=2, sort_keys=True) + "\n",
                "megatron_args.txt": "".join(f"{a}\n" for a in args),
                "launch.sbatch": render_sbatch(spec, table, template="megatron", trial_dir=out_dir)}
    if framework == "megatron-core":
        args = mcore.pretrain_args(layout, workload, precision=precision, iterations=iters, extra=extra)
        argv = ["python3", f"{table['megatron_dir'].rstrip('/')}/pretrain_gpt.py", *args]
        return {"megatron_args.txt": "".join(f"{a}\n" for a in args),
                "launch.sbatch": render_sbatch(spec, table, template="command", command=argv, trial_dir=out_dir,
                                               env=mcore.launch_env(layout))}
    job = torchtitan.render_job(layout, workload, precision=precision, iterations=iters)
    argv = ["python3", "-m", "torchtitan.train", "--job.config_file", "torchtitan.toml", *extra]
    return {"torchtitan.toml": job,      # torchtitan: installed, or its checkout (--megatron-dir) on PYTHONPATH
            "launch.sbatch": render_sbatch(spec, table, template="command", command=argv, trial_dir=out_dir,
                                           pythonpath=table["megatron_dir"])}
