"""tuner as a library: the facade, runners as Python objects and entry points, the stored runner name,
logging, study.toml in and out, and the docs' notebook run as written."""

from __future__ import annotations

import logging
import os
import runpy
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import tuner
from tuner.errors import UsageError
from tuner.runners.registry import FunctionRunner
from tuner.specs import make_workload
from tuner.trial import Status, TrialSpec

ROOT = Path(__file__).resolve().parent.parent
SMALL = {"model": "22b", "nodes": 4}


@pytest.fixture
def db(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return f"sqlite:///{tmp_path / 'lib.db'}"


def spec(tp=2, **kw):
    from tuner.layout import Layout
    w = make_workload("22b", 4)
    return TrialSpec("s", 1, Layout(tp=tp, pp=4, dp=32 // (tp * 4), micro_batch=1, zero_stage=1), w)


# ---- the facade ---------------------------------------------------------------------------------
def test_create_optimize_best_dataframe(db):
    study = tuner.create_study("lib", storage=db, budget=5, **SMALL)
    assert study.trials == [] and study.best() is None        # nothing runs before optimize()
    outcome = study.optimize()
    assert outcome.ran == 5 and outcome.reason == "budget"
    df = study.trials_dataframe()
    assert len(df) == len(study.trials) and list(df.trial) == sorted(df.trial)
    ok = df[df.status == "ok"]
    best = study.best()
    assert best.layout.key() == ok.sort_values("mfu", ascending=False).layout_key.iloc[0]
    assert str(df.started.dtype).startswith("datetime64") and ok.mfu.notna().all()
    assert [t.number for t in study.best(k=3)] == [t.number for t in tuner.load_study("lib", storage=db).best(k=3)]
    more = study.optimize(n_trials=2)
    assert (more.ran, more.earlier) == (2, 5)                  # two more, where it stopped (issue 28: not 7)
    assert study.record.settings["budget"] == 7


def test_the_cli_sees_a_library_study_and_the_reverse(tuner):
    import tuner as lib
    lib.create_study("from-py", storage=tuner.db, budget=3, **SMALL).optimize()
    assert tuner("search", "--model", "22b", "--nodes", "4", "--budget", "2", "--study", "from-cli")[0] == 0
    assert lib.load_study("from-cli", storage=tuner.db).best() is not None
    assert tuner("resume", "from-py", "--budget", "4")[0] == 0
    assert len(lib.load_study("from-py", storage=tuner.db).trials) >= 4
    assert "from-py" in tuner("studies")[1]


def test_bad_options_are_refused_in_the_words_of_the_cli(db):
    with pytest.raises(UsageError, match="unknown key.*budgt.*valid keys"):
        tuner.create_study(storage=db, budgt=5, **SMALL)
    with pytest.raises(UsageError, match=r"budget = 0: Invalid value for '--budget': 0 is not in the range x>=1"):
        tuner.create_study(storage=db, budget=0, **SMALL)
    with pytest.raises(UsageError, match="recompute = 'some'"):
        tuner.create_study(storage=db, recompute="some", **SMALL)


def test_load_if_exists_returns_the_stored_study(db):
    a = tuner.create_study("same", storage=db, budget=3, **SMALL)
    b = tuner.create_study("same", storage=db, budget=9, load_if_exists=True, **SMALL)
    assert b.name == a.name and b.record.settings["budget"] == 3


# ---- runners as Python objects ----------------------------------------------------------------------
def test_a_function_runner_turns_every_outcome_into_a_result():
    r = FunctionRunner(lambda t: 12.5, "f")
    res = r.run(spec())
    assert res.status == Status.OK and res.samples_per_second == 12.5 and res.mfu > 0
    assert FunctionRunner(lambda t: {"status": "ok", "step_time_s": 64.0}, "f").run(spec()).samples_per_second == 10.0

    def oom(t):
        raise RuntimeError("CUDA out of memory. Tried to allocate 2 GiB")
    assert FunctionRunner(oom, "f").run(spec()).status == Status.OOM
    crash = FunctionRunner(lambda t: 1 / 0, "f").run(spec())
    assert crash.status == Status.FAILED and "ZeroDivisionError" in crash.message
    assert "status ok needs 'samples_per_second'" in FunctionRunner(lambda t: {"status": "ok"}, "f").run(spec()).message
    assert "returned list" in FunctionRunner(lambda t: [1], "f").run(spec()).message
    assert FunctionRunner(lambda t: float("nan"), "f").run(spec()).status == Status.FAILED


def measured(trial):
    lay = trial.layout
    if lay.tp == 1:
        raise RuntimeError("out of memory")
    return {"status": "ok", "samples_per_second": 4.0 + lay.micro_batch / lay.tp, "peak_memory_gb": 40.0}


def test_a_study_stores_its_runner_and_resume_refuses_without_it(tuner):
    import tuner as lib
    db = tuner.db
    study = lib.create_study("mine", storage=db, runner=measured, budget=3, **SMALL)
    study.optimize()
    assert study.record.runner == "measured" and {t.runner for t in study.trials} == {"measured"}
    code, _, err = tuner("resume", "mine", "--budget", "5")
    err = err.strip().splitlines()
    assert code == 2 and err[:-1] == [f"store: {db}"]          # where it looked, then the one-line refusal
    assert "run by runner 'measured', which this process does not have" in err[-1]
    assert len(lib.load_study("mine", storage=db).trials) == 3        # nothing ran with another runner
    with pytest.raises(UsageError, match="which this process does not have"):
        lib.load_study("mine", storage=db).optimize(n_trials=1)
    with pytest.raises(UsageError, match="is run by runner 'measured', not 'sim'"):
        lib.load_study("mine", storage=db, runner="sim")
    assert lib.load_study("mine", storage=db, runner=measured).optimize(n_trials=2).ran == 2


def test_registered_runners_and_names(db):
    with pytest.raises(UsageError, match="built in"):
        tuner.register_runner("sim", measured)
    with pytest.raises(UsageError, match="built-in runner's name"):
        tuner.create_study(storage=db, runner=measured, runner_name="local", **SMALL)
    tuner.register_runner("measured-v1", measured)
    try:
        assert "measured-v1" in tuner.runner_names()
        tuner.create_study("reg", storage=db, runner="measured-v1", budget=2, **SMALL).optimize()
        assert tuner.load_study("reg", storage=db).optimize(n_trials=1).ran == 1    # found by its name
    finally:
        tuner.unregister_runner("measured-v1")


def test_an_entry_point_runner_runs_and_resumes_from_the_cli(tmp_path):
    """A runner another package installs (entry point group tuner.runners): the CLI offers it, stores its
    name, and a new process resumes with it."""
    site = tmp_path / "site"
    (site / "my_trainer").mkdir(parents=True)
    (site / "my_trainer" / "__init__.py").write_text(textwrap.dedent('''
        def run(trial):
            return {"status": "ok", "samples_per_second": 3.0 + trial.layout.micro_batch, "peak_memory_gb": 40.0}
    '''))
    info = site / "my_trainer-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: my-trainer\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[tuner.runners]\nmy-trainer = my_trainer:run\n")
    env = {**os.environ, "PYTHONPATH": str(site), "TUNER_DB": f"sqlite:///{tmp_path / 'ep.db'}"}
    run = lambda *a: subprocess.run([sys.executable, "-m", "tuner", *a], cwd=tmp_path, env=env,
                                    capture_output=True, text=True, timeout=300)
    p = run("search", "--model", "22b", "--nodes", "4", "--runner", "my-trainer", "--budget", "2", "--study", "ep")
    assert p.returncode == 0, p.stderr
    p = run("resume", "ep", "--budget", "3")
    assert p.returncode == 0, p.stderr
    from tuner.store import open_store
    with open_store(env["TUNER_DB"]) as store:
        trials = store.trials("ep")
        assert store.get_study("ep").runner == "my-trainer"
    assert len(trials) == 3 and {t.runner for t in trials} == {"my-trainer"}
    assert {t.samples_per_second for t in trials} <= {3.0 + mb for mb in (1, 2, 4, 8, 16)}   # its numbers
    bare = {**env, "PYTHONPATH": ""}                     # the same store without the plug-in
    p = subprocess.run([sys.executable, "-m", "tuner", "resume", "ep", "--budget", "4"], cwd=tmp_path, env=bare,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 2 and "run by runner 'my-trainer'" in p.stderr and "Traceback" not in p.stderr


# ---- logging -----------------------------------------------------------------------------------------
def test_notes_go_through_the_tuner_logger(db):
    """The notes are records of the "tuner" logger, whatever handlers and propagation an application set."""
    class Keep(logging.Handler):
        def __init__(self):
            super().__init__(logging.INFO)
            self.records = []

        def emit(self, record):
            self.records.append(record)

    logger, keep = logging.getLogger("tuner"), Keep()
    logger.addHandler(keep)
    logger.setLevel(logging.INFO)
    try:
        tuner.create_study("cold", storage=db, runner=measured, budget=2, warm_start=True, **SMALL).optimize()
        assert any("found no stored trials" in r.getMessage() and r.levelno == logging.WARNING
                   for r in keep.records)
        keep.records.clear()
        tuner.create_study("warm", storage=db, budget=2, warm_start=True, **SMALL).optimize()
        assert any("warm start from 2 trial(s)" in r.getMessage() for r in keep.records)
    finally:
        logger.removeHandler(keep)


def test_the_cli_prints_the_log_on_stderr(tuner):
    tuner("search", "--model", "22b", "--nodes", "4", "--budget", "2", "--study", "a")    # simulated: no evidence
    code, _, err = tuner("search", "--model", "22b", "--nodes", "8", "--budget", "2", "--study", "b", "--warm-start")
    assert code == 0 and ("found no stored trials of gpt-22b on frontier measured with megatron-deepspeed "
                          "(2 simulated trial(s) left out): starting cold") in err


# ---- study.toml ----------------------------------------------------------------------------------------
def test_config_round_trip_reproduces_the_study(tuner, tmp_path):
    code, _, err = tuner("search", "--model", "llama3-8b", "--nodes", "2", "--cluster", "h100", "--budget", "3",
                         "--tp", "2", "--stop-threshold", "0.05", "--noise", "0.01", "--study", "orig")
    assert code == 0, err
    code, text, _ = tuner("config", "orig")
    assert code == 0 and 'model = "llama3-8b"' in text and "noise = 0.01" in text
    (tmp_path / "s.toml").write_text(text)
    code, _, err = tuner("search", "--config", "s.toml", "--study", "copy", "--budget", "4")   # a flag wins
    assert code == 0, err
    from tuner.store import open_store
    with open_store(tuner.db) as store:
        a, b = store.get_study("orig"), store.get_study("copy")
    assert a.workload == b.workload and a.space == b.space and a.runner == b.runner
    drop = lambda s: {k: v for k, v in s.items() if k not in ("budget", "drivers", "driver", "epoch")}
    assert drop(a.settings) == drop(b.settings) and b.settings["budget"] == 4
    assert a.space["dimensions"]["tp"] == [2]


def test_config_writes_a_custom_model_as_a_table(tuner, tmp_path):
    from tuner.specs import load_model
    m = load_model("22b").as_dict()
    body = "\n".join(f"{k} = {v!r}" if not isinstance(v, str) else f'{k} = "{v}"' for k, v in m.items()
                     if v is not None and k != "name")
    (tmp_path / "mine.toml").write_text(f'name = "mine"\n{body.replace("True", "true").replace("False", "false")}\n')
    assert tuner("search", "--model", "mine.toml", "--nodes", "4", "--budget", "2", "--study", "m")[0] == 0
    code, text, _ = tuner("config", "m", "--out", "m.toml")
    assert code == 0 and "[model]" in (tmp_path / "m.toml").read_text()
    (tmp_path / "mine.toml").unlink()                     # the file is self-contained
    code, _, err = tuner("search", "--config", "m.toml", "--study", "m2")
    assert code == 0, err


@pytest.mark.parametrize("body, words", [
    ("budgt = 3\n", "unknown key(s) budgt"),
    ("budget = 'many'\n", "budget = 'many'"),
    ("model = \n", "is not valid TOML"),
])
def test_bad_config_is_one_line(tuner, tmp_path, body, words):
    (tmp_path / "bad.toml").write_text('nodes = 4\nmodel = "22b"\n' * (words != "is not valid TOML") + body)
    code, out, err = tuner("search", "--config", "bad.toml")
    assert code == 2 and words in err and len(err.strip().splitlines()) == 1


def test_missing_config_file(tuner):
    code, _, err = tuner("search", "--config", "nope.toml")
    assert code == 2 and "no such file" in err


# ---- the notebook in docs/ ---------------------------------------------------------------------------
def test_the_docs_notebook_runs_as_written(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("TUNER_DB", raising=False)
    runpy.run_path(str(ROOT / "docs" / "library_example.py"), run_name="__main__")
    out = capsys.readouterr().out
    assert "recommended:" in out and "trials stored" in out and 'model = "llama3-70b"' in out
    assert (tmp_path / "notebook.db").exists()


# ---- review fixes ------------------------------------------------------------------------------------
def test_a_config_files_runner_is_used_not_the_simulator(db, tmp_path):
    (tmp_path / "cmd.toml").write_text('model = "22b"\nnodes = 4\nrunner = "command"\ncommand = "python train.py"\n')
    study = tuner.create_study("c", storage=db, config=str(tmp_path / "cmd.toml"), budget=2)
    assert study.record.runner == "command" and study.record.settings["runner_options"]["command"] == "python train.py"


def test_a_refused_optimize_leaves_the_budget_alone(db):
    import time as _time
    study = tuner.create_study("busy", storage=db, budget=6, **SMALL)
    study.optimize(n_trials=1)
    other = {"elsewhere:1": {"host": "elsewhere", "pid": 1, "seen": _time.time()}}   # a live driver elsewhere
    study.store.update_study_settings("busy", {"drivers": other})
    with pytest.raises(UsageError, match="being run by a live driver"):
        tuner.load_study("busy", storage=db).optimize(n_trials=3)
    assert study.record.settings["budget"] == 1


def test_a_runner_object_keeps_its_name(db):
    tuner.create_study("named", storage=db, runner=measured, budget=1, **SMALL).optimize()
    def other(trial):
        return 1.0
    with pytest.raises(UsageError, match="is run by runner 'measured', not 'other'"):
        tuner.load_study("named", storage=db, runner=other)
    assert tuner.load_study("named", storage=db, runner=other, runner_name="measured").runner.name == "measured"


def test_runner_names_that_cannot_work_are_refused_with_the_fix(db):
    with pytest.raises(UsageError, match="unknown runner 'nope': give one of sim, command, local, slurm"):
        tuner.create_study(storage=db, runner="nope", **SMALL)
    with pytest.raises(UsageError, match="pass runner_name="):
        tuner.create_study(storage=db, runner=lambda t: 1.0, **SMALL)


def test_config_keys_may_be_spelled_as_the_flags(tuner, tmp_path):
    (tmp_path / "s.toml").write_text('model = "22b"\nnodes = 4\nbudget = 2\ncp = 1\nep = 1\nmicro_batch = 2\n')
    code, _, err = tuner("search", "--config", "s.toml", "--study", "flags")
    assert code == 0, err
    from tuner.store import open_store
    with open_store(tuner.db) as store:
        dims = store.get_study("flags").space["dimensions"]
    assert dims["context_parallel"] == [1] and dims["expert_parallel"] == [1] and dims["micro_batch"] == [2]


def test_a_python_runners_study_file_says_how_to_use_it(tuner, tmp_path):
    (tmp_path / "p.toml").write_text('model = "22b"\nnodes = 4\nrunner = "short_run"\n')
    code, _, err = tuner("search", "--config", "p.toml")
    assert code == 2 and "tuner.create_study(config=FILE, runner=short_run)" in err
    assert tuner("search", "--model", "22b", "--nodes", "4", "--budget", "1", "--study", "o")[0] == 0
    code, _, err = tuner("config", "o", "--out", str(tmp_path / "missing" / "o.toml"))
    assert code == 2 and "does not exist" in err and "internal error" not in err
