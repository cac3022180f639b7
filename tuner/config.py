"""A study's settings as one TOML file (`tuner search --config study.toml`, `tuner config NAME`) and
as keyword arguments (tuner.create_study): one vocabulary, the options of `tuner search`.

Keys are `tuner search`'s options with underscores (model, nodes, cluster, budget, stop_threshold,
tp, recompute, ...): their types and ranges are checked by the same click parameters as the command
line's (both read tuner.study_options), so a file, a flag and a keyword argument are refused with the
same words. Three keys may also be tables: `[model]` and `[cluster]` (a whole spec, as in
workloads/*/*.toml) and `[space]` (dimensions and constraints, as in search_spaces/*.toml);
`[runner_options]` carries the options of a runner registered from Python. A stored study's file
(`dumps`) reproduces the study exactly: the model, cluster and space are written as tables when they
are not the shipped presets of that name.
"""

from __future__ import annotations

import shlex
import tomllib
from pathlib import Path

import click

from tuner.errors import UsageError

TABLES = ("model", "cluster", "space", "runner_options")
RUNNER_OPTIONS = ("noise", "sim_delay", "command", "gpus", "trial_timeout", "template")


def _params() -> dict[str, click.Parameter]:
    from tuner.study_options import params
    return params()


def _aliases() -> dict[str, str]:
    """Each option's flag spelled as a key (ep, cp, micro_batch, ...) -> its parameter's name."""
    return {o.lstrip("-").replace("-", "_"): p.name for p in _params().values() for o in getattr(p, "opts", [])
            if o.startswith("--")}


def keys() -> list[str]:
    return sorted({*_params(), *TABLES})


def read(path: str | Path) -> dict:
    """The settings of a study.toml, unchecked (check() converts them). UsageError naming the fix."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))      # TOML is UTF-8 whatever the locale
    except FileNotFoundError:
        raise UsageError(f"--config {path}: no such file (write one with `tuner config NAME > {path}`)") from None
    except UnicodeDecodeError as exc:
        raise UsageError(f"--config {path} is not UTF-8 text ({exc.reason} at byte {exc.start}), as TOML must be: "
                         f"save it as UTF-8, or write one with `tuner config NAME > {path}`") from None
    except OSError as exc:
        raise UsageError(f"--config {path} cannot be read: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"--config {path} is not valid TOML: {exc}") from None
    return data


def check(options: dict, where: str = "study settings") -> dict:
    """`options` converted and checked by `tuner search`'s own parameters; tables kept as given."""
    params, out, alias = _params(), {}, _aliases()
    options = {alias.get(k, k) if k not in params else k: v for k, v in options.items()}   # ep = 2 is expert_parallel
    unknown = sorted(set(options) - set(params) - set(TABLES))
    if unknown:
        raise UsageError(f"{where}: unknown key(s) {', '.join(unknown)}; valid keys: {', '.join(keys())}")
    ctx = click.Context(click.Command("tuner"))
    for k, v in options.items():
        if k in TABLES and isinstance(v, dict):
            out[k] = v
            continue
        if k in ("runner_options",):
            raise UsageError(f"{where}: '{k}' must be a table")
        if k == "runner":
            out[k] = _runner_name(v, where)
            continue
        if (isinstance(v, (list, tuple, dict)) and isinstance(params[k].type, click.types.StringParamType)
                and params[k].nargs == 1 and not getattr(params[k], "multiple", False)):
            hint = f" (one string: {k} = {shlex.join(map(str, v))!r})" if isinstance(v, (list, tuple)) else ""
            raise UsageError(f"{where}: {k} = {v!r} must be a string{hint}")   # click would write the list's repr
        try:
            out[k] = None if v is None else params[k].type_cast_value(ctx, v)
        except click.BadParameter as exc:
            raise UsageError(f"{where}: {k} = {v!r}: {exc.format_message()}") from None
    return out


def _runner_name(v, where: str) -> str:
    """A runner this process can build by name; a Python runner's study is created from Python."""
    from tuner.runners.registry import runner_names
    if v not in runner_names():
        raise UsageError(f"{where}: runner = {v!r} is not one this tuner can build ({', '.join(runner_names())}): "
                         f"a study of a Python runner is created from Python, tuner.create_study(config=FILE, "
                         f"runner={v}), or install it as a 'tuner.runners' entry point")
    return v


def settings_of(o: dict) -> dict:
    """The study settings (tuner.study.new_record) of checked options."""
    runner_options = {k: o[k] for k in RUNNER_OPTIONS if o.get(k)}
    runner_options.update(o.get("runner_options") or {})
    s = {"seed": o.get("seed", 0), "budget": o.get("budget", 50), "parallel": o.get("parallel", 1),
         "time_limit": o.get("time_limit"), "prune": not o.get("no_prune", False),
         "executor": o.get("executor", "thread"), "results_dir": o.get("results_dir", "results"),
         "early_stop": o.get("early_stop"), "warm_start": bool(o.get("warm_start")),
         "no_stop": bool(o.get("no_stop")), "keep_going": bool(o.get("keep_going")),
         "executor_options": {"address": o["ray_address"]} if o.get("executor") == "ray" and o.get("ray_address") else {},
         "runner_options": runner_options}
    if o.get("stop_threshold") is not None:
        s["stop_threshold"] = o["stop_threshold"]
    return s


def workload_of(o: dict):
    """The Workload of checked options (a [model] / [cluster] table is a whole spec)."""
    from tuner.specs import ClusterSpec, ModelSpec, make_workload
    model, cluster = o.get("model"), o.get("cluster", "frontier")
    if model is None:
        raise UsageError("missing option --model (or `model` in the study settings): a preset name or TOML path")
    model = ModelSpec.from_dict(model, "[model]") if isinstance(model, dict) else model
    cluster = ClusterSpec.from_dict(cluster, "[cluster]") if isinstance(cluster, dict) else cluster
    nodes = o.get("nodes")
    if isinstance(nodes, tuple):
        raise UsageError(f"nodes = {','.join(map(str, nodes))}: a study runs at one node count; several are linked "
                         "studies, one per count: `tuner search --nodes 32,64` (docs/commands/search.md)")
    if nodes is None and o.get("runner") == "local":
        nodes = 1
    return make_workload(model, nodes, cluster, o.get("global_batch"), o.get("precision") or "bf16",
                         o.get("framework"), o.get("grad_reduce"), o.get("seq_length"), o.get("optimizer_moments"))


def space_of(o: dict):
    """The SearchSpace of checked options: a name or path, or a [space] table; layout keys pin it."""
    from tuner.layout import DIMENSIONS
    from tuner.space import SearchSpace, load_space
    sp = o.get("space", "default")
    if isinstance(sp, dict):
        body = {k: v for k, v in sp.items() if k != "name"}
        space = SearchSpace.from_dict(body, "[space]")
        space = SearchSpace(str(sp.get("name", "[space]")), space.dimensions, space.constraints)
    else:
        space = load_space(sp)
    pins = {d.name: o[d.name] for d in DIMENSIONS if d.searched and o.get(d.name) is not None}
    return space.pinned(pins)


def record(o: dict, taken: set[str]):
    """The StudyRecord of checked options (not stored yet: tuner.study.create checks and stores it);
    its name is `study`, else a generated one not in `taken`."""
    from tuner import study as studies
    w, sp = workload_of(o), space_of(o)
    name = studies.check_study_name(o["study"]) if o.get("study") else studies.generated_name(
        w.model.name, w.nodes, taken)
    runner, gpus = o.get("runner", "sim"), o.get("gpus")
    if runner == "local" and gpus and gpus != w.gpus:
        raise UsageError(f"--gpus {gpus} but {w.model.name} on {w.nodes} x {w.cluster.name} node(s) is {w.gpus} "
                         f"GPUs: use --cluster local with --nodes 1, or --gpus {w.gpus}")
    return studies.new_record(name, w, sp, searcher=o.get("searcher", "guided"), runner=runner, **settings_of(o))


# ---- writing a stored study back out ----------------------------------------------------------------
def _preset_or_table(kind: str, stored: dict):
    """The preset's name when the stored spec is that preset as shipped, else the whole spec."""
    from tuner.specs import load_cluster, load_model
    try:
        preset = (load_model if kind == "model" else load_cluster)(stored["name"]).as_dict()
    except Exception:
        preset = None
    return stored["name"] if preset == stored else {k: v for k, v in stored.items() if v is not None}


def options_of(rec) -> dict:
    """The options that recreate stored study `rec` (its name left out: a new study needs a new one)."""
    from tuner.runners import RUNNERS
    from tuner.space import load_space
    s, w = rec.settings, rec.workload
    o = {"model": _preset_or_table("model", w["model"]), "nodes": w["nodes"],
         "cluster": _preset_or_table("cluster", w["cluster"]), "global_batch": w["global_batch"],
         "precision": w.get("precision") or "bf16", "framework": w.get("framework") or None,
         "grad_reduce": w.get("grad_reduce") or None, "optimizer_moments": w.get("optimizer_moments") or None,
         "searcher": rec.searcher, "runner": rec.runner}
    try:
        same = load_space(rec.space.get("name", "default")).as_record() == rec.space
    except Exception:
        same = False
    o["space"] = rec.space["name"] if same else {"name": rec.space.get("name", "space"),
                                                 "dimensions": rec.space["dimensions"],
                                                 "constraints": rec.space.get("constraints", {})}
    for k in ("seed", "budget", "parallel", "time_limit", "executor", "results_dir", "early_stop", "warm_start",
              "stop_threshold", "no_stop", "keep_going"):
        o[k] = s.get(k)
    o["no_prune"] = not s.get("prune", True)
    o["ray_address"] = (s.get("executor_options") or {}).get("address")
    ropts = dict(s.get("runner_options") or {})
    if rec.runner in RUNNERS:
        o.update({k: ropts.pop(k) for k in RUNNER_OPTIONS if k in ropts})
    o["runner_options"] = ropts or None
    return {k: v for k, v in o.items() if v is not None and v is not False}


def _value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    raise TypeError(f"cannot write {type(v).__name__} to TOML")


def _table(name: str, d: dict) -> list[str]:
    lines, subs = [f"\n[{name}]"], []
    for k, v in d.items():
        (subs.append((k, v)) if isinstance(v, dict) else lines.append(f"{k} = {_value(v)}"))
    for k, v in subs:
        lines += _table(f"{name}.{k}", v)
    return lines


def dumps(rec) -> str:
    """Stored study `rec` as a study.toml that `tuner search --config` reads back into the same study."""
    o = options_of(rec)
    lines = [f"# Study '{rec.name}' as settings: `tuner search --config FILE --study NEW-NAME` runs it again",
             "# (keys: tuner search's options; a flag given on the command line wins over the file)."]
    lines += [f"{k} = {_value(v)}" for k, v in o.items() if not isinstance(v, dict)]
    for k, v in o.items():
        if isinstance(v, dict):
            lines += _table(k, v)
    return "\n".join(lines) + "\n"
