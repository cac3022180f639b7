"""The results store: the single source of truth for studies and trials (SQLite or PostgreSQL).

One short transaction (one session) per call, so one Store serves many threads. Writes on SQLite take
the write lock up front (BEGIN IMMEDIATE, WAL, 30 s busy timeout); on PostgreSQL a claim locks its study
row and any race is caught by unique (study_id, layout_key) and retried, so two drivers never claim the
same layout. Lost PostgreSQL connections are retried with backoff, then reported as a StoreError.
"""

from __future__ import annotations

import contextlib
import os
import random
import threading
import time
from typing import Callable, Iterable, TypeVar

from sqlalchemy import Engine, func, select, update
from sqlalchemy.engine import URL
from sqlalchemy.exc import DBAPIError, IntegrityError, SQLAlchemyError
from sqlalchemy.orm import Session
from sqlalchemy.pool import StaticPool

from tuner.errors import BudgetSpent, Displaced, NoStore, StoreError, StoreNotWritable, StudyExists, UnknownStudy
from tuner.store.engine import BUSY_TIMEOUT_S, URL_HINT, _engine_for, _reason, _sqlstate, redact
from tuner.layout import Layout
from tuner.metrics import trial_rank_key
from tuner.specs import stored_framework
from tuner.perfmodel.prediction import Prediction
from tuner.store import migrations
from tuner.store.models import (MEASURED, PREDICTED, STUDY_STATES, MetaRow, StudyRecord, StudyRow, TrialRecord,
                                TrialRow, scrub, utcnow)
from tuner.trial import Status, TrialResult

RECONNECT_DELAYS_S = (0.25, 0.5, 1.0, 2.0, 4.0)   # then give up with a StoreError
CONFLICT_RETRIES = 100
TIES = 16            # best(): rows read beyond k per study, so that equal speeds are ordered by rank_key
T = TypeVar("T")


def _unknown(s: Session, name: str) -> UnknownStudy:
    return UnknownStudy(name, list(s.execute(select(StudyRow.name).order_by(StudyRow.name)).scalars()))


class Store:
    """Studies and trials in one database. Create with `open_store`."""

    def __init__(self, engine: Engine, url: URL, shown: str | None = None):
        self.engine = engine
        self.url = shown or redact(url)
        self._sqlite = url.get_backend_name() == "sqlite"
        self._writer = engine.execution_options(tuner_write=True)
        # A memory database is one shared connection: serialise its transactions.
        self._lock = threading.RLock() if isinstance(engine.pool, StaticPool) else contextlib.nullcontext()
        self._pid = os.getpid()
        self._study_ids: dict[str, int] = {}

    # ---- plumbing -----------------------------------------------------------------------------
    def _error(self, exc: BaseException, doing: str) -> StoreError:
        reason = _reason(exc)
        if self._sqlite and "readonly" in reason.replace("-", "").replace(" ", "").lower():
            return StoreNotWritable(f"SQLite database at {self.url} is read-only ({reason}): make the file and its "
                              "directory writable, or use another --db")
        if self._sqlite and "locked" in reason:
            return StoreError(f"SQLite database at {self.url} stayed locked for {BUSY_TIMEOUT_S} s while {doing}: "
                              "another process holds it; retry, or use PostgreSQL for many drivers")
        return StoreError(f"results store at {self.url} failed while {doing} ({reason}): {URL_HINT}")

    def _disconnected(self, exc: DBAPIError) -> bool:
        if self._sqlite:
            return False
        state = _sqlstate(exc)
        return exc.connection_invalidated or state is None or state.startswith("08") or state in (
            "57P01", "57P02", "57P03")

    def _tx(self, fn: Callable[[Session], T], doing: str, write: bool = False, retry_conflicts: bool = False,
            reconnect: bool = True) -> T:
        """Run fn in one transaction; retry conflicts and lost connections, map failures to StoreError."""
        if os.getpid() != self._pid:          # forked: never share pooled connections with the parent
            self.engine.dispose(close=False)
            self._pid = os.getpid()
        conflicts, reconnects = 0, 0
        while True:
            try:
                with self._lock, Session(self._writer if write else self.engine, expire_on_commit=False) as s:
                    with s.begin():
                        return fn(s)
            except IntegrityError:
                conflicts += 1
                if not retry_conflicts or conflicts > CONFLICT_RETRIES:
                    raise
                time.sleep(random.uniform(0, 0.002 * min(conflicts, 20)))
            except DBAPIError as exc:
                if _sqlstate(exc) in ("40001", "40P01") and conflicts < CONFLICT_RETRIES:
                    conflicts += 1
                    time.sleep(random.uniform(0, 0.01))
                elif reconnect and self._disconnected(exc):
                    if reconnects == len(RECONNECT_DELAYS_S):
                        raise StoreError(f"lost the connection to the results store at {self.url} while {doing} "
                                         f"({_reason(exc)}; {reconnects} retries over {sum(RECONNECT_DELAYS_S):.0f} s): "
                                         "check that the database server is up, then resume the study") from None
                    time.sleep(RECONNECT_DELAYS_S[reconnects])
                    reconnects += 1
                else:
                    raise self._error(exc, doing) from None
            except SQLAlchemyError as exc:
                raise self._error(exc, doing) from None

    def _open(self, create: bool = True, read_only: bool = False) -> None:
        """Create a fresh schema, check the revision, and prove we can write (read_only: only read the
        revision; stamp nothing). No retries: fail fast."""
        def init(s: Session) -> None:
            conn = s.connection()
            state = migrations.read_state(conn)
            if state.empty and not create:
                raise NoStore(self.url)
            if state.empty:
                migrations.create(conn)
                return
            migrations.require_head(state, self.url)
            if read_only:
                return
            if state.legacy:     # today's schema, written before tuner used Alembic: record its revision
                migrations.stamp(conn, migrations.HEAD)
            elif self._sqlite:   # a read-only file fails here, before any work starts
                conn.execute(update(MetaRow).where(MetaRow.key == "schema_version").values(value=MetaRow.value))
        for attempt in range(5):
            try:
                return self._tx(init, "opening it", write=not read_only, reconnect=False)
            except IntegrityError:   # another process created the schema at the same moment
                if attempt == 4:
                    raise
            except StoreError as exc:   # concurrent CREATE TABLE on PostgreSQL: look again
                if "already exists" not in str(exc) or attempt == 4:
                    raise

    def _study_id(self, s: Session, name: str, lock: bool = False) -> int:
        sid = self._study_ids.get(name)
        if sid is None or lock:
            q = select(StudyRow.id).where(StudyRow.name == name)
            sid = s.execute(q.with_for_update(key_share=True) if lock else q).scalar()
            if sid is None:
                raise _unknown(s, name)
            self._study_ids[name] = sid
        return sid

    # ---- studies ------------------------------------------------------------------------------
    def create_study(self, rec: StudyRecord) -> None:
        if rec.state not in STUDY_STATES:
            raise ValueError(f"study state must be one of {STUDY_STATES}, got {rec.state!r}")
        def add(s: Session) -> None:
            if s.execute(select(StudyRow.id).where(StudyRow.name == rec.name)).first():
                raise StudyExists(rec.name)
            s.add(rec.to_row())
        try:
            self._tx(add, f"creating study '{rec.name}'", write=True)
        except IntegrityError:
            raise StudyExists(rec.name) from None

    def get_study(self, name: str) -> StudyRecord:
        def get(s: Session) -> StudyRecord:
            row = s.execute(select(StudyRow).where(StudyRow.name == name)).scalar()
            if row is None:
                raise _unknown(s, name)
            return StudyRecord.from_row(row)
        return self._tx(get, f"reading study '{name}'")

    def list_studies(self) -> list[StudyRecord]:
        return self._tx(lambda s: [StudyRecord.from_row(r) for r in s.execute(
            select(StudyRow).order_by(StudyRow.created, StudyRow.id)).scalars()], "listing studies")

    def study_names(self) -> list[str]:
        return self._tx(lambda s: list(s.execute(select(StudyRow.name).order_by(StudyRow.name)).scalars()),
                        "listing studies")

    def set_study_state(self, name: str, state: str) -> None:
        if state not in STUDY_STATES:
            raise ValueError(f"study state must be one of {STUDY_STATES}, got {state!r}")
        def set_state(s: Session) -> None:
            s.execute(update(StudyRow).where(StudyRow.id == self._study_id(s, name)).values(state=state))
        self._tx(set_state, f"updating study '{name}'", write=True)

    def update_study_settings(self, name: str, settings: dict) -> None:
        def merge(s: Session) -> None:
            row = s.execute(select(StudyRow).where(StudyRow.id == self._study_id(s, name))
                            .with_for_update()).scalar_one()
            row.settings = {**(row.settings or {}), **scrub(dict(settings))}
        self._tx(merge, f"updating study '{name}'", write=True)

    def modify_study_settings(self, name: str, change: Callable[[dict], dict | None]) -> None:
        """Read-modify-write of a study's settings under a row lock (one decision among many drivers):
        `change(settings)` returns the keys to merge, or None; an exception it raises aborts the write."""
        def modify(s: Session) -> None:
            row = s.execute(select(StudyRow).where(StudyRow.id == self._study_id(s, name))
                            .with_for_update()).scalar_one()
            new = change(dict(row.settings or {}))
            if new is not None:
                row.settings = {**(row.settings or {}), **scrub(dict(new))}
        self._tx(modify, f"updating study '{name}'", write=True)

    # ---- trials -------------------------------------------------------------------------------
    def _fence(self, s: Session, sid: int, study: str, epoch: int | None) -> dict:
        """The study's settings; Displaced when `epoch` (a driver's lease) is not the study's any more."""
        settings = s.execute(select(StudyRow.settings).where(StudyRow.id == sid)).scalar() or {}
        if epoch is not None and int(settings.get("epoch") or 0) != epoch:
            raise Displaced(study)
        return settings

    def _claim(self, s: Session, study: str, layout: Layout, prediction: Prediction | None, runner: str,
               budget: int | None = None, epoch: int | None = None) -> int | None:
        sid = self._study_id(s, study, lock=True)     # serialises claims on one study (PostgreSQL)
        if epoch is not None:                          # a driver's claim: fenced, within the stored budget
            settings = self._fence(s, sid, study, epoch)
            budget = budget if budget is not None else settings.get("budget")
        if budget is not None:                         # the budget holds across every driver of the study
            spent = s.execute(select(func.count()).where(TrialRow.study_id == sid, TrialRow.status.not_in(
                [Status.PRUNED.value, Status.INTERRUPTED.value]))).scalar()
            if spent >= budget:
                raise BudgetSpent(f"study '{study}' has run or is running {spent} trial(s) of its budget of {budget}")
        key = layout.key()
        row = s.execute(select(TrialRow).where(TrialRow.study_id == sid, TrialRow.layout_key == key)).scalar()
        now = utcnow()
        if row is not None:
            reclaimed = s.execute(update(TrialRow).where(TrialRow.id == row.id, TrialRow.status == Status.INTERRUPTED.value)
                                  .values(status=Status.RUNNING.value, attempts=TrialRow.attempts + 1, runner=runner,
                                          started_at=now, ended_at=None, message="")).rowcount
            return row.number if reclaimed == 1 else None
        number = (s.execute(select(func.max(TrialRow.number)).where(TrialRow.study_id == sid)).scalar() or 0) + 1
        predicted = {col: (getattr(prediction, attr) if prediction is not None else None)
                     for col, attr in PREDICTED.items()}
        s.add(TrialRow(study_id=sid, number=number, layout_key=key, **layout.as_dict(), status=Status.RUNNING.value,
                       **predicted, message="", runner=runner, started_at=now, attempts=1, extra={}))
        s.flush()
        return number

    def _finish(self, s: Session, sid: int, number: int, result: TrialResult, extra: dict | None) -> None:
        row = s.execute(select(TrialRow).where(TrialRow.study_id == sid, TrialRow.number == number)).scalar()
        if row is None:
            raise StoreError(f"trial {number} is not in this study: claim it with claim_trial first")
        for name in MEASURED:
            setattr(row, name, getattr(result, name))
        row.status = Status(result.status).value
        row.message = scrub(result.message or "")
        row.log_path = result.log_path
        row.ended_at = utcnow()
        if extra:
            row.extra = {**(row.extra or {}), **scrub(dict(extra))}

    def claim_trial(self, study: str, layout: Layout, prediction: Prediction | None, runner: str,
                    budget: int | None = None, epoch: int | None = None) -> int | None:
        """Mark `layout` running in `study` and return its trial number, or None if another has it.
        With `budget`, or `epoch` (a driver's lease, tuner.lease) and the budget stored with the study
        now: BudgetSpent when the study's trials that ran or run (not pruned) reach it. With `epoch`:
        Displaced when the study was taken over since."""
        return self._tx(lambda s: self._claim(s, study, layout, prediction, runner, budget, epoch),
                        f"claiming {layout.key()} in study '{study}'", write=True, retry_conflicts=True)

    def record_trial(self, study: str, layout: Layout, prediction: Prediction | None, result: TrialResult,
                     runner: str, epoch: int | None = None) -> int | None:
        """Claim and finish in one transaction (a layout pruned without running)."""
        def record(s: Session) -> int | None:
            if epoch is not None:
                self._fence(s, self._study_id(s, study, lock=True), study, epoch)
            number = self._claim(s, study, layout, prediction, runner)
            if number is not None:
                self._finish(s, self._study_id(s, study), number, result, None)
            return number
        return self._tx(record, f"recording {layout.key()} in study '{study}'", write=True, retry_conflicts=True)

    def finish_trial(self, study: str, number: int, result: TrialResult, extra: dict | None = None,
                     epoch: int | None = None) -> None:
        """Store a claimed trial's result; with `epoch`, Displaced (nothing written) when the study was
        taken over since that driver's lease."""
        def finish(s: Session) -> None:
            sid = self._study_id(s, study)
            if epoch is not None:
                self._fence(s, sid, study, epoch)
            self._finish(s, sid, number, result, extra)
        self._tx(finish, f"finishing trial {number} of study '{study}'", write=True)

    def trials(self, study: str, statuses: Iterable[Status] | None = None) -> list[TrialRecord]:
        def get(s: Session) -> list[TrialRecord]:
            srow = s.get(StudyRow, self._study_id(s, study))
            q = select(TrialRow).where(TrialRow.study_id == srow.id).order_by(TrialRow.number)
            if statuses is not None:
                q = q.where(TrialRow.status.in_([Status(x).value for x in statuses]))
            return [TrialRecord.from_row(t, srow) for t in s.execute(q).scalars()]
        return self._tx(get, f"reading trials of study '{study}'")

    def mark_interrupted(self, study: str, numbers: Iterable[int] | None = None) -> int:
        """Running trials -> interrupted (all of the study's, or those numbers); returns how many."""
        nums = None if numbers is None else list(numbers)
        def mark(s: Session) -> int:
            q = update(TrialRow).where(TrialRow.study_id == self._study_id(s, study),
                                       TrialRow.status == Status.RUNNING.value)
            if nums is not None:
                q = q.where(TrialRow.number.in_(nums))
            return s.execute(q.values(status=Status.INTERRUPTED.value, ended_at=utcnow())).rowcount
        return 0 if nums == [] else self._tx(mark, f"marking trials of study '{study}' interrupted", write=True)

    def best(self, model: str, cluster: str, nodes: int, k: int = 1, study: str | None = None,
             global_batch: int | None = None, precision: str | None = None,
             framework: str | None = None) -> list[TrialRecord]:
        """The k fastest ok trials (highest MFU) of every study of that model, cluster and node count
        (and global batch and precision, when given: speeds at another batch or in bf16 vs fp8 do not
        compare; a study stored before precision existed is bf16), and framework (a layout's speed and
        memory are its framework's).

        The top k of each matching study (index range on (study_id, status, mfu)), merged:
        fast whatever the number of trials and whether anything matches."""
        if k <= 0:
            return []
        def run(s: Session) -> list[TrialRecord]:
            q = select(StudyRow).where(StudyRow.model_name == model, StudyRow.cluster_name == cluster,
                                       StudyRow.nodes == int(nodes))
            if global_batch is not None:
                q = q.where(StudyRow.global_batch == int(global_batch))
            studies = {r.id: r for r in s.execute(q if study is None else q.where(StudyRow.name == study)).scalars()
                       if (precision is None or (r.workload or {}).get("precision", "bf16") == precision)
                       and (framework is None or stored_framework(r.workload) == framework)}
            rows: list[TrialRow] = []
            for sid in studies:
                rows += s.execute(select(TrialRow).where(
                    TrialRow.study_id == sid, TrialRow.status == Status.OK.value, TrialRow.mfu.is_not(None))
                    .order_by(TrialRow.mfu.desc(), TrialRow.number).limit(k + TIES)).scalars()
            found = sorted((TrialRecord.from_row(t, studies[t.study_id]) for t in rows),
                           key=lambda t: (*trial_rank_key(t), t.study, t.number))
            return found[:k]
        return self._tx(run, "finding the best trials")

    def counts(self, study: str) -> dict[str, int]:
        def count(s: Session) -> dict[str, int]:
            q = (select(TrialRow.status, func.count()).where(TrialRow.study_id == self._study_id(s, study))
                 .group_by(TrialRow.status))
            return {status: n for status, n in s.execute(q)}
        return self._tx(count, f"counting trials of study '{study}'")

    def close(self) -> None:
        self.engine.dispose()

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Store({self.url!r})"


def open_store(url: str | None = None, create: bool = True, read_only: bool = False) -> Store:
    """The store at `url`, else $TUNER_DB, else results/tuner.db in the working directory. With
    create=False a store that does not exist yet is NoStore, never created; with read_only (commands
    that only read: studies, trials, best, report, export, config, db current) a SQLite file is opened
    read-only, so a read-only file or directory (an archived study, a shared results file) reads as any
    other, and a write on it fails as StoreNotWritable."""
    engine, parsed, shown = _engine_for(url, create and not read_only, read_only)
    store = Store(engine, parsed, shown)
    try:
        store._open(create and not read_only, read_only)
    except BaseException:
        engine.dispose()
        raise
    return store


def _schema_tx(url: str | None, fn: Callable, doing: str, create: bool = True, write: bool = True) -> str:
    """fn(connection, shown URL) in one transaction on the store at `url`, without opening it as a Store
    (one that does not `write`: read-only)."""
    engine, parsed, shown = _engine_for(url, create, read_only=not write)
    store = Store(engine, parsed, shown)
    try:
        return store._tx(lambda s: fn(s.connection(), store.url), doing, write=write, reconnect=False)
    finally:
        engine.dispose()


def upgrade(url: str | None = None) -> str:
    """Bring the schema at `url` to this tuner's revision (creating it if empty); say from which to which."""
    return _schema_tx(url, migrations.upgrade, "upgrading its schema")


def current(url: str | None = None) -> str:
    """The revision of the store at `url` and whether it is up to date; creates nothing."""
    return _schema_tx(url, migrations.current, "reading its schema version", create=False, write=False)
