"""A stored tuner study as an optuna study, so that optuna-dashboard and optuna's importances and plots
read it (`tuner export NAME --format optuna --storage URL`).

`distributions`, `frozen_trials` and `study_attrs` are pure: a StudyRecord and its TrialRecords in,
optuna's objects out. `write_study` is the one effect: it checks the storage URL and writes the study.

The mapping (docs/commands/export.md):
- one optuna trial per finished tuner trial, in trial-number order (optuna numbers them 0, 1, ...; the
  tuner number is the user attr `tuner_trial`). Running and interrupted trials are left out: they have
  no result yet, and an optuna trial copied as RUNNING would stay RUNNING in the copy for ever; export
  again with --force once `tuner resume` has run them.
- params: the searched layout dimensions. dp follows from GPUs / (tp·cp·pp), so it is a user attr, not
  a param: an importance would otherwise split one effect between a dimension and its derived twin.
  Integer dimensions that tuner's searchers compare on a log2 scale (tp, cp, pp, vp, micro_batch) are
  IntDistribution(log=True), zero_stage an IntDistribution, sequence_parallel and recompute categorical:
  slices and contours then keep the order of the degrees. Each distribution covers the study's search
  space (SearchSpace.from_record) and every stored value.
- value: MFU (fraction of peak, from the measured samples/s: tuner's ranking metric), maximised.
- states: ok -> COMPLETE; oom, timeout, failed -> FAIL; pruned (the memory model said it cannot fit:
  never launched) and stopped (cut early by the searcher) -> PRUNED; the tuner status is the user attr
  `status`. An ok trial without a stored MFU (written by a tuner that did not compute it) is FAIL.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from tuner.errors import TunerError, UsageError
from tuner.layout import BY_NAME, SEARCHED
from tuner.space import SearchSpace
from tuner.specs import Workload, stored_framework
from tuner.store.models import MEASURED, PREDICTED, scrub
from tuner.trial import Status

OBJECTIVE = "mfu"
OBJECTIVE_TEXT = ("MFU: model-FLOPs utilisation, the fraction of the GPUs' peak that the measured (or, for the "
                  "sim runner, predicted) samples/s reach; tuner ranks layouts by it: maximize")
LEFT_OUT = (Status.RUNNING, Status.INTERRUPTED)
PRUNED = (Status.PRUNED, Status.STOPPED)
VIEW = "optuna-dashboard"


def _optuna():
    import optuna
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna


# ---------------------------------------------------------------------------------------------- pure

def space_choices(rec) -> dict[str, set]:
    """The values each searched dimension takes among the valid layouts of the study's space (what the
    study searched: a choice no valid layout has, cp 2 for a 2048-token sequence, is left out, so that
    the importances do not weigh values that were never possible); empty where the stored workload or
    space no longer loads (the stored values alone then make the distribution)."""
    try:
        layouts = SearchSpace.from_record(rec.space or {}).enumerate_layouts(Workload.from_dict(rec.workload))
    except (TunerError, KeyError, TypeError, ValueError):
        layouts = []
    return {d: {getattr(lay, d) for lay in layouts} for d in SEARCHED}


def distributions(rec, trials) -> dict:
    """One optuna distribution per searched layout dimension, covering the space and the stored values."""
    from optuna.distributions import CategoricalDistribution, IntDistribution
    space = space_choices(rec)
    out = {}
    for name in SEARCHED:
        dim = BY_NAME[name]
        values = space[name] | {getattr(t.layout, name) for t in trials}
        if not values:           # no valid layout and no trial (a study whose workload no longer loads)
            continue
        ordered = sorted(values, key=dim.ordinal)
        if dim.type is int:
            log = dim.log2 and ordered[0] >= 1
            out[name] = IntDistribution(ordered[0], ordered[-1], log=log)
        else:
            out[name] = CategoricalDistribution(ordered)
    return out


def _local(t: datetime) -> datetime:
    """optuna stores naive local times (datetime.now()); tuner stores UTC."""
    return t.astimezone().replace(tzinfo=None)


def trial_attrs(t) -> dict:
    """A trial's user attrs: its tuner number, layout key, dp, status, source, metrics (None left out)."""
    attrs = {"tuner_trial": t.number, "layout_key": t.layout.key(), "dp": t.layout.dp, "status": str(t.status),
             "runner": t.runner, "source": "simulated" if t.runner == "sim" else "measured",
             **{k: getattr(t, k) for k in (*MEASURED, *PREDICTED)},
             "attempts": t.attempts, "message": t.message or None, "log_path": t.log_path}
    return {k: v for k, v in attrs.items() if v is not None}


def state_of(t):
    """(optuna TrialState, value) of a finished tuner trial."""
    from optuna.trial import TrialState
    if t.status == Status.OK:
        return (TrialState.COMPLETE, t.mfu) if t.mfu is not None else (TrialState.FAIL, None)
    return (TrialState.PRUNED, None) if t.status in PRUNED else (TrialState.FAIL, None)


def frozen_trials(rec, trials) -> tuple[list, int]:
    """(optuna FrozenTrials of the finished trials in trial-number order, number of trials left out)."""
    from optuna.trial import create_trial
    dists = distributions(rec, trials)
    kept = sorted((t for t in trials if t.status not in LEFT_OUT), key=lambda t: t.number)
    out = []
    for t in kept:
        state, value = state_of(t)
        ft = create_trial(state=state, value=value, params={d: getattr(t.layout, d) for d in dists},
                          distributions=dists, user_attrs=trial_attrs(t))
        start = t.started or t.ended or rec.created or datetime.now(timezone.utc)
        ft.datetime_start, ft.datetime_complete = _local(start), _local(t.ended or start)
        out.append(ft)
    return out, len(trials) - len(kept)


def study_attrs(rec) -> dict:
    """The optuna study's user attrs: what was tuned, where, and what the value is."""
    w = rec.workload
    return {"objective": OBJECTIVE_TEXT, "direction": "maximize", "model": rec.model, "cluster": rec.cluster,
            "nodes": rec.nodes, "gpus": rec.nodes * int(w.get("cluster", {}).get("gpus_per_node", 0) or 0),
            "framework": stored_framework(w), "precision": w.get("precision") or "bf16",
            "global_batch": rec.global_batch, "tuner_study": rec.name, "tuner_version": rec.tuner_version,
            "searcher": rec.searcher, "runner": rec.runner, "state": rec.state,
            "space": (rec.space or {}).get("name", ""), **({"created": rec.created.isoformat()} if rec.created else {})}


# ------------------------------------------------------------------------------------------ effects

def _database(url) -> tuple:
    """What names one database: a SQLite file's absolute path, else backend, host, port, database."""
    backend = url.get_backend_name()
    if backend == "sqlite":
        db = url.database or ""
        if db in ("", ":memory:") or "mode=memory" in db:
            return ("sqlite", ":memory:", id(url))        # every in-memory database is its own
        return ("sqlite", str(Path(db.removeprefix("file:").split("?", 1)[0]).resolve()))
    return (backend, (url.host or "").lower(), url.port, url.database)


def check_storage(storage: str, store_url) -> None:
    """Refuse a --storage that is not a URL, that is tuner's own store, or that holds other tables named
    like optuna's (`studies`, `trials`): optuna would add its tables beside them, then fail."""
    from sqlalchemy import create_engine, inspect
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError, SQLAlchemyError
    shown = scrub(storage)
    try:
        url = make_url(storage)
    except ArgumentError:
        raise UsageError(f"--storage {shown} is not a database URL: e.g. --storage sqlite:///optuna.db") from None
    if _database(url) == _database(store_url):
        raise UsageError(f"--storage {shown} is tuner's own store (--db): optuna's tables `studies` and `trials` "
                         "would clash with tuner's; give optuna its own database, e.g. --storage sqlite:///optuna.db")
    if url.get_backend_name() == "sqlite":
        if _database(url)[1] == ":memory:":
            raise UsageError(f"--storage {shown} is in memory and gone when tuner exits: give a file, "
                             "e.g. --storage sqlite:///optuna.db")
        path = Path(_database(url)[1])
        if not path.parent.is_dir():
            raise UsageError(f"--storage {shown}: directory {path.parent} does not exist; create it or choose another")
        if not path.exists():
            return
    try:
        engine = create_engine(url)
        try:
            names = set(inspect(engine).get_table_names())
        finally:
            engine.dispose()
    except (SQLAlchemyError, ImportError) as exc:
        raise UsageError(f"--storage {shown}: cannot open it ({scrub(str(exc).splitlines()[0])})") from None
    if names & {"studies", "trials"} and "version_info" not in names:
        raise UsageError(f"--storage {shown} holds tables `studies`/`trials` that are not optuna's (a tuner store?): "
                         "give optuna a database of its own, e.g. --storage sqlite:///optuna.db")


@dataclass
class Written:
    """What write_study wrote: the optuna study's name, where, its trials per state, trials left out."""

    name: str
    storage: str
    states: dict[str, int] = field(default_factory=dict)
    left_out: int = 0

    def line(self) -> str:
        n = sum(self.states.values())
        counts = ", ".join(f"{k} {v}" for k, v in self.states.items()) or "none"
        skipped = f"; {self.left_out} running/interrupted left out" if self.left_out else ""
        shown = scrub(self.storage)
        return (f"wrote optuna study {self.name} to {shown}: {n} trial(s) ({counts}{skipped}), value = MFU "
                f"(maximize); view it: {VIEW} {shown}")


def _open_storage(optuna, storage: str):
    shown = scrub(storage)
    from sqlalchemy.exc import SQLAlchemyError
    try:
        return optuna.storages.RDBStorage(storage)
    except (SQLAlchemyError, ImportError, RuntimeError, ValueError) as exc:   # RuntimeError: an older schema
        raise UsageError(f"--storage {shown}: optuna cannot use it ({scrub(str(exc).splitlines()[0])})") from None


def write_study(storage: str, rec, trials, *, store_url, force: bool = False) -> Written:
    """Write study `rec` with `trials` as an optuna study of the same name in `storage` (an optuna RDB URL).
    An optuna study of that name is refused unless `force` (then replaced). Nothing is left half-written."""
    optuna = _optuna()
    check_storage(storage, store_url)
    frozen, left_out = frozen_trials(rec, trials)       # built first: a trial that does not convert writes nothing
    st = _open_storage(optuna, storage)
    if rec.name in optuna.get_all_study_names(storage=st):
        if not force:
            raise UsageError(f"--storage {scrub(storage)} already has an optuna study named '{rec.name}': pass --force "
                             "to replace it, or give another --storage")
        optuna.delete_study(study_name=rec.name, storage=st)
    study = optuna.create_study(storage=st, study_name=rec.name, direction="maximize")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            study.set_metric_names([OBJECTIVE])
        for k, v in study_attrs(rec).items():
            study.set_user_attr(k, v)
        study.add_trials(frozen)
    except BaseException:
        optuna.delete_study(study_name=rec.name, storage=st)
        raise
    named = [ft.state.name.lower() for ft in frozen]
    states = {s: named.count(s) for s in ("complete", "fail", "pruned") if s in named}
    return Written(rec.name, storage, states, left_out)
