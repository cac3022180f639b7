"""The results store: the single source of truth for studies and trials (SQLite or PostgreSQL).

One short transaction (one session) per call, so one Store serves many threads. Writes on SQLite take
the write lock up front (BEGIN IMMEDIATE, WAL, 30 s busy timeout); on PostgreSQL a claim locks its study
row and any race is caught by unique (study_id, layout_key) and retried, so two drivers never claim the
same layout. Lost PostgreSQL connections are retried with backoff, then reported as a StoreError.

Three rooms, one on another: `Database` (tuner.store.session: the transactions), `Claims`
(tuner.store.claims: a trial's fenced life and the lease's settings) and `Store` here (studies and the
queries every command reads).
"""

from __future__ import annotations

from typing import Callable, Iterable

from sqlalchemy import func, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from tuner.errors import StudyExists
from tuner.metrics import trial_rank_key
from tuner.specs import stored_framework, stored_setting
from tuner.store import migrations
from tuner.store.claims import Claims
from tuner.store.engine import _engine_for
from tuner.store.models import STUDY_STATES, StudyRecord, StudyRow, TrialRecord, TrialRow, scrub
from tuner.store.session import _unknown
from tuner.trial import Status

TIES = 16            # best(): rows read beyond k per study, so that equal speeds are ordered by rank_key


class Store(Claims):
    """Studies and trials in one database. Create with `open_store`."""

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

    def trials(self, study: str, statuses: Iterable[Status] | None = None) -> list[TrialRecord]:
        def get(s: Session) -> list[TrialRecord]:
            srow = s.get(StudyRow, self._study_id(s, study))
            q = select(TrialRow).where(TrialRow.study_id == srow.id).order_by(TrialRow.number)
            if statuses is not None:
                q = q.where(TrialRow.status.in_([Status(x).value for x in statuses]))
            return [TrialRecord.from_row(t, srow) for t in s.execute(q).scalars()]
        return self._tx(get, f"reading trials of study '{study}'")

    def best(self, model: str, cluster: str, nodes: int, k: int = 1, study: str | None = None,
             global_batch: int | None = None, precision: str | None = None,
             framework: str | None = None, optimizer_moments: str | None = None) -> list[TrialRecord]:
        """The k fastest ok trials (highest MFU) of every study of that model, cluster and node count
        (and global batch, precision and optimizer moments, when given: speeds at another batch or in bf16
        vs fp8, and peaks with bf16 vs fp32 Adam moments, do not compare; a study stored before a setting
        existed has its default: tuner.specs.stored_setting), and framework (a layout's speed and memory
        are its framework's).

        The top k of each matching study (index range on (study_id, status, mfu)), merged:
        fast whatever the number of trials and whether anything matches."""
        if k <= 0:
            return []
        settings = {k: v for k, v in (("precision", precision), ("optimizer_moments", optimizer_moments)) if v}

        def run(s: Session) -> list[TrialRecord]:
            q = select(StudyRow).where(StudyRow.model_name == model, StudyRow.cluster_name == cluster,
                                       StudyRow.nodes == int(nodes))
            if global_batch is not None:
                q = q.where(StudyRow.global_batch == int(global_batch))
            studies = {r.id: r for r in s.execute(q if study is None else q.where(StudyRow.name == study)).scalars()
                       if all(stored_setting(r.workload, k) == v for k, v in settings.items())
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
