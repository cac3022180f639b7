"""Shared pytest fixtures."""

from __future__ import annotations

import os
import signal
import sys

import pytest

# A test run started in the background (`.ci/run &`, `nohup`) inherits SIGINT ignored, and so would every
# `tuner` the Ctrl-C tests start and interrupt: give this process Python's default handler, which the
# children then start with (an exec resets a handled signal to its default; an ignored one stays ignored).
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# DeepSpeed builds its CPU op into TORCH_EXTENSIONS_DIR (default ~/.cache/torch_extensions, shared by every
# venv): two checkouts rebuilding it there in turn, or a build killed midway (its stale `lock`), hang every
# later harness run at start. One build folder per venv; an explicit setting wins.
os.environ.setdefault("TORCH_EXTENSIONS_DIR", os.path.join(sys.prefix, "torch_extensions"))

# numpy's and scipy's OpenBLAS start one thread per core; on a 2-core machine that other jobs keep busy, its
# threads wait on each other: a 151 x 151 Cholesky (the guided searcher's stop rule) took 48 ms instead of
# 0.1 ms single-threaded, and test_cli's guided warm-start test 22 s instead of 8 s. The tests' matrices are
# small: one thread, here and in every process a test starts (they inherit it). Read when numpy loads, so set
# before any test module imports it (no plugin does); an explicit setting wins.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


# ---- the "tuner" logger -----------------------------------------------------------------------
@pytest.fixture(autouse=True)
def _tuner_logger_restored():
    """A CLI command run in-process (CliRunner) gives the "tuner" logger its stderr handler, a level and
    propagate=False; put it back after every test, so that no test sees what an earlier one left."""
    import logging
    logger = logging.getLogger("tuner")
    saved = (list(logger.handlers), logger.level, logger.propagate)
    yield
    logger.handlers[:] = saved[0]
    logger.setLevel(saved[1])
    logger.propagate = saved[2]


@pytest.fixture(autouse=True)
def _predictions_forgotten():
    """tuner.predicted keeps a study's predictions for the process: every test starts without any, as a fresh
    `tuner` does (a test that swaps a part of the model never meets an earlier test's answers)."""
    from tuner import predicted
    predicted.forget()
    yield


# ---- services (PostgreSQL, Slurm, chromium) ---------------------------------------------------
def service_unavailable(service: str, reason: str):
    """A test needs `service` and it is not there: skip, saying how to start it; under CI (TUNER_CI=1,
    set by .ci/run, which starts every service its suites need) fail instead, so that a suite CI is
    meant to run never passes by skipping."""
    if os.environ.get("TUNER_CI", "") not in ("", "0"):
        pytest.fail(f"{service} is not available under CI (TUNER_CI=1), so its tests would only skip: {reason}",
                    pytrace=False)
    pytest.skip(reason)


# ---- PostgreSQL (store contract tests) --------------------------------------------------------
def reset_pg(url: str) -> None:
    """Drop every table of the test database (the store's, its tuner_alembic_version, anything a test left)."""
    from sqlalchemy import MetaData, create_engine
    engine = create_engine(url.replace("postgresql://", "postgresql+psycopg://", 1))
    try:
        with engine.begin() as conn:
            found = MetaData()
            found.reflect(conn)
            found.drop_all(conn)
    finally:
        engine.dispose()


@pytest.fixture(scope="session")
def pg_server_url() -> str:
    """A PostgreSQL URL from TUNER_TEST_PG_URL (printed by `.ci/start-postgres.sh`), else skip (CI: fail)."""
    url = os.environ.get("TUNER_TEST_PG_URL")
    if not url:
        service_unavailable("PostgreSQL", "PostgreSQL not configured: run `.ci/start-postgres.sh` as root and "
                            "set TUNER_TEST_PG_URL to the URL it prints")
    return url


@pytest.fixture
def pg_url(pg_server_url) -> str:
    """pg_server_url's database, emptied: every test starts from no tables, whatever the one before it left."""
    reset_pg(pg_server_url)
    return pg_server_url


# ---- the CLI, in-process --------------------------------------------------------------------
@pytest.fixture
def tuner(tmp_path, capsys, monkeypatch):
    """Run `tuner ARGS` in-process against a temp SQLite store; returns (exit code, stdout, stderr)."""
    from tuner.cli import main

    monkeypatch.chdir(tmp_path)
    db = f"sqlite:///{tmp_path / 'tuner.db'}"
    monkeypatch.setenv("TUNER_DB", db)

    def run(*args: str):
        capsys.readouterr()
        try:
            main(list(args))
            code = 0
        except SystemExit as exc:
            code = exc.code or 0
        out = capsys.readouterr()
        return code, out.out, out.err

    run.db = db
    return run
