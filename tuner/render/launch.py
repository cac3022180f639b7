"""The files that start the real training run of a chosen layout. Pure: returns text, writes nothing.

`launch_files` renders, from one layout and one workload:
- `ds_config.json`: the DeepSpeed config (tuner.render.megatron.deepspeed_config);
- `megatron_args.txt`: Megatron-DeepSpeed's `pretrain_gpt.py` arguments, one per line
  (`mapfile -t ARGS < megatron_args.txt`), from tuner.render.megatron.pretrain_args;
- `launch.sbatch`: the Slurm script for the cluster's [slurm] table (tuner.render.sbatch, template
  `command`, a launch script), which runs the same arguments with the ds_config.json beside it;
- `layout.json`: the layout, the workload, where the layout came from and the batch arithmetic.
Every one of them comes from the same layout and global batch, so the micro-batch, the accumulation
steps and the global batch agree by construction: global batch = micro_batch * accumulation * dp.

That is `framework="megatron-deepspeed"` (the default). `megatron-core` writes `megatron_args.txt` for
Megatron-LM's `pretrain_gpt.py` (tuner.render.mcore; no DeepSpeed config) and, where the model charges Transformer
Engine's TP-overlap settings (b200, gb200), `tp_comm_overlap_cfg.yaml` with them (tuner.render.userbuffers);
`torchtitan` writes `torchtitan.toml` (tuner.render.torchtitan); each with its `launch.sbatch` (template `command`)
and `layout.json`.

The files run as written wherever they are copied: no path of the machine that wrote them (launch.sbatch
runs in the directory it is submitted from, `sbatch launch.sbatch` there), no TUNER_* trial variables, a
job name from the model and the layout, the training data (`data_path` with its `tokenizer`, or
`mock_data`: exactly one) and checkpoints (`save_dir`, default `checkpoints` beside the files) in each
framework's own flags and keys. A cluster without a [slurm] table gets a generic script (one rank per GPU)
with a comment naming what the site adds.

What a framework cannot express is refused with one line naming the framework that can (UsageError, exit
status 2), never rendered as something else: Megatron-DeepSpeed refuses context and interleaved pipeline
parallelism and FP8 outside its Transformer Engine model (tuner.render.megatron.refusal), Megatron-Core
ZeRO-2/3, torchtitan fp16 and models without a registered flavor.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from tuner.errors import UsageError
from tuner.launch import Source
from tuner.layout import Layout, validate
from tuner.render import mcore, megatron, rocm, torchtitan, userbuffers
from tuner.render.dsconfig import check_batch
from tuner.render.sbatch import check_flag, generic_slurm, launch_job_name, render_sbatch, validate_slurm
from tuner.specs import Workload
from tuner.frameworks import FRAMEWORKS as FRAMEWORK_SPECS, NAMES
from tuner.trial import TrialSpec

FRAMEWORKS = NAMES                     # declared once, with their files, in tuner.frameworks
FRAMEWORK_FILES = {name: fw.files for name, fw in FRAMEWORK_SPECS.items()}
LAUNCH_FILES = FRAMEWORK_FILES["megatron-deepspeed"]
OPTIONAL_FILES = (userbuffers.FILE,)  # megatron-core: the TP-overlap settings, where the model charged a table
DEFAULT_MEGATRON_DIR = "Megatron-DeepSpeed"
DEFAULT_DIRS = {"megatron-deepspeed": DEFAULT_MEGATRON_DIR, "megatron-core": "Megatron-LM", "torchtitan": None}
DEFAULT_SAVE_DIR = "checkpoints"


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
        base = generic_slurm(workload.cluster.gpus_per_node)
    overrides = {"megatron_dir": megatron_dir, "account": account, "partition": partition,
                 "time_limit": time_limit, "precision": precision, "iterations": train_iters}
    for key, flag in (("account", "--account"), ("partition", "--partition"), ("time_limit", "--time")):
        if overrides[key] is not None:
            check_flag(flag, key, overrides[key])
    table = {**base, **{k: v for k, v in overrides.items() if v is not None}}
    if framework != "megatron-deepspeed":
        # the table's megatron_dir is a Megatron-DeepSpeed checkout: only the launch's own override counts
        table["megatron_dir"] = megatron_dir or DEFAULT_DIRS[framework]
    table.setdefault("megatron_dir", DEFAULT_MEGATRON_DIR)
    return validate_slurm(table, f"cluster '{workload.cluster.name}' [slurm]")


def site_notes(workload: Workload, table: dict) -> list[str]:
    """The launch script's comment: for a cluster without a [slurm] table, what the site adds; for one
    whose table (and the launch's --account / --time) sets no account or time limit, that most sites need
    both."""
    if workload.cluster.slurm is not None:
        unset = [flag for key, flag in (("account", "--account"), ("time_limit", "--time")) if not table[key]]
        return [f"No #SBATCH {' or '.join(unset)} line: cluster {json.dumps(workload.cluster.name)}'s [slurm] table "
                f"sets none. Most sites need an account and a time limit (without them sbatch uses the site's "
                f"defaults, or refuses): tuner launch --account PROJECT --time HH:MM:SS writes them, or add them "
                f"here as #SBATCH {'=... and #SBATCH '.join(unset)}=..."] if unset else []
    missing = [f"#SBATCH --{k}" for k in ("account", "partition") if not table[k]]
    return [f"Generic script: cluster {json.dumps(workload.cluster.name)} has no [slurm] table. Add your site's "
            f"{' and '.join(missing) + ', ' if missing else ''}modules and environment here (or a [slurm] table "
            "to the cluster's TOML; tuner launch --account/--partition set those two)."]


def check_data(framework: str, data_path: str | None, tokenizer: str | None, mock_data: bool,
               save_dir: str) -> None:
    """UsageError unless exactly one of data_path and mock_data is given, and no value holds a newline."""
    if data_path and mock_data:
        raise UsageError("--data-path and --mock-data exclude each other: give one")
    if not data_path and not mock_data:
        raise UsageError("give the training data: --data-path PATH (a dataset prepared for the framework, with "
                         "--tokenizer NAME_OR_PATH) or --mock-data (synthetic tokens, for a throughput run)")
    for name, v in (("--data-path", data_path), ("--tokenizer", tokenizer), ("--save-dir", save_dir)):
        if v is not None and ("\n" in v or "\r" in v or not v.strip()):
            raise UsageError(f"{name} must be one non-empty line, got {v!r}")
    if framework == "megatron-deepspeed":
        megatron.data_args(data_path=data_path, tokenizer=tokenizer, mock_data=mock_data)   # refuses mock data


def launch_files(layout: Layout, workload: Workload, out_dir: str | Path | None = None, *,
                 source: Source | None = None, study: str = "launch", trial: int = 0,
                 framework: str = "megatron-deepspeed", data_path: str | None = None, tokenizer: str | None = None,
                 mock_data: bool = False, save_dir: str | None = None, **slurm_overrides) -> dict[str, str]:
    """{file name: text} for launching `layout` on `workload`; `sbatch launch.sbatch` in their directory runs it.

    `out_dir` is where the caller writes them; no file names it. `framework`: megatron-deepspeed (default),
    megatron-core or torchtitan. `data_path` (with `tokenizer`, a Hugging Face tokenizer id or directory) or
    `mock_data`: exactly one. `save_dir`: checkpoints (default "checkpoints", relative to the launch
    directory). `slurm_overrides`: megatron_dir, account, partition, time_limit, precision, train_iters (see
    `slurm_table`). Raises InvalidLayout when the layout breaks a rule of the workload, UsageError when the
    framework cannot express it or the data is missing.
    """
    if framework not in FRAMEWORKS:
        raise UsageError(f"unknown framework {framework!r}; frameworks: {', '.join(FRAMEWORKS)}")
    save_dir = save_dir or DEFAULT_SAVE_DIR
    check_data(framework, data_path, tokenizer, mock_data, save_dir)
    if getattr(workload, "framework", framework) != framework:     # the launch's framework runs the layout
        workload = dataclasses.replace(workload, framework=framework)
    validate(layout, workload)
    batch = batch_arithmetic(layout, workload)
    table = slurm_table(workload, framework=framework, **slurm_overrides)
    spec = TrialSpec(study=study, number=trial, layout=layout, workload=workload)
    data = {"data_path": data_path, "tokenizer": tokenizer, "mock_data": mock_data}
    files = _framework_files(framework, spec, table, data, save_dir)
    src = source or Source(kind="model")
    summary = {"layout": layout.as_dict(), "layout_key": layout.key(), "source": src.as_dict(),
               "model": workload.model.name, "cluster": workload.cluster.name, "nodes": workload.nodes,
               "gpus": workload.gpus, **batch, "precision": table["precision"], "train_iters": table["iterations"],
               "megatron_dir": table["megatron_dir"], "data_path": data_path, "tokenizer": tokenizer,
               "mock_data": mock_data, "save_dir": save_dir,
               "submit": "sbatch launch.sbatch", "submit_from": "the directory of these files"}
    if workload.precision != "bf16":
        summary[workload.precision] = True      # fp8 / mxfp8 / nvfp4 GEMMs on top of the training dtype `precision`
    summary["framework"] = framework
    return {**files, "layout.json": json.dumps(summary, indent=2) + "\n"}


def _framework_files(framework: str, spec: TrialSpec, table: dict, data: dict, save_dir: str) -> dict[str, str]:
    """The framework's own files and the launch.sbatch that runs them (layout.json is the caller's)."""
    layout, workload = spec.layout, spec.workload
    precision, iters, extra = table["precision"], table["iterations"], table["megatron_args"]
    script = {"launch": launch_job_name(workload.model.name, layout),
              "notes": [*site_notes(workload, table), *rocm.notes(workload)]}
    platform = rocm.launch_env(workload)           # ROCm's variables (none on CUDA)
    if framework == "torchtitan":
        job = torchtitan.render_job(layout, workload, precision=precision, iterations=iters, save_dir=save_dir,
                                    data=torchtitan.data_keys(**data, checkout=table["megatron_dir"]))
        argv = ["python3", "-m", "torchtitan.train", "--job.config_file", "torchtitan.toml", *extra]
        return {"torchtitan.toml": job,   # torchtitan: installed, or its checkout (--megatron-dir) on PYTHONPATH
                "launch.sbatch": render_sbatch(spec, table, template="command", command=argv, env=platform,
                                               pythonpath=table["megatron_dir"], **script)}
    run = [*megatron.checkpoint_args(save_dir), *extra]
    if framework == "megatron-deepspeed":
        megatron.check(layout, workload)
        ds = megatron.deepspeed_config(layout, workload, precision=precision)
        args = megatron.pretrain_args(layout, workload, deepspeed_config_path="ds_config.json", precision=precision,
                                      iterations=iters, extra=[*megatron.data_args(**data), *run])
        files, env = {"ds_config.json": json.dumps(ds, indent=2, sort_keys=True) + "\n"}, megatron.launch_env(layout)
    else:
        args = mcore.pretrain_args(layout, workload, precision=precision, iterations=iters,
                                   extra=[*mcore.data_args(workload.model, **data), *run])
        files, env = mcore.userbuffers_files(layout, workload), mcore.launch_env(layout, workload)
    argv = ["python3", f"{table['megatron_dir'].rstrip('/')}/pretrain_gpt.py", *args]
    return {**files, "megatron_args.txt": "".join(f"{a}\n" for a in args),
            "launch.sbatch": render_sbatch(spec, table, template="command", command=argv, env={**env, **platform},
                                           **script)}
