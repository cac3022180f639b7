"""Which runners exist: the built-in ones, those registered in this process, and those other packages
install as entry points (group `tuner.runners`). A study stores its runner's name; a study is resumed
only by a process that has a runner of that name, never silently by another one.

A runner is given as
- a `TrialRunner` instance (used as it is),
- a `TrialRunner` subclass (built with the study's `runner_options` as keyword arguments), or
- a trial function `fn(trial: TrialSpec)` returning a TrialResult, a result dict (the command
  runner's result.json: {"status": "ok", "samples_per_second": ..., "peak_memory_gb": ...}) or a
  number (samples/s). An exception it raises is the trial's failure (OOM when it says out of memory),
  never the driver's.

An entry point names such an object: in a package's pyproject.toml

    [project.entry-points."tuner.runners"]
    my-trainer = "my_package.tuning:train_one_layout"
"""

from __future__ import annotations

import importlib.metadata
import math
import re
from typing import Any, Callable

from tuner.errors import UsageError
from tuner.runners import RUNNERS, TrialRunner
from tuner.trial import Status, TrialResult, TrialSpec, failed, host_memory, looks_oom

ENTRY_POINT_GROUP = "tuner.runners"
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,63}$")

_registered: dict[str, Any] = {}


class FunctionRunner(TrialRunner):
    """A trial function as a runner (see the module docstring for what it may return)."""

    def __init__(self, fn: Callable[[TrialSpec], Any], name: str):
        self.fn, self.name = fn, name

    def run(self, trial: TrialSpec) -> TrialResult:
        from tuner.metrics import complete
        from tuner.runners.command import result_from_dict
        try:
            out = self.fn(trial)
        except Exception as exc:          # the trial's failure, a result
            text = f"{type(exc).__name__}: {exc}"
            return failed(text, Status.OOM if looks_oom(text, host_memory(trial)) else Status.FAILED)
        if isinstance(out, TrialResult):
            return complete(out, trial.workload, trial.layout)
        if isinstance(out, (int, float)) and not isinstance(out, bool):
            if not (math.isfinite(out) and out > 0):
                return failed(f"runner '{self.name}' returned {out!r}: a number must be samples/s > 0")
            out = {"status": "ok", "samples_per_second": float(out)}
        if not isinstance(out, dict):
            return failed(f"runner '{self.name}' returned {type(out).__name__}: return a TrialResult, a result "
                          "dict ({'status': 'ok', 'samples_per_second': ...}) or samples/s")
        return result_from_dict(out, trial, f"the result of runner '{self.name}'", "return")


def default_name(obj: Any) -> str:
    """The name a runner object is stored under: its `name`, else its function or class name."""
    name = getattr(obj, "name", "") if isinstance(obj, TrialRunner) else ""
    return name or getattr(obj, "__name__", "") or type(obj).__name__


def as_runner(obj: Any, name: str | None = None, options: dict | None = None) -> TrialRunner:
    """`obj` (an instance, a TrialRunner subclass or a trial function) as a runner named `name`."""
    name = name or default_name(obj)
    if isinstance(obj, TrialRunner):
        if not obj.name:
            obj.name = name
        return obj
    if isinstance(obj, type) and issubclass(obj, TrialRunner):
        try:
            runner = obj(**(options or {}))
        except TypeError as exc:
            raise UsageError(f"runner '{name}' cannot be built with options {sorted(options or {})}: {exc}") from None
        runner.name = runner.name or name
        return runner
    if callable(obj):
        return FunctionRunner(obj, name)
    raise UsageError(f"a runner must be a TrialRunner, a TrialRunner subclass or a function of a trial; "
                     f"got {type(obj).__name__}")


def check_name(name: str) -> str:
    if not NAME_RE.match(name or ""):
        raise UsageError(f"runner name {name!r} is not allowed: use letters, digits, '.', '_', ':' and '-' "
                         "(at most 64)")
    return name


def register_runner(name: str, runner: Any = None):
    """Make `runner` available under `name` in this process (`tuner.load_study(...).optimize()` and
    `tuner.study.resume` find it). Usable as a decorator: @register_runner("my-trainer")."""
    check_name(name)
    if name in RUNNERS:
        raise UsageError(f"runner name '{name}' is built in ({', '.join(RUNNERS)}): choose another name")

    def add(obj):
        if not (isinstance(obj, TrialRunner) or callable(obj)):
            raise UsageError(f"runner '{name}' must be a TrialRunner, a TrialRunner subclass or a function of "
                             f"a trial; got {type(obj).__name__}")
        _registered[name] = obj
        return obj
    return add if runner is None else add(runner)


def unregister_runner(name: str) -> None:
    _registered.pop(name, None)


def _entry_points() -> dict:
    return {ep.name: ep for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)}


def runner_names() -> list[str]:
    """Every runner this process can build: built in, registered, installed as entry points."""
    return [*RUNNERS, *sorted(set(_registered) | set(_entry_points()))]


def lookup(name: str) -> Any | None:
    """The registered object or entry point of `name` (not a built-in), or None."""
    if name in _registered:
        return _registered[name]
    ep = _entry_points().get(name)
    if ep is None:
        return None
    try:
        return ep.load()
    except Exception as exc:          # a broken plug-in names itself, it does not crash tuner
        raise UsageError(f"runner '{name}' (entry point {ep.value}) cannot be loaded: "
                         f"{type(exc).__name__}: {exc}") from None


def unavailable(name: str, study: str) -> UsageError:
    """Why a study run by runner `name` cannot continue in this process, and how it can."""
    return UsageError(
        f"study '{study}' was run by runner '{name}', which this process does not have (it has "
        f"{', '.join(runner_names())}): continue it from Python with tuner.load_study('{study}', "
        f"runner=...), or install the runner as a '{ENTRY_POINT_GROUP}' entry point named '{name}'")
