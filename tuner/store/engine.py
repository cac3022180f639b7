"""Database URLs and engines: parsing, redaction, SQLite checks and pragmas. Only the store uses these."""

from __future__ import annotations

import contextlib
import os
import random
import sqlite3
import time
from pathlib import Path
from urllib.parse import quote

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError
from sqlalchemy.pool import StaticPool

from tuner.errors import BadStoreURL, NoStore, StoreError, StoreNotWritable
from tuner.store.models import scrub

DEFAULT_URL = "sqlite:///results/tuner.db"
URL_HINT = "check --db or TUNER_DB; expected sqlite:///path or postgresql+psycopg://user:pass@host/db"
BUSY_TIMEOUT_S = 30


def redact(url: str | URL) -> str:
    """The URL with its password replaced by ***."""
    if isinstance(url, URL):
        return url.render_as_string(hide_password=True)
    text = scrub(str(url))
    try:
        password = make_url(str(url)).password
    except ArgumentError:
        return text
    if password and str(password) in text:   # an odd password the pattern missed: let SQLAlchemy hide it
        return make_url(str(url)).render_as_string(hide_password=True)
    return text


def _reason(exc: BaseException) -> str:
    """The first line of the driver's message, password-free and short."""
    orig = getattr(exc, "orig", None) or exc
    lines = [ln.strip() for ln in str(orig).splitlines() if ln.strip()]
    text = scrub(lines[0] if lines else type(orig).__name__)
    return text if len(text) <= 200 else text[:197] + "..."


def _sqlstate(exc: BaseException) -> str | None:
    return getattr(getattr(exc, "orig", None), "sqlstate", None)


def _parse(raw: str) -> URL:
    shown = redact(raw)
    if "://" not in raw and raw.endswith((".db", ".sqlite", ".sqlite3")):     # a file path given as --db
        raise BadStoreURL(f"malformed database URL '{shown}': --db takes a URL; for this SQLite file it is "
                          f"sqlite:///{Path(raw).expanduser().resolve()} (sqlite:/// then the path; {URL_HINT})")
    try:
        url = make_url(raw)
    except ArgumentError:
        raise BadStoreURL(f"malformed database URL '{shown}': {URL_HINT}") from None
    backend = url.get_backend_name()
    if backend in ("postgresql", "postgres"):
        return url.set(drivername="postgresql+psycopg")   # the only PostgreSQL driver tuner ships with
    if backend != "sqlite" or url.drivername not in ("sqlite", "sqlite+pysqlite"):
        raise BadStoreURL(f"unsupported database URL '{shown}' (backend '{url.drivername}'): {URL_HINT}")
    return url


def _sqlite_memory(url: URL) -> bool:
    db = url.database or ""
    return db in ("", ":memory:") or "mode=memory" in db or url.query.get("mode") == "memory"


def _sqlite_path(url: URL) -> Path:
    db = url.database or ""
    if db.startswith("file:"):
        db = db[5:].split("?", 1)[0]
    return Path(db)


#: the first 16 bytes of every SQLite database file (sqlite.org/fileformat.html)
SQLITE_HEADER = b"SQLite format 3\x00"


def _check_sqlite_target(url: URL, shown: str) -> None:
    """A store path that is a directory, or a file that is not SQLite's (a CSV, a log), refused in one line
    (exit 2) before SQLite answers 'unable to open database file' or 'file is not a database'."""
    path = _sqlite_path(url)
    if path.is_dir():
        raise BadStoreURL(f"results store {shown} is a directory, not a SQLite file: point --db or TUNER_DB at a "
                          f"file, e.g. --db sqlite:///{path.resolve() / 'tuner.db'}")
    try:
        with open(path, "rb") as f:
            head = f.read(len(SQLITE_HEADER))
    except OSError:          # missing (created later, or NoStore) or unreadable (the open says why)
        return
    if head and head != SQLITE_HEADER:    # an empty file is an empty database
        raise BadStoreURL(f"results store {shown} is not a SQLite database (the file does not start with SQLite's "
                          f"header): point --db or TUNER_DB at tuner's results store, or at a new file, e.g. "
                          f"--db sqlite:///{path.resolve().parent / 'tuner.db'}")


def _check_sqlite_file(url: URL) -> None:
    """A clear error before anything runs: the directory must exist and the file must be writable."""
    path = _sqlite_path(url)
    parent = path.parent if str(path.parent) else Path(".")
    fix = "create it, or point --db / TUNER_DB at another sqlite:///path"
    if not parent.is_dir():
        blocker = next((p for p in (parent, *parent.parents) if p.exists()), None)
        if blocker is not None and not blocker.is_dir():   # afile/tuner.db: the folder exists, as a file
            raise StoreNotWritable(f"cannot open SQLite database {path}: a part of the path is a file, not a directory "
                                   f"({blocker}): point --db / TUNER_DB at another sqlite:///path")
        raise StoreNotWritable(f"cannot open SQLite database {path}: directory {parent} does not exist; {fix}")
    if path.exists() and not os.access(path, os.W_OK):
        raise StoreNotWritable(f"SQLite database {path} is read-only: this command writes to it; make it writable "
                               f"(chmod u+w {path}) or copy it (studies, trials, best, report, export read it as it is)")
    if not os.access(parent, os.W_OK):
        raise StoreNotWritable(f"cannot write in {parent} (SQLite needs it for {path.name}-wal): "
                         "make the directory writable or move the database")


def read_only_url(url: URL) -> URL:
    """A SQLite file's URL opened read-only (SQLite's URI mode=ro): nothing is written to the file or its
    directory, so an archived or shared store, a read-only file or directory, or another user's file
    is read as it is (a write on it fails, whoever runs tuner, root included)."""
    uri = f"file:{quote(str(_sqlite_path(url).resolve()))}?mode=ro"
    try:
        with contextlib.closing(sqlite3.connect(uri, uri=True)) as probe:
            probe.execute("SELECT 1 FROM sqlite_master LIMIT 1")
    except sqlite3.OperationalError:
        # A read-only file system: a WAL database's shared-memory file cannot be made beside it, and nothing
        # can change the file there, so SQLite may read it as immutable.
        uri += "&immutable=1"
    return make_url(f"sqlite:///{uri}&uri=true")


def _set_wal(cur) -> None:
    """Switch the file to WAL. SQLite answers a journal-mode change that races another process's first
    open with 'database is locked' at once, without its busy handler: wait for it here, up to the busy
    timeout, as every other statement does."""
    deadline = time.monotonic() + BUSY_TIMEOUT_S
    while True:
        try:
            if cur.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
                cur.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(random.uniform(0.005, 0.05))


def _make_engine(url: URL, read_only: bool = False) -> Engine:
    if url.get_backend_name() == "postgresql":
        return create_engine(url, pool_pre_ping=True, pool_size=5, max_overflow=10,
                             connect_args={"connect_timeout": 5, "application_name": "tuner"})
    memory = _sqlite_memory(url)
    if memory:
        engine = create_engine(url, poolclass=StaticPool, connect_args={"check_same_thread": False})
    else:
        if read_only:
            url = read_only_url(url)
        else:
            _check_sqlite_file(url)
        engine = create_engine(url, pool_size=8, max_overflow=16,
                               connect_args={"check_same_thread": False, "timeout": BUSY_TIMEOUT_S})

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn, _record):
        dbapi_conn.isolation_level = None          # we emit BEGIN ourselves (below)
        cur = dbapi_conn.cursor()
        cur.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_S * 1000}")
        cur.execute("PRAGMA foreign_keys = ON")
        if not memory and not read_only:        # a read-only connection sets nothing in the file
            _set_wal(cur)
            cur.execute("PRAGMA synchronous = NORMAL")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn):
        conn.exec_driver_sql("BEGIN IMMEDIATE" if conn.get_execution_options().get("tuner_write") else "BEGIN")

    return engine


def shown_url(parsed: URL) -> str:
    """The URL as printed: password redacted, a SQLite file as an absolute path."""
    if parsed.get_backend_name() == "sqlite" and not _sqlite_memory(parsed) and not (parsed.database or "").startswith(
            "file:"):
        parsed = parsed.set(database=str(_sqlite_path(parsed).resolve()))
    return redact(parsed.render_as_string(hide_password=False))   # also scrubs ?password=...


def _engine_for(url: str | None, create: bool = True, read_only: bool = False) -> tuple[Engine, URL, str]:
    """The engine of `url`, else $TUNER_DB, else the default. With create=False a SQLite file that does
    not exist is refused (NoStore) instead of created; with read_only a SQLite file is opened read-only."""
    raw = url or os.environ.get("TUNER_DB") or DEFAULT_URL
    parsed = _parse(raw)
    shown = shown_url(parsed)
    sqlite_file = parsed.get_backend_name() == "sqlite" and not _sqlite_memory(parsed)
    if sqlite_file:
        _check_sqlite_target(parsed, shown)
    if sqlite_file and (not create or read_only) and not _sqlite_path(parsed).exists():
        raise NoStore(shown)
    if raw == DEFAULT_URL and not read_only:
        if Path("results").exists() and not Path("results").is_dir():
            raise StoreNotWritable(f"the default results store {shown} needs a directory 'results' here, and "
                                   f"{Path('results').resolve()} is a file: move it, or choose the store with --db URL "
                                   "or TUNER_DB (e.g. --db sqlite:///tuner.db)")
        Path("results").mkdir(exist_ok=True)
    return _make_engine(parsed, read_only and sqlite_file), parsed, shown


