"""The store's transactions: one short session per call, retried and explained.

`Database` owns the engine and the one way in, `_tx`: on SQLite a write takes the lock up front (BEGIN
IMMEDIATE, WAL, 30 s busy timeout); conflicts (unique keys, serialisation failures) are retried when the
caller says so; a lost PostgreSQL connection is retried with backoff, then reported; every other database
failure becomes one StoreError that says what to do. `_open` creates or checks the schema. The fenced
trial writes (tuner.store.claims) and the queries (tuner.store.store) stand on it.
"""

from __future__ import annotations

import contextlib
import os
import random
import threading
import time
from typing import Callable, Self, TypeVar

from sqlalchemy import Engine, select, update
from sqlalchemy.engine import URL
from sqlalchemy.exc import DBAPIError, IntegrityError, SQLAlchemyError
from sqlalchemy.orm import Session
from sqlalchemy.pool import StaticPool

from tuner.errors import NoStore, StoreError, StoreNotWritable, UnknownStudy
from tuner.store import migrations
from tuner.store.engine import BUSY_TIMEOUT_S, URL_HINT, _reason, _sqlstate, redact
from tuner.store.models import MetaRow, StudyRow

RECONNECT_DELAYS_S = (0.25, 0.5, 1.0, 2.0, 4.0)   # then give up with a StoreError
CONFLICT_RETRIES = 100
T = TypeVar("T")


def _unknown(s: Session, name: str) -> UnknownStudy:
    return UnknownStudy(name, list(s.execute(select(StudyRow.name).order_by(StudyRow.name)).scalars()))


class Database:
    """One database, one transaction per call (so one instance serves many threads)."""

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

    def close(self) -> None:
        self.engine.dispose()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"
