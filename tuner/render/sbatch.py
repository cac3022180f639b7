"""The sbatch script of one trial, rendered from the trial and the cluster's [slurm] table. Pure: no I/O.

Used by the Slurm runner (tuner.runners.slurm) and by `tuner launch` (tuner.render.launch).

Security: every value that reaches the shell body is quoted with `shlex.quote`; values that reach
`#SBATCH` directives (parsed by sbatch, not the shell) must match a plain character set, and no value
may hold a newline there (a newline would end the comment and start a shell line). `setup` lines are
the table author's own shell, copied verbatim.

Templates:
- `harness`: the bundled harness, `python -m tuner.runners.harness.train`, one rank per task;
- `megatron`: Megatron-DeepSpeed's `pretrain_gpt.py` from `megatron_dir` (tuner.render.megatron), with
  its DeepSpeed config written next to the script; the runner parses its log;
- `command`: any argv (a command trial under srun), used by tests and for custom launchers.
Every rank gets torch.distributed's env:// variables (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE,
LOCAL_RANK) from Slurm's, and a trial's script the command-runner protocol's TUNER_* variables.

A launch script (`launch=`, `tuner launch`) is the real run's, not a trial's: a readable job name
(`launch_job_name`), no TUNER_* variables, no exit-status file, and no path of the machine that wrote it: it
runs in `$SLURM_SUBMIT_DIR` (sbatch from the directory of its files; it stops with a message elsewhere).
`generic_slurm` is the table of a cluster without one: one rank per GPU, the rest left to the site.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

from tuner.environment import public_env
from tuner.errors import UsageError
from tuner.frameworks import NAMES as FRAMEWORK_NAMES
from tuner.render import megatron
from tuner.trial import TrialSpec

TEMPLATES = ("harness", "megatron", "command")

# key -> (accepted types, default, what it is); the valid keys are named in every error.
SLURM_KEYS: dict[str, tuple[tuple[type, ...], object, str]] = {
    "account": ((str,), None, "#SBATCH --account"),
    "partition": ((str,), None, "#SBATCH --partition"),
    "qos": ((str,), None, "#SBATCH --qos"),
    "time_limit": ((str, int), None, "#SBATCH --time: minutes or [D-]HH:MM:SS"),
    "modules": ((list,), [], "`module load` each, in order"),
    "framework_modules": ((dict,), {}, "`module load` lists by framework (e.g. megatron-core = [...]): its trials and "
                                       "launches load these instead of `modules`"),
    "env": ((dict,), {}, "variables exported before srun"),
    "extra_sbatch": ((list,), [], "more #SBATCH lines, e.g. \"--exclusive\""),
    "tasks_per_node": ((int,), None, "ranks per node (default: the cluster's gpus_per_node)"),
    "gpus_per_node": ((int,), None, "--gpus-per-node (omit on CPU clusters)"),
    "gpu_bind": ((str,), None, "srun --gpu-bind"),
    "cpus_per_task": ((int,), None, "--cpus-per-task"),
    "srun_args": ((list,), [], "more srun arguments"),
    "setup": ((list,), [], "shell lines run before srun (verbatim)"),
    "megatron_dir": ((str,), None, "Megatron-DeepSpeed checkout (template megatron)"),
    "megatron_args": ((list,), [], "more pretrain_gpt.py arguments: data, tokenizer"),
    "precision": ((str,), "bf16", "fp16 or bf16 (template megatron)"),
    "iterations": ((int,), 10, "training iterations per trial (template megatron)"),
    "master_port": ((int,), None, "rendezvous port (default 20000 + job id % 20000)"),
}

_PLAIN = re.compile(r"^[A-Za-z0-9_.,:@%+=/-]+$")          # safe inside an #SBATCH directive
_TIME = re.compile(r"^(\d+|(\d+-)?\d{1,2}(:\d{2}){1,2})$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_RANK_WRAPPER = ('export RANK="$SLURM_PROCID" WORLD_SIZE="$SLURM_NTASKS" LOCAL_RANK="$SLURM_LOCALID"; '
                 'exec "$@"')
HARNESS_MODULE = "tuner.runners.harness.train"


def missing_table_message(cluster: str) -> str:
    return (f"cluster '{cluster}' has no [slurm] table: add one to its TOML, e.g. [slurm] partition = \"batch\", "
            f"account = \"abc123\", time_limit = \"00:30:00\", tasks_per_node = 8, gpus_per_node = 8; "
            f"valid keys: {', '.join(SLURM_KEYS)}")


def _fail(where: str, key: str, msg: str) -> UsageError:
    return UsageError(f"{where}: slurm key '{key}' {msg}")


def check_flag(flag: str, key: str, value: str) -> None:
    """A launch's --account / --partition / --time, checked as its [slurm] key is, the error naming the flag
    (the cluster file is not where the user typed it)."""
    if key == "time_limit":
        if not _TIME.match(str(value)):
            raise UsageError(f"{flag} {value!r} is not a Slurm time limit: give minutes (90) or [D-]HH:MM[:SS] "
                             "(02:00:00)")
    elif not _PLAIN.match(str(value)):
        raise UsageError(f"{flag} {value!r} has characters sbatch would misread: give the name as Slurm knows it "
                         "(letters, digits and _.,:@%+=/-)")


def _framework_modules(table: dict, where: str) -> dict[str, list[str]]:
    """framework_modules checked: known framework names, each a list of module names on one line."""
    unknown = sorted(set(table) - set(FRAMEWORK_NAMES))
    if unknown:
        raise _fail(where, "framework_modules", f"names unknown framework(s) {', '.join(map(repr, unknown))}; "
                    f"frameworks: {', '.join(FRAMEWORK_NAMES)}")
    for name, mods in table.items():
        if not isinstance(mods, list) or not all(isinstance(m, str) and "\n" not in m for m in mods):
            raise _fail(where, "framework_modules", f"value of {name} must be a list of strings, got {mods!r}")
    return {name: list(mods) for name, mods in table.items()}


def validate_slurm(table: dict | None, where: str = "[slurm]") -> dict:
    """The [slurm] table with defaults filled in, or UsageError naming the bad key and the valid ones."""
    if table is None:
        raise UsageError(f"{where}: no [slurm] table; valid keys: {', '.join(SLURM_KEYS)}")
    unknown = sorted(set(table) - set(SLURM_KEYS))
    if unknown:
        raise UsageError(f"{where}: unknown slurm key(s) {', '.join(unknown)}; valid keys: {', '.join(SLURM_KEYS)}")
    out = {}
    for key, (types, default, _) in SLURM_KEYS.items():
        v = table.get(key, default)
        if v is None:
            out[key] = None
            continue
        if not isinstance(v, types) or isinstance(v, bool):
            names = " or ".join(t.__name__ for t in types)
            raise _fail(where, key, f"must be {names}, got {type(v).__name__} ({v!r})")
        if isinstance(v, int) and v <= 0:
            raise _fail(where, key, f"must be > 0, got {v}")
        if isinstance(v, list):
            if not all(isinstance(x, str) for x in v):
                raise _fail(where, key, f"must be a list of strings, got {v!r}")
            v = list(v)
        if isinstance(v, str) and "\n" in v or isinstance(v, list) and any("\n" in x for x in v):
            raise _fail(where, key, "must not contain a newline")
        out[key] = v
    for key in ("account", "partition", "qos", "gpu_bind"):
        if out[key] is not None and not _PLAIN.match(out[key]):
            raise _fail(where, key, f"has characters sbatch would misread: {out[key]!r}")
    if out["time_limit"] is not None:
        out["time_limit"] = str(out["time_limit"])
        if not _TIME.match(out["time_limit"]):
            raise _fail(where, "time_limit", f"must be minutes or [D-]HH:MM[:SS], got {out['time_limit']!r}")
    env = {}
    for name, value in out["env"].items():
        if not _ENV_NAME.match(name):
            raise _fail(where, "env", f"has a name that is not a shell variable: {name!r}")
        if not isinstance(value, (str, int, float)) or isinstance(value, bool):
            raise _fail(where, "env", f"value of {name} must be a string or number, got {value!r}")
        env[name] = str(value)
    out["env"] = env
    out["framework_modules"] = _framework_modules(out["framework_modules"], where)
    extra = []
    for line in out["extra_sbatch"]:
        line = line.strip()
        line = line[len("#SBATCH"):].strip() if line.startswith("#SBATCH") else line
        if not line.startswith("-"):
            raise _fail(where, "extra_sbatch", f"lines are sbatch options like \"--exclusive\", got {line!r}")
        extra.append(line)
    out["extra_sbatch"] = extra
    if out["precision"] not in megatron.PRECISIONS:
        raise _fail(where, "precision", f"must be one of {', '.join(megatron.PRECISIONS)}, got {out['precision']!r}")
    return out


def generic_slurm(gpus_per_node: int) -> dict:
    """The [slurm] table of a cluster without one: one rank per GPU (account, partition, modules and
    environment are the site's: `tuner launch` writes a comment saying so)."""
    return {"tasks_per_node": gpus_per_node, "gpus_per_node": gpus_per_node}


def launch_job_name(model: str, layout) -> str:
    """<model>-tp<t>[-cp<c>]-pp<p>[-vp<v>]-dp<d>, e.g. llama3-70b-tp4-pp4-dp4, in the characters sbatch and
    squeue show as they are."""
    dims = [("tp", layout.tp), ("cp", layout.context_parallel), ("pp", layout.pp),
            ("vp", layout.virtual_pipeline), ("dp", layout.dp)]
    name = "-".join([model, *(f"{k}{v}" for k, v in dims if v > 1 or k in ("tp", "pp", "dp"))])
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)[:120]


def job_name(trial: TrialSpec) -> str:
    """tuner-<study>-<number>, reduced to characters sbatch and squeue show as they are."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", f"tuner-{trial.study}-{trial.number}")[:120]


def time_limit_for(timeout_s: float | None) -> str | None:
    """A Slurm --time backstop for a runner-side timeout: the timeout rounded up, plus a minute."""
    if not timeout_s:
        return None
    return str(int(-(-timeout_s // 60)) + 1)


def trial_env(trial: TrialSpec, trial_dir: str) -> dict[str, str]:
    """The command-runner protocol's TUNER_* variables (TrialSpec.env), plus TUNER_MODEL."""
    env = trial.env(Path(trial_dir) / "result.json")
    env["TUNER_MODEL"] = trial.workload.model.name
    return env


def _q(value: object) -> str:
    return shlex.quote(str(value))


def render_sbatch(trial: TrialSpec, slurm: dict, *, template: str = "harness", python: str = "python3",
                  trial_dir: str | Path | None = None, time_limit: str | None = None,
                  command: list[str] | None = None, pythonpath: str | None = None,
                  env: dict[str, str | None] | None = None, launch: str | None = None, notes: list[str] = ()) -> str:
    """The sbatch script for `trial`. `slurm` is the cluster's [slurm] table (validated here);
    `trial_dir` defaults to trial.trial_dir; `time_limit` overrides the table's; `command` is the argv
    of the `command` template; `pythonpath` is prepended to PYTHONPATH (where tuner is, if not installed);
    `env`: variables the framework needs (CUDA_DEVICE_MAX_CONNECTIONS), exported after the table's, a value None
    unset (Megatron-FSDP's CUDA_DEVICE_MAX_CONNECTIONS); where one differs from the table's, the framework's wins and
    the table's is not exported (the megatron template adds Megatron-DeepSpeed's own, tuner.render.megatron.launch_env).
    `launch`: the job name of a launch script (`tuner launch`; see the module's doc) instead of a trial's;
    `notes`: comment lines under its header."""
    if template not in TEMPLATES:
        raise UsageError(f"unknown Slurm template '{template}'; templates: {', '.join(TEMPLATES)}")
    s = validate_slurm(slurm)
    d = trial_dir if trial_dir is not None else trial.trial_dir
    if d is None and launch is None:
        raise UsageError("render_sbatch needs a trial directory (trial.trial_dir or trial_dir=)")
    lay, w = trial.layout, trial.workload
    tasks = s["tasks_per_node"] or w.cluster.gpus_per_node
    if w.nodes * tasks != lay.gpus:
        raise UsageError(f"the [slurm] table starts {w.nodes} nodes x {tasks} tasks = {w.nodes * tasks} ranks "
                         f"but layout {lay.key()} needs tp*cp*pp*dp = {lay.gpus}: set tasks_per_node = "
                         f"{w.cluster.gpus_per_node} (one rank per GPU)")
    limit = time_limit if time_limit is not None else s["time_limit"]
    if limit is not None and not _TIME.match(str(limit)):
        raise UsageError(f"time limit must be minutes or [D-]HH:MM[:SS], got {limit!r}")
    argv, preamble = _program(trial, s, template, python, command)
    exports = {**(env or {}), **(megatron.launch_env(lay) if template == "megatron" else {})}
    lines = [*_directives(trial, s, template, tasks, limit, launch, notes), "",
             *_environment(trial, s, None if launch else str(d), pythonpath, exports), *preamble, "",
             *_launch(w.nodes, tasks, s, argv, trial=launch is None)]
    return "\n".join(lines)


def _header(trial: TrialSpec, template: str, launch: str | None) -> str:
    lay, w = trial.layout, trial.workload
    if launch is None:
        return (f"# tuner trial {trial.number} of study {json.dumps(trial.study)}: {lay.key()}, "
                f"model {json.dumps(w.model.name)}, {w.nodes} node(s), template {template}")
    return (f"# tuner launch: {lay.key()}, model {json.dumps(w.model.name)}, {w.nodes} node(s) of "
            f"{json.dumps(w.cluster.name)}, global batch {w.global_batch}. Submit from this directory: sbatch launch.sbatch")


def _directives(trial: TrialSpec, s: dict, template: str, tasks: int, limit: str | None,
                launch: str | None = None, notes: list[str] = ()) -> list[str]:
    """The shebang, a comment naming the trial (or the launch, and its notes), and the #SBATCH lines."""
    lines = ["#!/bin/bash", _header(trial, template, launch),
             *("# " + n.replace("\r", "\\r").replace("\n", "\\n") for n in notes),
             f"#SBATCH --job-name={launch or job_name(trial)}",
             f"#SBATCH --nodes={trial.workload.nodes}",
             f"#SBATCH --ntasks-per-node={tasks}"]
    for key, opt in (("gpus_per_node", "gpus-per-node"), ("cpus_per_task", "cpus-per-task"),
                     ("account", "account"), ("partition", "partition"), ("qos", "qos")):
        if s[key] is not None:
            lines.append(f"#SBATCH --{opt}={s[key]}")
    if limit is not None:
        lines.append(f"#SBATCH --time={limit}")
    # A multi-node NVLink domain (NVL72): Slurm's topology/block plugin places each segment of this many nodes in
    # one block, a rack (--segment; slurm.schedmd.com/topology.html "Block Topology", CoreWeave SUNK's
    # "Topology/Block Scheduling in Slurm" for GB200 / GB300 NVL72); the job's segment is ClusterSpec.for_nodes'.
    if trial.workload.cluster.segment_nodes > 1:
        lines.append(f"#SBATCH --segment={trial.workload.cluster.segment_nodes}")
    lines += ["#SBATCH --output=slurm-%j.out", "#SBATCH --open-mode=append"]
    return lines + [f"#SBATCH {x}" for x in s["extra_sbatch"]]


# A launch script runs beside its files, wherever they were copied: in the directory sbatch was run from.
_LAUNCH_CD = ['cd "${SLURM_SUBMIT_DIR:-.}" || exit 1',
              'if [ ! -f layout.json ]; then echo "tuner: no layout.json in $PWD: run sbatch in the directory of '
              'launch.sbatch (cd DIR && sbatch launch.sbatch)" >&2; exit 1; fi']


def _environment(trial: TrialSpec, s: dict, d: str | None, pythonpath: str | None,
                 exports: dict[str, str]) -> list[str]:
    """cd to the trial directory (a launch: the submit directory), modules, the table's, the framework's and
    (a trial) the protocol's variables, the rendezvous, setup."""
    lines = ["set -uo pipefail", *([f"cd {_q(d)} || exit 1"] if d is not None else _LAUNCH_CD)]
    # the study's framework may need another stack than the table's `modules` (Frontier: ROCm 6 for Megatron-Core)
    modules = s["framework_modules"].get(trial.workload.framework, s["modules"])
    lines += [f"module load {_q(m)}" for m in modules]
    table = public_env(s["env"])                                                # never the store's secrets
    lines += [f"export {k}={_q(v)}" for k, v in table.items() if exports.get(k, v) == v]
    lines += _framework_exports(table, exports)
    if d is not None:
        lines += [f"export {k}={_q(v)}" for k, v in trial_env(trial, d).items()]
    if pythonpath:
        lines.append(f'export PYTHONPATH={_q(pythonpath)}"${{PYTHONPATH:+:$PYTHONPATH}}"')
    lines += ['export MASTER_ADDR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)"',
              f"export MASTER_PORT={s['master_port']}" if s["master_port"]
              else 'export MASTER_PORT="$((20000 + SLURM_JOB_ID % 20000))"']
    return lines + s["setup"]


def _framework_exports(table: dict[str, str], exports: dict[str, str | None]) -> list[str]:
    """The framework's variables after the [slurm] table's: each once (not where the table has the same value), an
    override of the table's value said in a comment, None as `unset` (also against the submitting shell's value)."""
    lines = []
    for k, v in exports.items():
        if k in table and table[k] != v:
            lines.append(f"# [slurm] env sets {k}={_q(table[k])}; the framework needs it {'unset' if v is None else _q(v)}")
        if v is None:
            lines.append(f"unset {k}")
        elif table.get(k) != v:
            lines.append(f"export {k}={_q(v)}")
    return lines


def _program(trial: TrialSpec, s: dict, template: str, python: str,
             command: list[str] | None) -> tuple[list[str], list[str]]:
    """(the argv every rank runs, shell lines that prepare it: the megatron template's ds_config.json)."""
    if template == "harness":
        return [python, "-m", HARNESS_MODULE], []
    if template == "command":
        if not command:
            raise UsageError("template 'command' needs a command (an argv list)")
        return list(command), []
    if not s["megatron_dir"]:
        raise UsageError("template 'megatron' needs megatron_dir = \"/path/to/Megatron-DeepSpeed\" in [slurm]")
    lay, w = trial.layout, trial.workload
    ds = json.dumps(megatron.deepspeed_config(lay, w, precision=s["precision"]), sort_keys=True)
    argv = [python, f"{s['megatron_dir'].rstrip('/')}/pretrain_gpt.py",
            *megatron.pretrain_args(lay, w, deepspeed_config_path="ds_config.json", precision=s["precision"],
                                    iterations=s["iterations"], extra=s["megatron_args"])]
    return argv, ["cat > ds_config.json <<'TUNER_DS_CONFIG_EOF'", ds, "TUNER_DS_CONFIG_EOF"]


def _launch(nodes: int, tasks: int, s: dict, argv: list[str], trial: bool = True) -> list[str]:
    """srun of `argv` on every rank, and (a trial) the exit status written where the runner looks for it."""
    srun = ["srun", f"--nodes={nodes}", f"--ntasks-per-node={tasks}"]
    if s["gpus_per_node"] is not None:
        srun.append(f"--gpus-per-node={s['gpus_per_node']}")
    if s["gpu_bind"] is not None:
        srun.append(f"--gpu-bind={s['gpu_bind']}")
    if s["cpus_per_task"] is not None:
        srun.append(f"--cpus-per-task={s['cpus_per_task']}")
    srun += ["--kill-on-bad-exit=1", *s["srun_args"]]
    launch = " ".join(_q(a) for a in srun) + f" bash -c {_q(_RANK_WRAPPER)} tuner-rank"
    return ["echo \"tuner: job $SLURM_JOB_ID on $SLURM_JOB_NODELIST, $SLURM_NTASKS ranks, "
            "master $MASTER_ADDR:$MASTER_PORT\"",
            launch + " \\", "    " + " ".join(_q(a) for a in argv),
            "rc=$?",
            *(["printf '%s\\n' \"$rc\" > exit_status.tmp && mv exit_status.tmp exit_status"] if trial else []),
            "exit \"$rc\"", ""]
