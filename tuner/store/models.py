"""The store's schema (SQLAlchemy 2 ORM), its versions and migrations, and the records it hands out.

Tables: `meta` (schema_version), `studies` (one search) and a wide, typed `trials` table (one measured
or predicted layout: the six layout fields, the measured metrics and the predicted ones as columns).
A layout is at most once per study: unique (study_id, layout_key). Trials are ranked by `mfu` (model-FLOPs
utilisation from the measured samples/s: training speed); `tflops_per_gpu` / `peak_fraction` keep
Megatron's count (recompute included), reported beside it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Callable

from sqlalchemy import (JSON, Boolean, DateTime, Float, ForeignKey, Index, Integer, String, Text,
                        UniqueConstraint, inspect, select, update)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

import tuner
from tuner.errors import StoreError
from tuner.layout import DIMENSIONS, Layout
from tuner.trial import Status

SCHEMA_VERSION = 4
STUDY_STATES = ("running", "done", "interrupted")

Json = JSON().with_variant(JSONB(), "postgresql")
Stamp = DateTime(timezone=True)

# scheme://user:password@  and  password=...  (query strings, DSNs)
_PASSWORD_IN_URL = re.compile(r"(\b[a-zA-Z][\w+.-]*://[^/\s:@]*:)([^@\s/]+)(@)")
_PASSWORD_PARAM = re.compile(r"(\bpassword=)([^&\s]+)", re.IGNORECASE)


def scrub(value: Any) -> Any:
    """`value` with any password inside a URL or a password=... parameter replaced by ***."""
    if isinstance(value, str):
        return _PASSWORD_PARAM.sub(r"\1***", _PASSWORD_IN_URL.sub(r"\1***\3", value))
    if isinstance(value, dict):
        return {k: scrub(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [scrub(v) for v in value]
    return value


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


def aware(t: datetime | None) -> datetime | None:
    """SQLite returns naive datetimes; every stored time is UTC."""
    if t is None:
        return None
    return t.replace(tzinfo=timezone.utc) if t.tzinfo is None else t.astimezone(timezone.utc)


class Base(DeclarativeBase):
    pass


class MetaRow(Base):
    __tablename__ = "meta"
    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[str] = mapped_column(String(256))


class StudyRow(Base):
    __tablename__ = "studies"
    __table_args__ = (Index("ix_studies_workload", "model_name", "cluster_name", "nodes"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(200), unique=True)
    model_name: Mapped[str] = mapped_column(String(200))
    cluster_name: Mapped[str] = mapped_column(String(200))
    nodes: Mapped[int] = mapped_column(Integer)
    global_batch: Mapped[int] = mapped_column(Integer)
    workload: Mapped[dict] = mapped_column(Json)
    space: Mapped[dict] = mapped_column(Json)
    searcher: Mapped[str] = mapped_column(String(64))
    runner: Mapped[str] = mapped_column(String(64))
    settings: Mapped[dict] = mapped_column(Json)
    state: Mapped[str] = mapped_column(String(16), default="running")
    created: Mapped[datetime] = mapped_column(Stamp)
    tuner_version: Mapped[str] = mapped_column(String(32))


class TrialRow(Base):
    __tablename__ = "trials"
    __table_args__ = (
        UniqueConstraint("study_id", "number", name="uq_trials_study_number"),
        UniqueConstraint("study_id", "layout_key", name="uq_trials_study_layout"),
        Index("ix_trials_speed", "study_id", "status", "mfu"),   # best(), trials(statuses), counts()
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    study_id: Mapped[int] = mapped_column(ForeignKey("studies.id", ondelete="CASCADE"))
    number: Mapped[int] = mapped_column(Integer)
    layout_key: Mapped[str] = mapped_column(String(64))
    for _d in DIMENSIONS:            # one typed column per layout dimension (tuner.layout.DIMENSIONS)
        locals()[_d.name] = mapped_column({bool: Boolean, int: Integer, str: String(16)}[_d.type], nullable=False)
    del _d
    status: Mapped[str] = mapped_column(String(16))
    tflops_per_gpu: Mapped[float | None] = mapped_column(Float)
    peak_fraction: Mapped[float | None] = mapped_column(Float)
    samples_per_second: Mapped[float | None] = mapped_column(Float)
    mfu: Mapped[float | None] = mapped_column(Float)
    peak_memory_gb: Mapped[float | None] = mapped_column(Float)
    predicted_mfu: Mapped[float | None] = mapped_column(Float)
    predicted_tflops_per_gpu: Mapped[float | None] = mapped_column(Float)
    predicted_peak_fraction: Mapped[float | None] = mapped_column(Float)
    predicted_memory_gb: Mapped[float | None] = mapped_column(Float)
    predicted_step_time_s: Mapped[float | None] = mapped_column(Float)
    message: Mapped[str] = mapped_column(Text, default="")
    log_path: Mapped[str | None] = mapped_column(Text)
    runner: Mapped[str] = mapped_column(String(64))
    started_at: Mapped[datetime | None] = mapped_column(Stamp)
    ended_at: Mapped[datetime | None] = mapped_column(Stamp)
    attempts: Mapped[int] = mapped_column(Integer, default=1)
    extra: Mapped[dict] = mapped_column(Json)


# ---- schema versions ----------------------------------------------------------------------------
def read_version(conn) -> int | None:
    """The stored schema version; 0 for tuner tables without one; None for an empty database."""
    names = set(inspect(conn).get_table_names())
    if "meta" in names:
        row = conn.execute(select(MetaRow.value).where(MetaRow.key == "schema_version")).scalar()
        if row is not None:
            return int(row)
    return 0 if names & {"studies", "trials"} else None


def _migrate_to_1(conn) -> None:
    Base.metadata.create_all(conn, checkfirst=True)


def _migrate_to_2(conn) -> None:
    """Rank by training speed: add mfu / predicted_mfu, computed from the stored samples/s and
    predicted step time with each study's own workload; the speed index replaces the old one."""
    from sqlalchemy import text

    from tuner import metrics
    from tuner.specs import Workload

    have = {c["name"] for c in inspect(conn).get_columns("trials")}
    for col in ("mfu", "predicted_mfu"):
        if col not in have:
            conn.execute(text(f"ALTER TABLE trials ADD COLUMN {col} FLOAT"))
    conn.execute(text("DROP INDEX IF EXISTS ix_trials_best"))
    conn.execute(text("CREATE INDEX IF NOT EXISTS ix_trials_speed ON trials (study_id, status, mfu)"))
    for sid, wl in conn.execute(select(StudyRow.id, StudyRow.workload)).all():
        try:
            w = Workload.from_dict(wl)
        except Exception:        # a study whose workload no longer loads keeps mfu empty (never ranked)
            continue
        rows = conn.execute(select(TrialRow.id, TrialRow.samples_per_second, TrialRow.predicted_step_time_s)
                            .where(TrialRow.study_id == sid)).all()
        for tid, sps, step in rows:
            conn.execute(update(TrialRow).where(TrialRow.id == tid).values(
                mfu=metrics.mfu(sps, w) if sps else None,
                predicted_mfu=metrics.mfu(w.global_batch / step, w) if step else None))


def _migrate_to_3(conn) -> None:
    """Today's layout dimensions: sequence_parallel, context_parallel, virtual_pipeline (their
    defaults for every stored trial) and recompute, which replaces activation_checkpointing (true:
    full, false: none); layout keys are rewritten in the new form (tp4-pp16-dp2-mb1-z1-rcfull)."""
    from sqlalchemy import text

    have = {c["name"] for c in inspect(conn).get_columns("trials")}
    added = {"sequence_parallel": "BOOLEAN NOT NULL DEFAULT FALSE", "context_parallel": "INTEGER NOT NULL DEFAULT 1",
             "virtual_pipeline": "INTEGER NOT NULL DEFAULT 1", "recompute": "VARCHAR(16) NOT NULL DEFAULT 'full'"}
    for col, decl in added.items():
        if col not in have:
            conn.execute(text(f"ALTER TABLE trials ADD COLUMN {col} {decl}"))
    if "activation_checkpointing" in have:
        conn.execute(text("UPDATE trials SET recompute = CASE WHEN activation_checkpointing THEN 'full' "
                          "ELSE 'none' END"))
        conn.execute(text("ALTER TABLE trials DROP COLUMN activation_checkpointing"))
    # an old key ends in -ac1 / -ac0 and names no new dimension (all at their defaults): one statement
    conn.execute(text("UPDATE trials SET layout_key = REPLACE(REPLACE(layout_key, '-ac1', '-rcfull'), "
                      "'-ac0', '-rcnone')"))


def _migrate_to_4(conn) -> None:
    """Expert parallelism: the expert_parallel and expert_tensor_parallel columns, 1 (their default)
    for every stored trial; layout keys are unchanged (a dimension at its default is not in the key)."""
    from sqlalchemy import text

    have = {c["name"] for c in inspect(conn).get_columns("trials")}
    for col in ("expert_parallel", "expert_tensor_parallel"):
        if col not in have:
            conn.execute(text(f"ALTER TABLE trials ADD COLUMN {col} INTEGER NOT NULL DEFAULT 1"))


MIGRATIONS: dict[int, Callable] = {1: _migrate_to_1, 2: _migrate_to_2, 3: _migrate_to_3, 4: _migrate_to_4}


def apply_migrations(conn, start: int) -> None:
    for version in range(start + 1, SCHEMA_VERSION + 1):
        MIGRATIONS[version](conn)
    updated = conn.execute(update(MetaRow).where(MetaRow.key == "schema_version")
                           .values(value=str(SCHEMA_VERSION))).rowcount
    if not updated:
        conn.execute(MetaRow.__table__.insert().values(key="schema_version", value=str(SCHEMA_VERSION)))


def verify_schema(conn) -> None:
    insp = inspect(conn)
    for table in Base.metadata.sorted_tables:
        have = {c["name"] for c in insp.get_columns(table.name)}
        missing = sorted({c.name for c in table.columns} - have)
        if missing:
            raise StoreError(f"table {table.name} lacks column(s) {', '.join(missing)}: "
                             "this is not a tuner results store, or it was edited by hand; use another --db")


def newer_error(shown: str, version: int) -> StoreError:
    return StoreError(f"the results store at {shown} has schema version {version}, newer than this tuner "
                      f"understands ({SCHEMA_VERSION}): upgrade tuner (`pip install -U tuner`)")


MEASURED = ("tflops_per_gpu", "peak_fraction", "samples_per_second", "mfu", "peak_memory_gb")
PREDICTED = {"predicted_mfu": "mfu", "predicted_tflops_per_gpu": "tflops_per_gpu", "predicted_peak_fraction": "peak_fraction",
             "predicted_memory_gb": "memory_gb", "predicted_step_time_s": "step_time_s"}


@dataclass
class StudyRecord:
    name: str
    workload: dict            # Workload.as_dict()
    space: dict
    searcher: str
    runner: str
    settings: dict = field(default_factory=dict)
    state: str = "running"    # running | done | interrupted
    created: datetime | None = None
    tuner_version: str = tuner.__version__

    @property
    def model(self) -> str:
        return self.workload["model"]["name"]

    @property
    def cluster(self) -> str:
        return self.workload["cluster"]["name"]

    @property
    def nodes(self) -> int:
        return int(self.workload["nodes"])

    @property
    def global_batch(self) -> int:
        return int(self.workload["global_batch"])

    def to_row(self) -> StudyRow:
        return StudyRow(name=self.name, model_name=self.model, cluster_name=self.cluster, nodes=self.nodes,
                        global_batch=self.global_batch, workload=scrub(self.workload), space=scrub(self.space),
                        searcher=self.searcher, runner=self.runner, settings=scrub(dict(self.settings)),
                        state=self.state, created=self.created or utcnow(), tuner_version=self.tuner_version)

    @classmethod
    def from_row(cls, r: StudyRow) -> "StudyRecord":
        return cls(name=r.name, workload=r.workload, space=r.space, searcher=r.searcher, runner=r.runner,
                   settings=r.settings or {}, state=r.state, created=aware(r.created),
                   tuner_version=r.tuner_version)


@dataclass
class TrialRecord:
    study: str
    number: int
    layout: Layout
    status: Status
    tflops_per_gpu: float | None = None
    peak_fraction: float | None = None
    samples_per_second: float | None = None
    mfu: float | None = None
    peak_memory_gb: float | None = None
    predicted_mfu: float | None = None
    predicted_tflops_per_gpu: float | None = None
    predicted_peak_fraction: float | None = None
    predicted_memory_gb: float | None = None
    predicted_step_time_s: float | None = None
    message: str = ""
    log_path: str | None = None
    runner: str = ""
    started: datetime | None = None
    ended: datetime | None = None
    attempts: int = 1
    extra: dict = field(default_factory=dict)
    model: str = ""           # of its study (model name, cluster name, node count)
    cluster: str = ""
    nodes: int = 0

    @classmethod
    def from_row(cls, t: TrialRow, s: StudyRow) -> "TrialRecord":
        layout = Layout(**{d.name: d.type(getattr(t, d.name)) for d in DIMENSIONS})
        return cls(study=s.name, number=t.number, layout=layout, status=Status(t.status),
                   **{k: getattr(t, k) for k in (*MEASURED, *PREDICTED)},
                   message=t.message or "", log_path=t.log_path, runner=t.runner, started=aware(t.started_at),
                   ended=aware(t.ended_at), attempts=t.attempts, extra=t.extra or {},
                   model=s.model_name, cluster=s.cluster_name, nodes=s.nodes)
