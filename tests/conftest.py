"""Shared pytest fixtures."""

from __future__ import annotations

import os

import pytest


# ---- PostgreSQL (store contract tests) --------------------------------------------------------
@pytest.fixture(scope="session")
def pg_url() -> str:
    """A PostgreSQL URL from TUNER_TEST_PG_URL (printed by `.ci/start-postgres.sh`), else skip."""
    url = os.environ.get("TUNER_TEST_PG_URL")
    if not url:
        pytest.skip("PostgreSQL not configured: run `.ci/start-postgres.sh` as root and set "
                    "TUNER_TEST_PG_URL to the URL it prints")
    return url


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
