"""CI fails when a service it starts does not come up (issue 19): `.ci/run`'s own service lines, run
with stand-ins for the start scripts and a PATH without what they need; and under TUNER_CI=1 a test
whose service is missing fails instead of skipping (tests/conftest.py's service_unavailable)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TOOLS = ("bash", "tail", "cat", "id", "awk", "grep", "seq", "sleep", "su", "dirname", "env", "touch")
URL = "postgresql+psycopg://tuner:tuner@127.0.0.1:5432/tuner"


def services_block() -> str:
    """`.ci/run`'s `fail` and its "== services" section, as written there."""
    lines = (ROOT / ".ci/run").read_text().splitlines()
    fail = [line for line in lines if line.startswith("fail()")]
    start = lines.index('echo "== services"')
    end = next(i for i, line in enumerate(lines) if line.startswith("export RAY_"))
    assert start < end, "the service section of .ci/run moved: update this test"
    return "\n".join(["set -uo pipefail", *fail, *lines[start:end], "echo SERVICES-UP"])


def script(path: Path, body: str) -> None:
    path.write_text("#!/usr/bin/env bash\n" + body + "\n")
    path.chmod(0o755)


def run_services(tmp_path, postgres: str | None, slurm_ok=True, chromium=True, apt_ok=False):
    """Run the section in a copy of .ci/ whose start scripts are stand-ins (`postgres` a script body;
    None: the real start-postgres.sh) on a PATH with only the basic tools and stubs."""
    ci, bin_ = tmp_path / ".ci", tmp_path / "bin"
    ci.mkdir()
    bin_.mkdir()
    for tool in TOOLS:
        if shutil.which(tool):
            (bin_ / tool).symlink_to(shutil.which(tool))
    if postgres is None:
        shutil.copy(ROOT / ".ci/start-postgres.sh", ci / "start-postgres.sh")
    else:
        script(ci / "start-postgres.sh", postgres)
    script(ci / "start-slurm.sh", f"touch {tmp_path}/slurm-called; exit {0 if slurm_ok else 1}")
    script(bin_ / "apt-get", f"exit {0 if apt_ok else 100}")
    if chromium:
        script(bin_ / "chromium", "exit 0")
    return subprocess.run([shutil.which("bash"), "-c", services_block()], cwd=tmp_path, capture_output=True,
                          text=True, timeout=60, env={"PATH": str(bin_), "HOME": str(tmp_path)})


def test_postgres_that_does_not_start_fails_ci(tmp_path):
    """The real start-postgres.sh on a PATH without pg_ctlcluster and a failing apt-get (or not root)."""
    r = run_services(tmp_path, postgres=None)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "CI failed: PostgreSQL did not start" in r.stderr and "SERVICES-UP" not in r.stdout
    assert not (tmp_path / "slurm-called").exists()           # it stopped there


def test_postgres_that_prints_no_url_fails_ci(tmp_path):
    r = run_services(tmp_path, postgres="echo 'installing ...' >&2; exit 0")
    assert r.returncode == 1 and "printed no URL" in r.stderr, r.stdout + r.stderr


def test_slurm_that_does_not_start_fails_ci(tmp_path):
    r = run_services(tmp_path, postgres=f"echo {URL}", slurm_ok=False)
    assert r.returncode == 1 and "CI failed: Slurm did not start" in r.stderr, r.stdout + r.stderr
    assert "SERVICES-UP" not in r.stdout


def test_chromium_that_cannot_be_installed_fails_ci(tmp_path):
    r = run_services(tmp_path, postgres=f"echo {URL}", chromium=False, apt_ok=True)   # apt "succeeds", no binary
    assert r.returncode == 1 and "CI failed: chromium could not be installed" in r.stderr, r.stdout + r.stderr


def test_every_service_up_lets_ci_run_the_suites(tmp_path):
    r = run_services(tmp_path, postgres=f"echo 'creating role' >&2; echo {URL}")
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"postgres: {URL}" in r.stdout and "slurm: up" in r.stdout and "SERVICES-UP" in r.stdout


def test_ci_exports_tuner_ci():
    text = (ROOT / ".ci/run").read_text()
    assert "TUNER_CI=1" in next(line for line in text.splitlines() if line.startswith("export "))


# ---- under TUNER_CI=1 a missing service fails the test ----------------------------------------
@pytest.mark.parametrize("ci", ["1", ""])
def test_a_missing_service_fails_under_ci_and_skips_otherwise(tmp_path, ci):
    shutil.copy(ROOT / "tests/conftest.py", tmp_path / "conftest.py")
    (tmp_path / "test_needs_pg.py").write_text("def test_store(pg_url):\n    assert pg_url\n")
    env = {k: v for k, v in os.environ.items() if k not in ("TUNER_TEST_PG_URL", "TUNER_CI")}
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", "test_needs_pg.py"],
                       cwd=tmp_path, env={**env, "TUNER_CI": ci}, capture_output=True, text=True, timeout=120)
    if ci:
        assert r.returncode == 1 and "1 error" in r.stdout, r.stdout
        assert "PostgreSQL is not available under CI (TUNER_CI=1)" in r.stdout
    else:
        assert r.returncode == 0 and "1 skipped" in r.stdout and "PostgreSQL not configured" in r.stdout, r.stdout
