"""Chaos: faults inflicted on a running search (issue 8, items 1-3).

- the driver SIGKILLed at random points and resumed: nothing finished is lost or re-measured, the budget
  holds and the best equals an uninterrupted run with the same seed;
- trials that hang (killed with their whole process tree at --trial-timeout), die by a signal (failed),
  run out of memory (oom, never retried) or hit an infrastructure failure (retried once);
- store faults: a missing or read-only SQLite location fails before any trial, two drivers on one
  SQLite study never measure a layout twice, PostgreSQL restarted mid-search.
Every fault goes through the real CLI (`python -m tuner` in a subprocess, or in-process `main`).
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest

from conftest import service_unavailable
from tuner.store import open_store
from tuner.trial import Status

ROOT = Path(__file__).resolve().parents[1]
CHAOS = ROOT / "tests" / "fixtures" / "chaos"
PY = sys.executable
TINY = ("--model", "tiny", "--nodes", "1", "--cluster", "local", "--searcher", "grid")


# ---- helpers ------------------------------------------------------------------------------------
def tuner_proc(args, cwd, db, **kw) -> subprocess.Popen:
    env = {**os.environ, "TUNER_DB": db, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([PY, "-m", "tuner", *args], cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kw)


def tuner_run(args, cwd, db, timeout=120) -> subprocess.CompletedProcess:
    p = tuner_proc(args, cwd, db)
    out, err = p.communicate(timeout=timeout)
    return subprocess.CompletedProcess(p.args, p.returncode, out, err)


def finished(store, study):
    try:
        return {t.number: t for t in store.trials(study) if t.status.finished}
    except Exception:   # the study is not created yet
        return {}


def snapshot(rec) -> tuple:
    return (rec.layout.key(), rec.status, rec.peak_fraction, rec.tflops_per_gpu, rec.started, rec.ended, rec.attempts)


def procs_with(marker: str) -> list[psutil.Process]:
    out = []
    for p in psutil.process_iter(["cmdline", "environ"]):
        try:
            cmd = " ".join(p.info["cmdline"] or [])
            env = p.info["environ"] or {}
        except psutil.Error:
            continue
        if (marker in cmd or any(marker in v for v in env.values())) and p.status() != psutil.STATUS_ZOMBIE:
            out.append(p)
    return out


def assert_none_left(marker: str, what: str) -> None:
    """No live process carries `marker`; any that does is killed (not left to the next test) and named."""
    left = procs_with(marker)
    for p in left:
        p.kill()
    assert left == [], f"{what}: {[p.cmdline() for p in left]}"




# ---- 1. the driver killed ------------------------------------------------------------------------
KILL_SEARCH = ("--model", "175b", "--nodes", "16", "--searcher", "random", "--sim-delay", "0.05",
               "--parallel", "2", "--seed", "3")
KILL_BUDGET = 16


def kill_and_resume(tmp_path, study: str, kills: int, budget: int, rng: random.Random,
                    search=KILL_SEARCH, max_wait: float = 0.25) -> dict:
    """SIGKILL the driver `kills` times at random points (the first `search`, then each `resume`),
    then resume to the end. Returns the kills survived, the finished trials lost or re-measured, and
    the final trials."""
    db = f"sqlite:///{tmp_path / (study + '.db')}"
    store = open_store(db)
    args = ["search", *search, "--budget", str(budget), "--study", study]
    survived, lost, remeasured = 0, [], []

    def check(kept):
        now = finished(store, study)
        lost.extend(n for n in kept if n not in now)
        remeasured.extend(n for n in kept if n in now and snapshot(now[n]) != kept[n])

    for _ in range(kills):
        kept = {n: snapshot(t) for n, t in finished(store, study).items()}
        proc = tuner_proc(args, tmp_path, db)
        args = ["resume", study]
        # wait until this driver has finished at least one trial, then a random moment more
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None and len(finished(store, study)) <= len(kept):
            time.sleep(0.01)
        time.sleep(rng.uniform(0, max_wait))
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            survived += 1
        proc.communicate(timeout=30)
        check(kept)
    kept = {n: snapshot(t) for n, t in finished(store, study).items()}
    final = tuner_run(args, tmp_path, db)
    check(kept)
    trials = store.trials(study)
    store.close()
    return {"survived": survived, "lost": lost, "remeasured": remeasured, "trials": trials, "final": final}


def best_of(trials):
    ok = [t for t in trials if t.status == Status.OK]
    return max(ok, key=lambda t: (t.peak_fraction, -t.number))


def test_driver_killed_three_times_loses_nothing(tmp_path):
    budget = KILL_BUDGET
    base = tuner_run(["search", *KILL_SEARCH, "--budget", str(budget), "--study", "base"], tmp_path,
                     f"sqlite:///{tmp_path / 'base.db'}")
    assert base.returncode == 0, base.stderr
    with open_store(f"sqlite:///{tmp_path / 'base.db'}") as s:
        baseline = s.trials("base")

    got = kill_and_resume(tmp_path, "chaos", kills=3, budget=budget, rng=random.Random(8))
    assert got["survived"] >= 2, "the driver finished before it could be killed: make the search longer"
    assert got["final"].returncode == 0, got["final"].stderr
    assert got["lost"] == [] and got["remeasured"] == []
    trials = got["trials"]
    keys = [t.layout.key() for t in trials]
    assert len(keys) == len(set(keys)), "a layout is in the study twice"
    assert all(t.status.finished for t in trials)
    ran = [t for t in trials if t.status != Status.PRUNED]
    assert len(ran) == budget
    # same seed, deterministic searcher: the same layouts were measured, and the same best won
    assert sorted(t.layout.key() for t in ran) == sorted(t.layout.key() for t in baseline if t.status != Status.PRUNED)
    assert best_of(trials).layout == best_of(baseline).layout
    assert best_of(trials).peak_fraction == best_of(baseline).peak_fraction


# ---- 2. trials that hang or die ------------------------------------------------------------------
def test_hung_trial_killed_with_its_whole_tree(tuner, tmp_path):
    marker = f"chaos-hang-{uuid.uuid4().hex[:10]}"
    code, out, err = tuner("search", *TINY, "--budget", "1", "--runner", "command", "--study", "hang",
                           "--command", f"{PY} {CHAOS / 'hang_tree.py'} {marker}", "--trial-timeout", "5")
    assert code == 0, err
    with open_store(tuner.db) as s:
        [t] = s.trials("hang")
    assert t.status == Status.TIMEOUT and "--trial-timeout" in t.message
    assert (tmp_path / "results/trials/hang/1/spawned").exists(), "the fixture never spawned its tree"
    time.sleep(0.3)
    assert_none_left(marker, "orphans after --trial-timeout")


def test_trial_killed_by_a_signal_is_failed(tuner):
    code, _, err = tuner("search", *TINY, "--budget", "1", "--runner", "command", "--study", "sig",
                         "--command", f"{PY} {CHAOS / 'die_by_signal.py'} KILL")
    assert code == 0, err
    with open_store(tuner.db) as s:
        [t] = s.trials("sig")
    assert t.status == Status.FAILED and "SIGKILL" in t.message


def test_oom_is_oom_and_never_retried(tuner, tmp_path):
    code, _, err = tuner("search", *TINY, "--budget", "2", "--runner", "command", "--study", "oom",
                         "--command", f"{PY} {CHAOS / 'oom.py'}")
    assert code == 0, err
    with open_store(tuner.db) as s:
        trials = s.trials("oom")
    assert [t.status for t in trials] == [Status.OOM, Status.OOM]
    for t in trials:
        assert (tmp_path / f"results/trials/oom/{t.number}/attempts.log").read_text().split().__len__() == 1


@pytest.mark.parametrize("mode, status, attempts", [("flaky", Status.OK, 2), ("always", Status.FAILED, 2)])
def test_infrastructure_failure_is_retried_once(tuner, tmp_path, mode, status, attempts):
    code, _, err = tuner("search", *TINY, "--budget", "2", "--runner", "command", "--study", mode,
                         "--command", f"{PY} {CHAOS / 'infra.py'} {mode}")
    assert code == 0, err
    with open_store(tuner.db) as s:
        trials = s.trials(mode)
    assert len(trials) == 2 and all(t.status == status for t in trials), [(t.status, t.message) for t in trials]
    for t in trials:
        assert len((tmp_path / f"results/trials/{mode}/{t.number}/attempts.log").read_text().split()) == attempts
    if mode == "always":
        assert all("Address already in use" in t.message for t in trials)


@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143), (signal.SIGHUP, 129)],
                         ids=["ctrl-c", "sigterm", "sighup"])
def test_ctrl_c_kills_running_trials_and_leaves_no_orphans(tmp_path, sig, code):
    """SIGINT (Ctrl-C), SIGTERM (Slurm's time limit) or SIGHUP (a closed terminal) to the driver while
    command trials hang: they are killed, marked interrupted, and the study is resumable (issue 28)."""
    marker = f"chaos-int-{uuid.uuid4().hex[:10]}"
    db = f"sqlite:///{tmp_path / 'int.db'}"
    proc = tuner_proc(["search", *TINY, "--budget", "2", "--parallel", "2", "--runner", "command", "--study",
                       "int", "--command", f"{PY} {CHAOS / 'hang_tree.py'} {marker}"], tmp_path, db)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and len(list((tmp_path / "results/trials/int").glob("*/spawned"))) < 2:
        time.sleep(0.05)
    time.sleep(0.6)           # the runner notices descendants at its next poll
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == code, err
    assert "tuner resume int" in err and ("interrupted" if sig == signal.SIGINT else signal.Signals(sig).name) in err
    time.sleep(0.3)
    assert_none_left(marker, "orphans after Ctrl-C")
    with open_store(db) as s:
        assert {t.status for t in s.trials("int")} == {Status.INTERRUPTED}
        assert s.get_study("int").state != "running"


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_sigterm_to_a_search_with_running_local_trials_leaves_no_process_and_a_resumable_study(tmp_path):
    """Slurm's time limit (SIGTERM) reaching `tuner search --runner local` while torchrun and both DeepSpeed ranks
    run: all of them end with the driver, the trial is interrupted, and `tuner resume` measures it (issue 28)."""
    pytest.importorskip("deepspeed")
    marker = f"chaos-local-{uuid.uuid4().hex[:10]}"
    db = f"sqlite:///{tmp_path / 'lt.db'}"
    env = {**os.environ, "TUNER_DB": db, "PYTHONPATH": str(ROOT), "CHAOS_MARKER": marker}
    args = [PY, "-m", "tuner", "search", *TINY, "--budget", "1", "--runner", "local", "--gpus", "2", "--study", "lt"]
    proc = subprocess.Popen(args, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None and len(procs_with(marker)) < 4:
        time.sleep(0.2)                                # the driver, torchrun and its two ranks
    assert proc.poll() is None and len(procs_with(marker)) >= 4, "the trial's ranks never started"
    time.sleep(2)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 143 and "SIGTERM" in err and "tuner resume lt" in err, err
    time.sleep(0.5)
    assert_none_left(marker, "processes outlived the driver")
    with open_store(db) as s:
        assert [t.status for t in s.trials("lt")] == [Status.INTERRUPTED]
        assert s.get_study("lt").state != "running"
    r = subprocess.run([PY, "-m", "tuner", "resume", "lt"], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr
    with open_store(db) as s:
        assert Status.OK in {t.status for t in s.trials("lt")}
    assert procs_with(marker) == []


def test_resume_reaps_what_a_sigkilled_driver_left_running(tmp_path):
    """SIGKILL cannot be caught: the trial's process tree survives the driver. `tuner resume` kills it
    (found by its TUNER_TRIAL_DIR, also the grandchild in its own session) before running the trial again."""
    marker = f"chaos-k9-{uuid.uuid4().hex[:10]}"
    db = f"sqlite:///{tmp_path / 'k9.db'}"
    proc = tuner_proc(["search", *TINY, "--budget", "1", "--runner", "command", "--study", "k9", "--trial-timeout",
                       "5", "--command", f"{PY} {CHAOS / 'hang_tree.py'} {marker}"], tmp_path, db)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not list((tmp_path / "results/trials/k9").glob("*/spawned")):
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=30)
    time.sleep(0.3)
    survivors = procs_with(marker)
    assert len(survivors) >= 2, "the fixture's tree should outlive a SIGKILLed driver"
    r = tuner_run(["resume", "k9"], tmp_path, db)
    assert r.returncode == 0, r.stderr
    assert "left by the stopped driver: 1" in r.stderr
    time.sleep(0.3)
    assert_none_left(marker, "orphans after resume")
    with open_store(db) as s:
        [t] = s.trials("k9")
    assert t.status == Status.TIMEOUT


# ---- 3. store faults ----------------------------------------------------------------------------
def _no_trial_ran(tmp_path):
    return not (tmp_path / "results" / "trials").exists()


def test_sqlite_in_missing_directory_fails_before_any_trial(tuner, tmp_path):
    db = f"sqlite:///{tmp_path / 'no' / 'such' / 'dir' / 't.db'}"
    code, out, err = tuner("search", "--model", "22b", "--nodes", "2", "--budget", "2", "--db", db, "--study", "m")
    assert code == 2 and "does not exist" in err and "Traceback" not in err    # bad input: exit 2
    assert len(err.strip().splitlines()) == 1 and out == ""
    assert not (tmp_path / "no").exists() and _no_trial_ran(tmp_path)


def test_read_only_sqlite_uri_fails_before_any_trial(tuner, tmp_path):
    """As root chmod does not stop writes; SQLite's own read-only mode (?mode=ro) does."""
    assert tuner("search", "--model", "22b", "--nodes", "2", "--budget", "1", "--study", "first")[0] == 0
    shutil.rmtree(tmp_path / "results", ignore_errors=True)
    db = f"sqlite:///file:{tmp_path / 'tuner.db'}?mode=ro&uri=true"
    code, out, err = tuner("search", "--model", "22b", "--nodes", "2", "--budget", "2", "--db", db, "--study", "ro")
    assert code == 2 and "read-only" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1 and _no_trial_ran(tmp_path)
    with open_store(tuner.db) as s:
        assert s.study_names() == ["first"]


def test_read_only_mount_fails_before_any_trial(tuner, tmp_path):
    """A database file on a read-only bind mount (needs CAP_SYS_ADMIN; skipped without it)."""
    assert tuner("search", "--model", "22b", "--nodes", "2", "--budget", "1", "--study", "first")[0] == 0
    shutil.rmtree(tmp_path / "results", ignore_errors=True)
    src, mnt = tmp_path / "src", tmp_path / "ro"
    src.mkdir(), mnt.mkdir()
    shutil.copy(tmp_path / "tuner.db", src / "tuner.db")
    if shutil.which("mount") is None or subprocess.run(["mount", "--bind", "-o", "ro", str(src), str(mnt)],
                                                       capture_output=True).returncode != 0:
        pytest.skip("cannot make a read-only bind mount here (needs root / CAP_SYS_ADMIN)")
    try:
        code, out, err = tuner("search", "--model", "22b", "--nodes", "2", "--budget", "2", "--db",
                               f"sqlite:///{mnt / 'tuner.db'}", "--study", "ro")
    finally:
        subprocess.run(["umount", str(mnt)], capture_output=True)
    assert code == 2 and "read-only" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1 and _no_trial_ran(tmp_path)
    with open_store(tuner.db) as s:
        assert s.study_names() == ["first"]


def test_two_drivers_on_one_sqlite_study_never_measure_a_layout_twice(tmp_path):
    """A second driver joins a live study (`tuner resume --join`): every layout runs exactly once."""
    db = f"sqlite:///{tmp_path / 'two.db'}"
    log = tmp_path / "measured.log"
    cmd = f"{PY} {CHAOS / 'record.py'} {log} 0.1"
    first = tuner_proc(["search", *TINY, "--budget", "100", "--parallel", "2", "--runner", "command",
                        "--study", "two", "--command", cmd], tmp_path, db)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not (log.exists() and log.read_text()):
        time.sleep(0.05)
    second = tuner_proc(["resume", "two", "--join"], tmp_path, db)
    out1, err1 = first.communicate(timeout=180)
    out2, err2 = second.communicate(timeout=180)
    assert first.returncode == 0, err1
    assert second.returncode == 0, err2
    measured = [line.split()[0] for line in log.read_text().splitlines()]
    assert len(measured) == len(set(measured)), "a layout was measured twice"
    drivers = {line.split()[1] for line in log.read_text().splitlines()}
    assert drivers == {str(first.pid), str(second.pid)}, "both drivers should have run trials"
    with open_store(db) as s:
        trials = s.trials("two")
    assert all(t.status.finished for t in trials)
    assert sorted(t.layout.key() for t in trials if t.status != Status.PRUNED) == sorted(measured)


@pytest.mark.postgres
def test_postgres_restarted_mid_search(pg_url, tmp_path):
    """`pg_ctlcluster 15 main restart` while a search runs: the driver reconnects (or stops with the
    resume command), and a resume completes the study with nothing lost or duplicated."""
    if shutil.which("pg_ctlcluster") is None or os.geteuid() != 0:
        service_unavailable("pg_ctlcluster", "restarting PostgreSQL needs pg_ctlcluster and root")   # CI: fails
    study = f"chaos-pg-{uuid.uuid4().hex[:8]}"
    args = ["search", "--model", "175b", "--nodes", "16", "--searcher", "random", "--sim-delay", "0.1",
            "--budget", "20", "--study", study]
    proc = tuner_proc(args, tmp_path, pg_url)
    store = open_store(pg_url)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and len(finished(store, study)) < 3:
        time.sleep(0.05)
    kept = {n: snapshot(t) for n, t in finished(store, study).items()}
    store.close()
    r = subprocess.run(["pg_ctlcluster", "15", "main", "restart"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    out, err = proc.communicate(timeout=120)
    assert "Traceback" not in err and "internal error" not in err, err
    if proc.returncode != 0:           # stopped cleanly: a one-line error naming the way back
        assert proc.returncode == 1 and "resume" in err, err
        r = tuner_run(["resume", study], tmp_path, pg_url)
        assert r.returncode == 0, r.stderr
    with open_store(pg_url) as s:
        trials = s.trials(study)
    now = {t.number: t for t in trials}
    assert all(snapshot(now[n]) == v for n, v in kept.items())
    keys = [t.layout.key() for t in trials]
    assert len(keys) == len(set(keys)) and all(t.status.finished for t in trials)
    assert sum(t.status != Status.PRUNED for t in trials) == 20


def test_resume_refuses_a_study_a_live_driver_runs(tmp_path):
    """Without --join, resume would mark a live driver's trials interrupted and run them twice: refused."""
    db = f"sqlite:///{tmp_path / 'live.db'}"
    proc = tuner_proc(["search", "--model", "22b", "--nodes", "2", "--searcher", "random", "--budget", "3",
                       "--sim-delay", "600", "--study", "live"], tmp_path, db)    # live until killed below
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            r = tuner_run(["trials", "live", "--status", "running", "--format", "csv"], tmp_path, db)
            if r.returncode == 0 and len(r.stdout.splitlines()) > 1:
                break
            time.sleep(0.2)
        r = tuner_run(["resume", "live"], tmp_path, db)
        assert r.returncode == 2 and "live driver" in r.stderr and "--join" in r.stderr, r.stderr
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=30)
    with open_store(db) as s:       # the trials left need no 600 s each now (checked: the resume gets in, runs all)
        opts = s.get_study("live").settings["runner_options"]
        s.update_study_settings("live", {"runner_options": {**opts, "sim_delay": 0.0}})
    r = tuner_run(["resume", "live"], tmp_path, db)      # its process is gone: the lease is void at once
    assert r.returncode == 0, r.stderr
    with open_store(db) as s:
        trials = s.trials("live")
    ran = [t for t in trials if t.status != Status.PRUNED]      # a layout a little over the HBM runs (simulated OOM)
    assert len(ran) == 3 and all(t.status in (Status.OK, Status.OOM) for t in ran)
    assert all(t.status.finished for t in trials)


def test_a_reader_that_goes_away_loses_no_study_and_no_closing_line(tmp_path):
    """`tuner search ... | head -1` (issue 28): the study finishes, the lines saying how it ended go to stderr,
    and the exit is 0 (click alone would make a closed pipe a silent exit 1). The reader goes away before the study
    prints (it prints its table and closing lines at the end): had it read a first line, the lines the kernel had
    already buffered for it before it closed would count as delivered, and which ones those are is a race."""
    db = f"sqlite:///{tmp_path / 'pipe.db'}"
    proc = tuner_proc(["search", *TINY, "--budget", "3", "--study", "pipe"], tmp_path, db)
    proc.stdout.close()                       # the reader goes away before the first line
    err = proc.stderr.read()
    assert proc.wait(timeout=120) == 0, err
    assert "study pipe: 3 trial(s) ran" in err and "recommended:" in err
    with open_store(db) as s:
        assert s.get_study("pipe").state == "done" and len(s.trials("pipe")) == 3
