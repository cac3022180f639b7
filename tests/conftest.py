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
