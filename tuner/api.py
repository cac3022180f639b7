"""tuner as a library: the facade a notebook or a workflow uses (`import tuner`).

    import tuner
    study = tuner.create_study(model="llama3-70b", nodes=8, cluster="h100", budget=20)
    study.optimize()                       # runs trials until the budget, the stop rule or the space ends
    study.best()                           # the recommended trial: layout, samples/s, MFU
    study.trials_dataframe()               # every trial as a pandas DataFrame

Keyword arguments are `tuner search`'s options (tuner.config: the same names, types and checks as the
command line and a study.toml). A runner is a name (built in: sim, command, local, slurm; registered
with tuner.register_runner; or installed as an entry point) or an object: a TrialRunner, a TrialRunner
subclass or a function of a TrialSpec (tuner.runners.registry). The study stores its runner's name, and
is continued only with a runner of that name (`tuner resume` refuses a study whose runner it lacks).
Studies are the CLI's: `tuner studies`, `tuner report`, `tuner launch` work on them, and the reverse.
Messages go to logging.getLogger("tuner").
"""

from __future__ import annotations

import functools
import re
from typing import Any, Callable

from tuner import study as studies
from tuner.config import check, dumps, read, record
from tuner.errors import StudyExists, TunerError, UsageError
from tuner.layout import Layout
from tuner.runners import RUNNERS, TrialRunner
from tuner.runners.registry import (as_runner, check_name, default_name, register_runner, runner_names,
                                    unregister_runner)
from tuner.trial import Status, TrialResult, TrialSpec

__all__ = ["create_study", "load_study", "Study", "register_runner", "unregister_runner", "runner_names",
           "TrialSpec", "TrialResult", "TrialRunner", "Status", "Layout"]


#: The CLI's words for what to run next, as a Python user runs it (regex -> replacement).
PYTHON_WORDS = ((r"`tuner resume (\S+?) --join`", r"`tuner.load_study('\1').optimize(join=True)`"),
                (r"`tuner resume (\S+?)`", r"`tuner.load_study('\1').optimize()`"))


def in_python_words(fn):
    """`fn` whose errors say what to do next in Python (tuner.load_study(NAME).optimize()), not with the
    CLI's `tuner resume NAME` or --study; the error keeps its class."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except StudyExists as exc:
            exc.args = (f"study '{exc.name}' exists: load it with tuner.load_study({exc.name!r}) (or pass "
                        "load_if_exists=True), or give create_study another name",)
            raise
        except TunerError as exc:
            text = str(exc)
            for pattern, words in PYTHON_WORDS:
                text = re.sub(pattern, words, text)
            exc.args = (text,)
            raise
    return wrapper


def _store(storage):
    """A Store, a URL, or None (TUNER_DB, else sqlite:///results/tuner.db) as an open Store."""
    from tuner.store import Store, open_store
    return storage if isinstance(storage, Store) else open_store(storage)


class Study:
    """A stored study: its settings, trials and recommendation, and the way to run more of it."""

    def __init__(self, store, name: str, runner: TrialRunner | None = None):
        self.store, self.name, self.runner = store, name, runner
        self.confidence: float | None = None     # of the guided stop rule, after optimize()
        self.stop_reason: str | None = None

    def __repr__(self) -> str:
        rec = self.record
        return (f"Study({self.name!r}: {rec.model} on {rec.nodes} x {rec.cluster}, runner {rec.runner}, "
                f"{len(self.trials)} trial(s), {rec.state})")

    @property
    def record(self):
        """The stored study (tuner.store.StudyRecord): workload, space, searcher, runner, settings."""
        return self.store.get_study(self.name)

    @property
    def trials(self) -> list:
        """Every trial (tuner.store.TrialRecord), in trial-number order."""
        return self.store.trials(self.name)

    @in_python_words
    def optimize(self, n_trials: int | None = None, timeout: float | None = None,
                 callbacks: list[Callable] | None = None, join: bool = False):
        """Run trials: until the study's budget (or `n_trials` more), the searcher's stop, the space's
        end or `timeout` seconds. A study that has run before continues where it stopped, re-running
        trials a dead driver left; `join=True` runs beside another live driver. Each callback gets the
        driver's Progress after every change. Returns the Outcome (ran and pruned by this call, reason, and
        earlier: the trials earlier runs counted in the budget)."""
        rec = self.record
        fresh = not self.trials and rec.state == "running"
        budget = None
        if n_trials is not None:
            if n_trials < 1:
                raise UsageError("n_trials must be >= 1")
            counted = sum(t.status not in (Status.PRUNED, Status.INTERRUPTED) for t in self.trials)
            budget = counted + int(n_trials)      # stored once the lease is taken (a refused call changes nothing)
        progress = (lambda p: [cb(p) for cb in callbacks]) if callbacks else None
        if fresh:
            studies.check_program(rec)        # created from another directory: a relative program means this one
            result = studies.run(self.store, self.store.get_study(self.name), runner=self.runner, budget=budget,
                                 on_progress=progress, time_limit=timeout)
        else:
            result = studies.resume(self.store, self.name, mode="join" if join else "run", runner=self.runner,
                                    budget=budget, on_progress=progress, time_limit=timeout)
        self.confidence = result.searcher.confidence
        self.stop_reason = result.searcher.stop_reason
        return result.outcome

    def best(self, k: int | None = None):
        """The recommended trial (the fastest that the study's framework runs), or None before any
        succeeded; with `k`, the k fastest as a list."""
        fast = studies.fastest(self.store, self.name, k or 1)
        return fast if k is not None else (fast[0] if fast else None)

    def trials_dataframe(self):
        """Every trial as a pandas DataFrame, one row per trial: the columns of `tuner export`."""
        import pandas as pd

        from tuner.report import EXPORT_COLUMNS, export_rows
        df = pd.DataFrame(export_rows(self.trials), columns=EXPORT_COLUMNS)
        for col in ("started", "ended"):
            df[col] = pd.to_datetime(df[col], utc=True)
        return df

    def config(self) -> str:
        """The study's settings as a study.toml (`tuner search --config` reads it)."""
        return dumps(self.record)


def _runner(runner: Any, runner_name: str | None, options: dict) -> tuple[str, TrialRunner | None]:
    """(stored name, object) of the runner argument: a name tuner can build, or an object with its name."""
    if isinstance(runner, str):
        if runner_name:
            raise UsageError("runner_name names a runner object: give runner=<object> with it")
        if runner not in runner_names():
            raise UsageError(f"unknown runner '{runner}': give one of {', '.join(runner_names())}, register one "
                             "(tuner.register_runner), or pass the runner object itself (runner=my_function)")
        return runner, None
    name = runner_name or default_name(runner)
    if not runner_name and name == "<lambda>":
        raise UsageError("a lambda has no name to store with the study: pass runner_name='my-trainer' with it")
    name = check_name(name)
    if name in RUNNERS:
        raise UsageError(f"runner object named '{name}', a built-in runner's name: pass runner_name='my-trainer'")
    return name, as_runner(runner, name, options.get("runner_options"))


@in_python_words
def create_study(name: str | None = None, *, storage=None, runner: Any = None, runner_name: str | None = None,
                 config: str | None = None, load_if_exists: bool = False, **options) -> Study:
    """Create (and store) a study; nothing runs until `optimize()`.

    `options`: `tuner search`'s options (model, nodes, cluster, global_batch, precision, framework,
    space, searcher, budget, parallel, seed, stop_threshold, ..., and layout pins such as tp=8);
    `config`: a study.toml whose keys the options override. `storage`: a database URL or a Store
    (default TUNER_DB, else sqlite:///results/tuner.db). With `load_if_exists`, a study of that name
    already stored is loaded instead (its stored settings win)."""
    store = _store(storage)
    if load_if_exists and name and name in store.study_names():
        return load_study(name, storage=store, runner=runner, runner_name=runner_name)
    given = {**(read(config) if config else {}), **options}
    if name:
        given["study"] = name
    stored_name, obj = _runner(runner if runner is not None else given.get("runner", "sim"), runner_name, given)
    given["runner"] = stored_name
    rec = record(_checked(given, "create_study"), set(store.study_names()))
    rec = studies.create(store, rec, obj)
    return Study(store, rec.name, obj)


def _checked(given: dict, where: str) -> dict:
    """Checked options, a runner name outside the CLI's built-in choices included."""
    runner = given.pop("runner", "sim")
    o = check(given, where)
    o["runner"] = runner          # checked by _runner (a Python object's name is not in the registry)
    return o


@in_python_words
def load_study(name: str, *, storage=None, runner: Any = None, runner_name: str | None = None) -> Study:
    """A stored study (created here or by `tuner search`). `runner`: the object to run it with when its
    runner is not one tuner builds by name; it must carry the stored name (runner_name=...)."""
    store = _store(storage)
    rec = store.get_study(name)
    obj = None
    if runner is not None and not isinstance(runner, str):     # its own name: runner_for refuses another one
        obj = as_runner(runner, runner_name or default_name(runner), rec.settings.get("runner_options"))
        studies.runner_for(rec, None, obj)
    elif isinstance(runner, str) and runner != rec.runner:
        raise UsageError(f"study '{name}' is run by runner '{rec.runner}', not '{runner}'")
    return Study(store, name, obj)

