"""Many drivers on one study, Ctrl-C at any instant, a closed stdout, a command that always fails."""

from __future__ import annotations

import os
import subprocess
import re
import sys
import time
from pathlib import Path

import pytest

from tuner.driver import Driver
from tuner.errors import TunerError
from tuner.executors import InlineExecutor
from tuner.runners import make_runner
from tuner.search import make_searcher
from tuner.space import load_space
from tuner.specs import make_workload
from tuner.store import StudyRecord, open_store
from tuner.trial import Status

ROOT = Path(__file__).resolve().parents[1]


def tuner_proc(args, cwd, db) -> subprocess.Popen:
    env = {**os.environ, "TUNER_DB": db, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-m", "tuner", *args], cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def shared_db(request, tmp_path):
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'shared.db'}"
    return request.getfixturevalue("pg_url")          # emptied by the fixture (tests/conftest.py)


def ran(db: str, study: str) -> list:
    with open_store(db) as s:
        trials = s.trials(study)
    keys = [t.layout.key() for t in trials]
    assert len(keys) == len(set(keys))                     # no layout measured twice
    return [t for t in trials if t.status != Status.PRUNED]


def test_resumes_started_at_once_let_exactly_one_driver_in_and_the_budget_holds(shared_db, tmp_path):
    first = tuner_proc(["search", "--model", "22b", "--nodes", "2", "--searcher", "random", "--budget", "1",
                        "--sim-delay", "1", "--no-stop", "--study", "s"], tmp_path, shared_db)
    assert first.wait(timeout=120) == 0, first.communicate()[1]
    procs = [tuner_proc(["resume", "s", "--budget", "8"], tmp_path, shared_db) for _ in range(3)]
    outs = [p.communicate(timeout=300) for p in procs]
    codes = [p.returncode for p in procs]
    refused = [err for p, (_, err) in zip(procs, outs) if p.returncode == 2]
    assert sorted(codes) == [0, 2, 2], outs
    assert all("live driver" in err for err in refused)
    assert len(ran(shared_db, "s")) == 8                   # the budget of the study, not of each driver


def test_joined_drivers_share_one_budget(shared_db, tmp_path):
    lead = tuner_proc(["search", "--model", "22b", "--nodes", "2", "--searcher", "random", "--budget", "10",
                       "--parallel", "2", "--sim-delay", "1", "--no-stop", "--study", "j"], tmp_path, shared_db)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:             # wait until the study exists and runs
        try:
            with open_store(shared_db) as s:
                if s.trials("j"):
                    break
        except TunerError:
            pass
        time.sleep(0.3)
    joins = [tuner_proc(["resume", "j", "--join"], tmp_path, shared_db) for _ in range(2)]
    outs = []
    for p in (lead, *joins):
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
        outs.append(out)
    trials = ran(shared_db, "j")
    assert len(trials) == 10 and all(t.status.finished for t in trials)
    with open_store(shared_db) as s:
        stored = len(s.trials("j"))
    lines = [next(ln for ln in out.splitlines() if ln.startswith("study j: ")) for out in outs]
    said = []
    for line in lines:     # each driver says what it ran and, where that is not all, what the study holds
        own = sum(int(w) for w in re.findall(r"(\d+) (?:trial\(s\) ran|pruned)", line))
        total = re.search(r"; (\d+) in the study\.$", line)
        if total:
            assert own < int(total.group(1)) <= stored, line
            said.append(line)
    assert len(said) >= 2, lines   # three drivers shared the trials: at most one ran all there were at its end


class _CtrlCOnSubmit(InlineExecutor):
    """Ctrl-C arrives after the driver claimed a trial and before the trial is in flight."""

    def submit(self, fn, *args):
        raise KeyboardInterrupt


def test_ctrl_c_between_claim_and_launch_leaves_no_trial_running(tmp_path):
    w = make_workload("22b", 2)
    space = load_space()
    store = open_store(f"sqlite:///{tmp_path / 'c.db'}")
    store.create_study(StudyRecord("c", w.as_dict(), {"name": space.name}, "random", "sim"))
    d = Driver(store=store, study="c", workload=w, executor=_CtrlCOnSubmit(), budget=5,
               searcher=make_searcher("random", space.enumerate_layouts(w)), runner=make_runner("sim"),
               results_dir=tmp_path)
    with pytest.raises(TunerError, match=r"1 running trial\(s\) marked interrupted.*tuner resume c"):
        d.run()
    trials = store.trials("c")
    assert [t.status for t in trials if t.status != Status.PRUNED] == [Status.INTERRUPTED]
    assert store.get_study("c").state == "interrupted"


def test_a_closed_stdout_does_not_stop_a_search(tmp_path):
    db = f"sqlite:///{tmp_path / 'p.db'}"
    cmd = (f"{sys.executable} -m tuner search --model 22b --nodes 2 --budget 12 --no-stop --study pipe 2>&1 "
           "| head -2")
    r = subprocess.run(["bash", "-c", cmd], cwd=tmp_path, env={**os.environ, "TUNER_DB": db, "PYTHONPATH": str(ROOT)},
                       capture_output=True, text=True, timeout=300)
    assert len(r.stdout.splitlines()) == 2
    with open_store(db) as s:
        assert s.get_study("pipe").state == "done"
        trials = s.trials("pipe")
    assert all(t.status.finished for t in trials) and sum(t.status != Status.PRUNED for t in trials) == 12


def test_a_command_that_always_fails_the_same_way_stops_the_study(tmp_path):
    (tmp_path / "proj").mkdir()
    base = ["search", "--model", "tiny", "--nodes", "1", "--cluster", "local", "--runner", "command", "--budget",
            "8", "--searcher", "grid", "--command", f"{sys.executable} trian.py"]      # a typo
    db = f"sqlite:///{tmp_path / 'f.db'}"
    p = tuner_proc([*base, "--study", "typo"], tmp_path / "proj", db)
    _, err = p.communicate(timeout=300)
    assert p.returncode == 1 and "3 trials in a row failed the same way" in err and "trian.py" in err
    last = err.strip().splitlines()[-1]                    # one error line, after the progress lines
    assert last.startswith("error:") and "tuner resume typo" in last and "Traceback" not in err
    assert len(ran(db, "typo")) == 3
    p = tuner_proc([*base, "--study", "kept", "--keep-going"], tmp_path / "proj", db)
    _, err = p.communicate(timeout=300)
    assert p.returncode == 0, err
    assert len(ran(db, "kept")) == 8 and {t.status for t in ran(db, "kept")} == {Status.FAILED}


def test_out_of_memory_trials_are_results_not_a_broken_command(tmp_path):
    """OOMs in a row (the model let layouts through that do not fit) never stop a study as 'failing'."""
    from tuner import study
    store = open_store(f"sqlite:///{tmp_path / 'o.db'}")
    w = make_workload("175b", 16)
    rec = study.create(store, study.new_record("o", w, load_space(), searcher="random", prune=False, seed=2,
                                               budget=8, results_dir=str(tmp_path)))
    result = study.run(store, rec)
    statuses = [t.status for t in store.trials("o")]
    assert result.outcome.ran == 8 and statuses.count(Status.OOM) >= 3
    assert store.get_study("o").state == "done"
