"""A first day without surprises, part 2 (issue 28): read-only stores and the words and numbers a new
user met."""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import time

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
        import gc
        gc.collect()                    # the commands' stores: their SQLite connections closed
        if subprocess.run(["umount", str(mnt)], capture_output=True).returncode:
            subprocess.run(["umount", "-l", str(mnt)], capture_output=True)
    assert [r[0] for r in results] == [0] * len(READS), [r[2] for r in results]


# ---- the local runner: op builds in a folder of its own, dead builders' locks, a default trial timeout ----
BATON = ("import sys, time; from torch.utils.file_baton import FileBaton; b = FileBaton(sys.argv[1]); "
         "print('held' if b.try_acquire() else 'waited', flush=True); time.sleep(float(sys.argv[2]))")


def hold_lock(lock, seconds: float = 60.0) -> subprocess.Popen:
    """A process that builds as torch does: takes the FileBaton at `lock` and keeps its descriptor open."""
    import sys
    lock.parent.mkdir(parents=True, exist_ok=True)
    p = subprocess.Popen([sys.executable, "-c", BATON, str(lock), str(seconds)], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "held"
    return p


def test_a_build_lock_whose_builder_is_gone_is_removed_however_young(tmp_path):
    from tuner.runners.local import BUILDER_GRACE_S, clear_stale_build_locks, lock_holders
    lock = tmp_path / "py311_cpu" / "deepspeed_shm_comm" / "lock"
    builder = hold_lock(lock)
    try:
        assert lock_holders(lock) == [builder.pid]
        old = time.time() - BUILDER_GRACE_S - 1
        os.utime(lock, (old, old))
        assert clear_stale_build_locks(tmp_path) == [] and lock.exists()      # a live build keeps its lock
    finally:
        builder.kill()
        builder.wait()
    assert lock.exists() and lock_holders(lock) == []                         # killed mid-build: left behind
    assert clear_stale_build_locks(tmp_path) == [lock] and not lock.exists()  # seconds old, not 10 minutes


def test_the_local_runner_builds_ops_in_a_folder_of_its_own(monkeypatch, tmp_path):
    from tuner.runners import make_runner
    from tuner.runners.local import extensions_dir
    monkeypatch.delenv("TORCH_EXTENSIONS_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    own = extensions_dir()
    assert own.is_relative_to(tmp_path / "cache" / "tuner") and own != tmp_path / "cache" / "torch_extensions"
    runner = make_runner("local", gpus=1, results_dir=tmp_path)
    assert runner._cmd.env["TORCH_EXTENSIONS_DIR"] == str(own) == str(runner.extensions_dir)
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "mine"))          # the user's choice wins
    assert make_runner("local", gpus=1, results_dir=tmp_path).extensions_dir == tmp_path / "mine"


def test_a_local_trial_stuck_on_a_build_lock_times_out_naming_the_lock_and_its_holder(monkeypatch, tmp_path):
    """The trial's command waits on torch's FileBaton as an op build does; another live process holds it."""
    import sys
    from tuner.runners import make_runner
    from tuner.specs import make_workload
    from tuner.layout import Layout
    from tuner.trial import Status, TrialSpec
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "ext"))
    lock = tmp_path / "ext" / "deepspeed_shm_comm" / "lock"
    builder = hold_lock(lock)
    try:
        runner = make_runner("local", gpus=1, results_dir=tmp_path, trial_timeout=1.5, kill_grace=0.5)
        runner._cmd.argv = [sys.executable, "-c", BATON, str(lock), "60"]    # the harness's op build, no more
        w = make_workload("tiny", 1, "local")
        res = runner.run(TrialSpec("s", 0, Layout(tp=1, pp=1, dp=1, micro_batch=1), w))
    finally:
        builder.kill()
        builder.wait()
    assert res.status == Status.TIMEOUT
    assert f"waiting on op build lock {lock}, held by process {builder.pid}" in res.message


def test_real_runners_have_a_default_trial_timeout_stated_in_help(tmp_path):
    import click
    from tuner.cli import cli
    from tuner.runners import DEFAULT_TRIAL_TIMEOUT_S
    from tuner.study import new_record, runner_for
    from tuner.space import load_space
    from tuner.specs import make_workload
    w = make_workload("tiny", 1, "local")
    rec = new_record("t", w, load_space(), runner="command", runner_options={"command": "true"},
                     results_dir=str(tmp_path))
    assert runner_for(rec, w).trial_timeout == DEFAULT_TRIAL_TIMEOUT_S
    rec.settings["runner_options"]["trial_timeout"] = 5.0
    assert runner_for(rec, w).trial_timeout == 5.0
    cmd = cli.commands["search"]
    (opt,) = [p for p in cmd.params if p.name == "trial_timeout"]
    text = " ".join(opt.get_help_record(click.Context(cmd, info_name="search"))[1].split())
    assert f"default for the command, local and slurm runners: {DEFAULT_TRIAL_TIMEOUT_S:g}" in text
