"""The store's schema (SQLAlchemy 2 ORM) and the records it hands out; its history (Alembic revisions,
one per schema version) is in tuner/store/migrations/.

Tables: `meta` (schema_version, read by tuners older than Alembic), `studies` (one search) and a wide,
typed `trials` table (one measured or predicted layout: one column per layout dimension, the measured
metrics and the predicted ones).
A layout is at most once per study: unique (study_id, layout_key). Trials are ranked by `mfu` (model-FLOPs
utilisation from the measured samples/s: training speed); `tflops_per_gpu` / `peak_fraction` keep
Megatron's count (recompute included), reported beside it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from sqlalchemy import JSON, Boolean, DateTime, Float, ForeignKey, Index, Integer, String, Text, UniqueConstraint
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

import tuner
from tuner.layout import DIMENSIONS, Layout
from tuner.trial import Status

# The head revision of tuner/store/migrations/versions/ ("0005" is 5): bump it with each new revision.
SCHEMA_VERSION = 6
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

    @property
    def peak_reserved_gb(self) -> float | None:
        """The caching allocator's reserved peak the runner read (kept in `extra`), or None."""
        v = (self.extra or {}).get("peak_reserved_gb")
        return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None

    @classmethod
    def from_row(cls, t: TrialRow, s: StudyRow) -> "TrialRecord":
        layout = Layout(**{d.name: d.type(getattr(t, d.name)) for d in DIMENSIONS})
        return cls(study=s.name, number=t.number, layout=layout, status=Status(t.status),
                   **{k: getattr(t, k) for k in (*MEASURED, *PREDICTED)},
                   message=t.message or "", log_path=t.log_path, runner=t.runner, started=aware(t.started_at),
                   ended=aware(t.ended_at), attempts=t.attempts, extra=t.extra or {},
                   model=s.model_name, cluster=s.cluster_name, nodes=s.nodes)
