"""A first day without surprises, part 2 (issue 28): read-only stores and the words and numbers a new
user met."""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess

import pytest

from tuner.errors import StoreNotWritable
from tuner.store import open_store

READS = [("studies",), ("trials", "first"), ("best", "--model", "tiny", "--nodes", "1", "--cluster", "h100"),
         ("report", "first", "--out", "r.html"), ("export", "first", "--format", "csv"), ("db", "current"),
         ("config", "first")]


@pytest.fixture
def stored(tuner):
    code, _, err = tuner("search", "--model", "tiny", "--nodes", "1", "--cluster", "h100", "--budget", "2",
                         "--study", "first")
    assert code == 0, err
    return tuner


@pytest.mark.parametrize("args", READS, ids=lambda a: a[0] + (f" {a[1]}" if a[0] == "db" else ""))
def test_every_command_that_only_reads_reads_a_store_sqlite_opens_read_only(stored, tmp_path, args):
    """SQLite's own read-only mode binds root too: what chmod 444 or a read-only directory is to a user."""
    ro = f"sqlite:///file:{tmp_path / 'tuner.db'}?mode=ro&uri=true"
    code, out, err = stored(*args, "--db", ro)
    assert code == 0, err
    assert "read-only" not in err and out


@pytest.mark.parametrize("args", READS, ids=lambda a: a[0] + (f" {a[1]}" if a[0] == "db" else ""))
def test_a_store_file_that_is_not_writable_is_read_and_a_write_says_what_to_do(stored, monkeypatch, args):
    """os.access says the file is read-only (as a non-root user's chmod 444 would): reads work, a search is
    refused in one line naming the fix and that reading commands work."""
    real = os.access
    monkeypatch.setattr("tuner.store.engine.os.access",
                        lambda p, mode: False if mode == os.W_OK and str(p).endswith("tuner.db") else real(p, mode))
    code, out, err = stored(*args)
    assert code == 0, err
    code, out, err = stored("search", "--model", "tiny", "--nodes", "1", "--cluster", "h100", "--budget", "1")
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert "is read-only" in err and "chmod u+w" in err and "studies, trials, best, report, export" in err


def test_a_reading_command_opens_the_store_read_only(stored):
    """Whatever its permissions: the store a reading command opens refuses a write (root included)."""
    from tuner.cli import read_store
    store = read_store(stored.db)
    assert [s.name for s in store.list_studies()] == ["first"]
    with pytest.raises(StoreNotWritable, match="read-only"):
        store.set_study_state("first", "running")
    with open_store(stored.db) as s:
        assert s.get_study("first").state == "done"


def test_a_read_only_directory_is_read(stored, tmp_path):
    """The store in a read-only bind mount (needs CAP_SYS_ADMIN; skipped without it)."""
    src, mnt = tmp_path / "src", tmp_path / "ro"
    src.mkdir(), mnt.mkdir()
    with sqlite3.connect(tmp_path / "tuner.db") as db:       # an archived store: its WAL written back
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    shutil.copy(tmp_path / "tuner.db", src / "tuner.db")
    if shutil.which("mount") is None or subprocess.run(["mount", "--bind", "-o", "ro", str(src), str(mnt)],
                                                       capture_output=True).returncode != 0:
        pytest.skip("cannot make a read-only bind mount here (needs root / CAP_SYS_ADMIN)")
    try:
        results = [stored(*args, "--db", f"sqlite:///{mnt / 'tuner.db'}") for args in READS]
    finally:
        subprocess.run(["umount", str(mnt)], capture_output=True)
    assert [r[0] for r in results] == [0] * len(READS), [r[2] for r in results]
