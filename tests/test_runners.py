"""The runner contract, run against every runner, and the command runner's protocol in detail.

No mocks: the command runner starts the real scripts in tests/fixtures, the local runner real
DeepSpeed trials (marked slow). Orphans are checked with psutil.
"""

from __future__ import annotations

import dataclasses
import json
import pickle
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from tuner import metrics
from tuner.layout import LAYOUT_FIELDS, Layout
from tuner.runners import RUNNERS, TrialRunner, make_runner
from tuner.specs import load_cluster, make_workload
from tuner.trial import Status, TrialResult, TrialSpec

FIXTURES = Path(__file__).parent / "fixtures"
PY = sys.executable


def fixture_cmd(name: str, *args: str) -> str:
    return " ".join([PY, str(FIXTURES / name), *args])


def workload(gpus: int = 2, model: str = "tiny"):
    cluster = dataclasses.replace(load_cluster("frontier"), name="test", gpus_per_node=gpus)
    return make_workload(model, nodes=1, cluster=cluster)


def spec(study: str = "s", number: int = 0, trial_dir: Path | None = None, gpus: int = 2,
         model: str = "tiny", **layout) -> TrialSpec:
    lay = Layout(**{"tp": 1, "pp": 1, "dp": gpus, "micro_batch": 2, **layout})
    return TrialSpec(study, number, lay, workload(gpus, model), trial_dir)


def no_orphans(pids, wait: float = 5.0) -> list[int]:
    """The pids still running (zombies excepted) after up to `wait` seconds."""
    deadline = time.monotonic() + wait
    while True:
        alive = []
        for pid in pids:
            try:
                if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                    alive.append(pid)
            except psutil.NoSuchProcess:
                pass
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.1)


def trial_processes(results_dir: Path, wait: float = 5.0) -> list[str]:
    """Live processes (any depth, any session) whose TUNER_TRIAL_DIR lies under `results_dir`."""
    root = str(results_dir.resolve())
    deadline = time.monotonic() + wait
    while True:
        found = []
        for p in psutil.process_iter(["pid", "cmdline"]):
            try:
                if p.status() != psutil.STATUS_ZOMBIE and p.environ().get("TUNER_TRIAL_DIR", "").startswith(root):
                    found.append(f"{p.pid}: {' '.join(p.info['cmdline'] or [])}")
            except psutil.Error:
                continue
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.2)


# --------------------------------------------------------------------------------------------
# The contract: every runner
# --------------------------------------------------------------------------------------------

@dataclasses.dataclass
class Case:
    """How to drive one runner through the contract: a runner factory and trials for each outcome.
    (tests/test_slurm.py drives the Slurm runner through the same class with its own Case.)"""
    make: object            # (tmp_path, timeout | None) -> runner
    ok: TrialSpec
    bad: TrialSpec          # a trial that fails (any failure status)
    slow: TrialSpec | None  # a trial that runs long: times out under a short timeout, cancel() stops it
    timeout: float | None   # the short timeout, None when the runner has none
    slow_make: object = None
    cancel_after: float = 1.0
    oom: TrialSpec | None = None          # a trial that runs out of memory (None: not driven here)
    oom_make: object = None               # (tmp_path) -> the runner for it, when `make` will not do
    progress: TrialSpec | None = None     # a long trial that reports per-step progress, for early stop
    progress_make: object = None          # (tmp_path) -> the runner for it
    ignores_early_stop: bool = False      # the runner watches no progress (the simulator predicts)


def sim_case() -> Case:
    oom = spec(model="gpt-175b", gpus=2, micro_batch=8)
    return Case(make=lambda tmp, timeout: make_runner("sim"),
                ok=spec(), bad=oom, oom=oom,
                slow=spec(), timeout=None,
                slow_make=lambda tmp, timeout: make_runner("sim", delay=30), ignores_early_stop=True)


def command_case() -> Case:
    return Case(make=lambda tmp, timeout: make_runner("command", command=fixture_cmd("fake_trainer.py"),
                                                      trial_timeout=timeout, results_dir=tmp, kill_grace=1.0),
                ok=spec("contract-ok"), bad=spec("contract-fail"), slow=spec("contract-hang"), timeout=1.5,
                oom=spec("contract-oom"), progress=spec("contract-progress", tp=2, dp=1),
                progress_make=lambda tmp: make_runner("command", command=fixture_cmd("progress_trainer.py"),
                                                      results_dir=tmp, kill_grace=1.0, poll_interval=0.1))


def local_case() -> Case:
    def make(tmp, timeout, steps=2, warmup=1, **kw):
        return make_runner("local", gpus=2, trial_timeout=timeout, results_dir=tmp, steps=steps, warmup=warmup, **kw)
    return Case(make=make, ok=spec("local-ok"), bad=spec("local-bad", tp=2, dp=2),
                slow=spec("local-slow"), timeout=8.0, cancel_after=8.0,
                slow_make=lambda tmp, timeout: make(tmp, timeout, steps=1_000_000),
                oom=spec("local-oom"), oom_make=lambda tmp: make(tmp, 300, steps=1, warmup=0, memory_gb=0.02),
                progress=spec("local-progress"), progress_make=lambda tmp: make(tmp, 300, steps=1_000_000))


CASES = {"sim": sim_case, "command": command_case,
         "local": pytest.param(local_case, marks=[pytest.mark.slow, pytest.mark.timeout(900)])}


def _local_available() -> None:
    try:
        import deepspeed  # noqa: F401
        import torch  # noqa: F401
    except ImportError as exc:
        pytest.skip(f"the local runner needs pip install 'tuner[deepspeed]': {exc}")


@pytest.fixture(params=list(CASES.values()), ids=list(CASES))
def case(request) -> Case:
    if request.node.callspec.id == "local":
        _local_available()
    return request.param()


class TestRunnerContract:
    def test_interface_and_its_defaults(self, case, tmp_path):
        runner = case.make(tmp_path, None)
        assert isinstance(runner, TrialRunner) and runner.name in RUNNERS
        assert isinstance(runner.measured, bool) and runner.measured == (runner.name != "sim")
        assert runner.early_stop is None                        # set by the driver, never by default
        need = runner.resources(case.ok)
        assert need and all(isinstance(k, str) and v >= 0 for k, v in need.items()) and sum(need.values()) > 0
        assert runner.cancel_study_jobs("contract-nothing-left") == []
        runner.cancel()                                         # nothing running: nothing to stop

    def test_pickles_without_the_drivers_hook(self, case, tmp_path):
        runner = case.make(tmp_path, None)
        if runner.name == "slurm":
            pytest.skip("the Slurm runner stays with the driver (its poller is a thread there)")
        runner.early_stop = lambda progress: threading.Lock()   # unpicklable, like the driver's bound method
        copy = pickle.loads(pickle.dumps(runner))                # how Ray workers receive it
        assert copy.early_stop is None and type(copy) is type(runner) and copy.name == runner.name

    def test_success(self, case, tmp_path):
        runner = case.make(tmp_path, None)
        r = runner.run(case.ok)
        assert isinstance(r, TrialResult)
        assert r.status == Status.OK, r.message
        assert r.samples_per_second > 0          # what every runner measures; tuner derives the rest
        done = metrics.complete(r, case.ok.workload, case.ok.layout)
        assert done.objective == done.mfu > 0 and done.tflops_per_gpu > 0 and 0 < done.peak_fraction
        assert isinstance(runner.measured, bool) and runner.name

    def test_failure_is_a_result(self, case, tmp_path):
        r = case.make(tmp_path, None).run(case.bad)
        assert isinstance(r, TrialResult)
        assert r.status in (Status.FAILED, Status.OOM), r
        assert r.message and r.objective is None

    def test_out_of_memory_is_a_result(self, case, tmp_path):
        if case.oom is None:
            pytest.skip("no out-of-memory trial for this runner here (its own tests drive one)")
        r = (case.oom_make(tmp_path) if case.oom_make else case.make(tmp_path, None)).run(case.oom)
        assert r.status == Status.OOM and r.objective is None, r
        assert trial_processes(tmp_path) == []

    def test_early_stop_hook(self, case, tmp_path):
        """The driver's hook, asked with the trial's progress records, stops a running trial: STOPPED,
        with the partial measurement kept. A runner that watches no progress runs the trial as usual."""
        seen: list[int] = []

        def hook(progress):
            seen.append(len(progress))
            return len(progress) >= 2               # clearly worse once a step after warm-up is timed

        if case.ignores_early_stop:
            runner = case.make(tmp_path, None)
            runner.early_stop = hook
            assert runner.run(case.ok).status == Status.OK and not seen
            return
        if case.progress is None:
            pytest.skip("no progress-reporting trial for this runner here (its own tests drive one)")
        runner = case.progress_make(tmp_path)
        runner.early_stop = hook
        r = runner.run(case.progress)
        assert r.status == Status.STOPPED and "stopped early" in r.message, r
        assert seen and seen[-1] >= 2 and r.samples_per_second > 0 and r.objective is None
        assert trial_processes(tmp_path) == []

    def test_timeout_is_a_result(self, case, tmp_path):
        if case.timeout is None:
            pytest.skip("this runner has no trial timeout (the simulator predicts instantly)")
        r = (case.slow_make or case.make)(tmp_path, case.timeout).run(case.slow)   # it never ends by itself
        assert r.status == Status.TIMEOUT, r
        assert "trial-timeout" in r.message
        assert trial_processes(tmp_path) == []

    def test_cancel_interrupts_live_runs(self, case, tmp_path):
        runner = (case.slow_make or case.make)(tmp_path, None)
        out = []
        t = threading.Thread(target=lambda: out.append(runner.run(case.slow)))
        t.start()
        time.sleep(case.cancel_after)
        runner.cancel()
        t.join(120)                         # a hang guard, not a timing: the slow trial never ends by itself
        assert not t.is_alive(), "run() did not return after cancel()"
        assert out[0].status == Status.INTERRUPTED, out[0]
        assert trial_processes(tmp_path) == []
        assert runner.run(case.ok).status == Status.INTERRUPTED   # cancelled runners start nothing


# --------------------------------------------------------------------------------------------
# The command runner's protocol
# --------------------------------------------------------------------------------------------

def command(tmp_path, cmd: str, **kw):
    return make_runner("command", command=cmd, results_dir=tmp_path, kill_grace=1.0, **kw)


def test_trial_dir_json_env_and_logs(tmp_path):
    r = command(tmp_path, fixture_cmd("fake_trainer.py")).run(spec("st", 7, zero_stage=0,
                                                                    recompute="none"))
    d = tmp_path / "trials" / "st" / "7"
    assert r.status == Status.OK and r.log_path == str(d.resolve())
    assert r.samples_per_second == 12.0 and r.peak_memory_gb == 7.5      # 10 + micro_batch
    t = spec("st", 7, zero_stage=0, recompute="none")
    assert r.mfu == pytest.approx(metrics.mfu(12.0, t.workload))          # the fixture's 999 TFLOPS ignored
    assert r.tflops_per_gpu == pytest.approx(metrics.megatron_tflops(12.0, t.workload, t.layout))
    assert r.peak_fraction == pytest.approx(r.tflops_per_gpu / load_cluster("frontier").peak_tflops)
    trial = json.loads((d / "trial.json").read_text())
    assert trial == spec("st", 7, zero_stage=0, recompute="none").as_json()
    assert set(trial) == {"study", "trial", "layout", "model", "cluster", "nodes", "gpus", "global_batch", "precision",
                          "framework"}
    assert set(trial["layout"]) == set(LAYOUT_FIELDS)
    env = json.loads((d / "env.json").read_text())
    assert env["TUNER_TRIAL_JSON"] == str(d.resolve() / "trial.json")
    assert env["TUNER_RESULT_JSON"] == str(d.resolve() / "result.json")
    assert env["TUNER_TRIAL_DIR"] == str(d.resolve())
    assert {k: env[k] for k in ("TUNER_TP", "TUNER_PP", "TUNER_DP", "TUNER_MICRO_BATCH", "TUNER_ZERO_STAGE",
                                "TUNER_ACTIVATION_CHECKPOINTING", "TUNER_GLOBAL_BATCH", "TUNER_NODES",
                                "TUNER_GPUS")} == {
        "TUNER_TP": "1", "TUNER_PP": "1", "TUNER_DP": "2", "TUNER_MICRO_BATCH": "2", "TUNER_ZERO_STAGE": "0",
        "TUNER_ACTIVATION_CHECKPOINTING": "0", "TUNER_GLOBAL_BATCH": "16", "TUNER_NODES": "1", "TUNER_GPUS": "2"}
    assert float(env["TUNER_PEAK_TFLOPS"]) == load_cluster("frontier").peak_tflops
    assert env["TUNER_PRECISION"] == "bf16" and env["TUNER_RECOMPUTE"] == "none"
    assert env["TUNER_FRAMEWORK"] == trial["framework"] == "megatron-deepspeed"
    assert env["TUNER_LAYOUT_KEY"] == "tp1-pp1-dp2-mb2-z0-rcnone"
    assert (d / "cwd.txt").read_text() == str(d.resolve())
    assert "trial 7 layout" in (d / "stdout.log").read_text()
    assert (d / "stderr.log").exists()


def test_driver_trial_dir_and_user_env(tmp_path):
    d = tmp_path / "elsewhere" / "3"
    r = command(tmp_path, fixture_cmd("fake_trainer.py"), env={"FAKE_STEPS": 5}).run(spec(trial_dir=d))
    assert r.status == Status.OK and r.log_path == str(d)
    assert len((d / "progress.jsonl").read_text().splitlines()) == 5


def test_relative_trial_dir_gets_absolute_paths(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    r = command(tmp_path, fixture_cmd("fake_trainer.py")).run(spec(trial_dir=Path("results/trials/s/1")))
    d = tmp_path / "results" / "trials" / "s" / "1"
    assert r.status == Status.OK, r.message
    assert r.log_path == str(d) and json.loads((d / "env.json").read_text())["TUNER_TRIAL_DIR"] == str(d)


def test_stale_result_of_a_resumed_trial_is_not_read(tmp_path):
    d = tmp_path / "trials" / "s" / "0"
    d.mkdir(parents=True)
    (d / "result.json").write_text('{"status": "ok", "samples_per_second": 1}')
    r = command(tmp_path, fixture_cmd("exit_nonzero.py")).run(spec())
    assert r.status == Status.FAILED


@pytest.mark.parametrize("args,status,words", [
    ((), Status.FAILED, ["exit status 3 (no result written); RuntimeError: the model exploded"]),
    (("--oom",), Status.OOM, ["CUDA out of memory"]),
    (("--signal",), Status.FAILED, ["killed by SIGKILL"]),
])
def test_exit_without_result(tmp_path, args, status, words):
    r = command(tmp_path, fixture_cmd("exit_nonzero.py", *args)).run(spec())
    assert r.status == status, r
    for w in words:
        assert w in r.message


def test_missing_command_is_failed_with_reason(tmp_path):
    r = command(tmp_path, "no-such-trainer-xyz --flag").run(spec())
    assert r.status == Status.FAILED
    assert "command not found: 'no-such-trainer-xyz'" in r.message and "PATH" in r.message


def test_exit_zero_without_result(tmp_path):
    r = command(tmp_path, "true").run(spec())
    assert r.status == Status.FAILED and "TUNER_RESULT_JSON" in r.message


@pytest.mark.parametrize("args,words", [((), "not valid JSON"), (("--no-status",), "has no 'status'")])
def test_bad_result_file_is_failed_naming_it(tmp_path, args, words):
    r = command(tmp_path, fixture_cmd("bad_json.py", *args)).run(spec())
    assert r.status == Status.FAILED
    assert words in r.message and str(tmp_path / "trials" / "s" / "0" / "result.json") in r.message


def test_no_shell(tmp_path):
    marker = tmp_path / "injected"
    r = command(tmp_path, f"echo hi; touch {marker}").run(spec())
    assert not marker.exists()
    assert r.status == Status.FAILED        # echo ran with the literal arguments and wrote no result
    r = command(tmp_path, f"bash -c 'touch {marker}'").run(spec())   # a shell only when asked for
    assert marker.exists()


def test_timeout_kills_the_whole_tree(tmp_path):
    runner = command(tmp_path, fixture_cmd("spawn_child_hang.py"), trial_timeout=5.0)
    r = runner.run(spec())
    assert r.status == Status.TIMEOUT
    pids = json.loads((tmp_path / "trials" / "s" / "0" / "pids.json").read_text())
    assert no_orphans(pids.values()) == [], f"orphans left: {pids}"


def test_sigterm_ignored_escalates_to_sigkill(tmp_path):
    # Stopped once its SIGTERM handler is in place (it prints 'hanging' then), not at a fixed time: a 1 s
    # --trial-timeout killed it before the handler existed where the machine was busy, and nothing was asked
    # politely. cancel() ends a trial through the same kill as --trial-timeout.
    runner = command(tmp_path, fixture_cmd("hang.py", "--ignore-term"))
    d = tmp_path / "trials" / "s" / "0"
    out = []
    t = threading.Thread(target=lambda: out.append(runner.run(spec())))
    t.start()
    while t.is_alive() and "hanging" not in ((d / "stdout.log").exists() and (d / "stdout.log").read_text() or ""):
        time.sleep(0.05)
    runner.cancel()
    t.join(120)                         # a hang guard, not a timing
    assert not t.is_alive(), "run() did not return after cancel()"
    r = out[0]
    assert r.status == Status.INTERRUPTED, r
    assert (d / "got-sigterm").exists()                       # asked politely first, and it ignored that
    assert no_orphans([int((d / "pid").read_text())]) == []   # so SIGKILL ended it


def test_concurrent_runs_and_cancel(tmp_path):
    runner = command(tmp_path, fixture_cmd("spawn_child_hang.py"))
    out = {}
    threads = [threading.Thread(target=lambda i=i: out.setdefault(i, runner.run(spec(number=i))))
               for i in range(3)]
    for t in threads:
        t.start()
    dirs = [tmp_path / "trials" / "s" / str(i) for i in range(3)]
    deadline = time.monotonic() + 20
    while not all((d / "pids.json").exists() for d in dirs) and time.monotonic() < deadline:
        time.sleep(0.1)
    runner.cancel()
    for t in threads:
        t.join(20)
    assert [out[i].status for i in range(3)] == [Status.INTERRUPTED] * 3
    pids = [p for d in dirs for p in json.loads((d / "pids.json").read_text()).values()]
    assert no_orphans(pids) == []


def test_early_stop_hook(tmp_path):
    seen = []

    def stop(progress):
        seen.append(len(progress))
        return len(progress) >= 2

    runner = command(tmp_path, fixture_cmd("fake_trainer.py"), env={"FAKE_STEPS": 50, "FAKE_STEP_SECONDS": 0.2},
                     early_stop=stop, poll_interval=0.1)
    r = runner.run(spec())
    assert r.status == Status.STOPPED and seen and seen[-1] >= 2
    last = [json.loads(x) for x in (Path(r.log_path) / "progress.jsonl").read_text().splitlines()][seen[-1] - 1]
    assert r.samples_per_second == last["samples_per_second"] > 0      # its partial measurement, kept
    assert r.mfu == pytest.approx(metrics.mfu(r.samples_per_second, spec().workload)) and r.objective is None


def test_study_name_cannot_escape_results(tmp_path):
    r = command(tmp_path, fixture_cmd("fake_trainer.py")).run(spec("../../etc"))
    assert r.status == Status.FAILED and "outside" in r.message
    assert not (tmp_path.parent.parent / "etc" / "0").exists()


def test_bad_options_are_usage_errors(tmp_path):
    from tuner.errors import UsageError
    with pytest.raises(UsageError, match="--command"):
        make_runner("command", command="  ")
    with pytest.raises(UsageError, match="--trial-timeout"):
        make_runner("command", command="true", trial_timeout=0)


# ---- the result contract: samples/s (or step time) in, every figure derived by tuner (issue 11) ----

def result_of(tmp_path, result: dict, **layout) -> tuple:
    trial = spec(**layout)
    r = command(tmp_path, fixture_cmd("write_result.py"), env={"FAKE_RESULT": json.dumps(result)}).run(trial)
    return r, trial


def test_a_result_with_only_tflops_is_failed_naming_the_key_and_the_file(tmp_path):
    r, _ = result_of(tmp_path, {"status": "ok", "tflops_per_gpu": 50.0, "peak_fraction": 0.3})
    assert r.status == Status.FAILED and r.objective is None and r.mfu is None
    assert "'samples_per_second'" in r.message and "'step_time_s'" in r.message
    assert str(tmp_path / "trials" / "s" / "0" / "result.json") in r.message


def test_step_time_is_converted_with_the_global_batch(tmp_path):
    r, trial = result_of(tmp_path, {"status": "ok", "step_time_s": 2.0, "peak_memory_gb": 3.0})
    assert r.status == Status.OK, r.message
    assert r.samples_per_second == trial.workload.global_batch / 2.0 == 8.0
    assert r.mfu == pytest.approx(metrics.mfu(8.0, trial.workload)) and r.objective == r.mfu


def test_a_results_own_tflops_and_peak_fraction_are_ignored(tmp_path):
    r, trial = result_of(tmp_path, {"status": "ok", "samples_per_second": 4.0, "tflops_per_gpu": 999.0,
                                    "peak_fraction": 0.99}, recompute="full")
    assert r.status == Status.OK, r.message
    assert r.tflops_per_gpu == pytest.approx(metrics.megatron_tflops(4.0, trial.workload, trial.layout))
    assert r.tflops_per_gpu != 999.0 and r.peak_fraction != 0.99
    assert r.mfu < r.peak_fraction        # Megatron's count includes the recompute: MFU does not


@pytest.mark.parametrize("result,words", [
    ({"status": "ok", "samples_per_second": -1.0}, "'samples_per_second' must be a finite number >= 0"),
    ({"status": "ok", "step_time_s": "fast"}, "'step_time_s' must be a finite number >= 0"),
    ({"status": "ok", "samples_per_second": 0}, "needs 'samples_per_second'"),
])
def test_bad_throughput_is_failed(tmp_path, result, words):
    r, _ = result_of(tmp_path, result)
    assert r.status == Status.FAILED and words in r.message


def test_oom_needs_no_throughput(tmp_path):
    r, _ = result_of(tmp_path, {"status": "oom", "peak_memory_gb": 80.0, "message": "CUDA out of memory"})
    assert r.status == Status.OOM and r.peak_memory_gb == 80.0 and r.objective is None


# ---- the store's secrets never reach a trial (issue 12, item 5) ---------------------------------

def test_trial_environment_withholds_the_stores_secrets(tmp_path, monkeypatch):
    import uuid
    from tuner.environment import withhold_url
    pw, given = f"Pw-{uuid.uuid4().hex}", f"Db-{uuid.uuid4().hex}"
    monkeypatch.setenv("TUNER_DB", f"postgresql+psycopg://bob:{pw}@db.example:5432/tuner")
    monkeypatch.setenv("DATABASE_URL", "postgresql://alice@h/x?password=other-secret")
    monkeypatch.setenv("PGPASSWORD", "pg-secret-value")
    monkeypatch.setenv("PGPASSFILE", "/home/bob/.pgpass")
    monkeypatch.setenv("MY_COPY_OF_THE_URL", f"user bob password {pw}")
    monkeypatch.setenv("OTHER_SECRET", "x-other-secret-x")
    monkeypatch.setenv("PG_AGAIN", "pg-secret-value")
    monkeypatch.setenv("FROM_DB_OPTION", f"prefix:{given}")
    monkeypatch.setenv("HARMLESS", "kept")
    withhold_url(f"postgresql://carol:{given}@h/x")    # what the CLI does with --db
    r = command(tmp_path, fixture_cmd("write_result.py")).run(spec())
    assert r.status == Status.OK, r.message
    d = tmp_path / "trials" / "s" / "0"
    env = json.loads((d / "environ.json").read_text())
    for name in ("TUNER_DB", "DATABASE_URL", "PGPASSWORD", "PGPASSFILE", "MY_COPY_OF_THE_URL", "OTHER_SECRET",
                 "PG_AGAIN", "FROM_DB_OPTION"):
        assert name not in env, name
    assert env["HARMLESS"] == "kept" and env["TUNER_TRIAL_DIR"] == str(d.resolve())
    for secret in (pw, given, "other-secret", "pg-secret-value", ".pgpass"):   # grep every file of the trial
        assert not [f for f in d.rglob("*") if f.is_file() and secret.encode() in f.read_bytes()], secret


def test_withheld_passwords_travel_with_a_pickled_runner(tmp_path):
    import pickle
    import uuid
    from tuner import environment
    pw = f"Pw-{uuid.uuid4().hex}"
    environment.withhold(pw)
    state = pickle.loads(pickle.dumps(command(tmp_path, "true"))).__dict__
    assert "_withheld" not in state
    blob = pickle.dumps(command(tmp_path, "true"))
    assert pw.encode() in blob                  # a Ray worker withholds them too


# ---- relative paths in the command mean the directory tuner was started from (issue 12, item 7) --

def _project(root: Path) -> Path:
    root.mkdir()
    (root / "train.py").write_text((FIXTURES / "write_result.py").read_text())
    (root / "data.txt").write_text("data")
    (root / "run.sh").write_text(f"#!/bin/sh\nexec {PY} \"$(dirname \"$0\")/train.py\" \"$@\"\n")
    (root / "run.sh").chmod(0o755)
    return root


@pytest.mark.parametrize("cmd", ["python train.py data.txt --config=data.txt out.txt -v",
                                 "./run.sh data.txt --config=data.txt out.txt -v",
                                 "python {root}/train.py data.txt --config=data.txt out.txt -v"])
def test_relative_and_absolute_scripts_run_from_the_start_directory(tmp_path, monkeypatch, cmd):
    root = _project(tmp_path / "proj")
    monkeypatch.chdir(root)
    r = command(tmp_path / "results", cmd.replace("python", PY, 1).format(root=root)).run(spec())
    assert r.status == Status.OK, r.message
    d = tmp_path / "results" / "trials" / "s" / "0"
    argv = json.loads((d / "argv.json").read_text())
    assert argv[0] == str(root / "train.py")
    assert argv[1:] == [str(root / "data.txt"), f"--config={root / 'data.txt'}", "out.txt", "-v"]
    env = json.loads((d / "environ.json").read_text())           # it ran in its trial directory
    assert env["TUNER_TRIAL_DIR"] == str(d.resolve()) and env["TUNER_START_DIR"] == str(root)


def test_a_relative_script_that_does_not_exist_is_named(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    r = command(tmp_path, "./no-such-script.sh").run(spec())
    assert r.status == Status.FAILED and str(tmp_path / "no-such-script.sh") in r.message


# --------------------------------------------------------------------------------------------
# The local runner's own rules (real DeepSpeed on CPU)
# --------------------------------------------------------------------------------------------

def test_local_runner_checks_the_device_count(tmp_path):
    _local_available()
    r = make_runner("local", gpus=2, results_dir=tmp_path).run(spec(gpus=4))
    assert r.status == Status.FAILED and "--gpus 4" in r.message and not (tmp_path / "trials").exists()
    from tuner.errors import UsageError
    with pytest.raises(UsageError, match="--gpus"):
        make_runner("local", gpus=0)
    with pytest.raises(UsageError, match="launchers: torchrun, deepspeed"):
        make_runner("local", gpus=1, launcher="mpirun")
    runner = make_runner("local", gpus=2, results_dir=tmp_path)
    runner.early_stop = len                       # the driver's multi-fidelity hook reaches the trials
    assert runner._cmd.early_stop is len


def test_a_killed_builds_stale_lock_is_removed_before_a_local_trial(tmp_path):
    """Issue 28: a first local trial killed while DeepSpeed builds its CPU op leaves torch's build lock,
    and every later build waits on it for ever; the local runner removes a lock older than any build."""
    import os
    import time

    from tuner.runners.local import STALE_BUILD_LOCK_S, clear_stale_build_locks
    stale = tmp_path / "py311_cpu" / "deepspeed_shm_comm" / "lock"
    fresh = tmp_path / "other_op" / "lock"
    for p in (stale, fresh):
        p.parent.mkdir(parents=True)
        p.write_text("")
    old = time.time() - STALE_BUILD_LOCK_S - 60
    os.utime(stale, (old, old))
    assert clear_stale_build_locks(tmp_path) == [stale]
    assert not stale.exists() and fresh.exists()      # a build running now keeps its lock
    assert clear_stale_build_locks(tmp_path / "missing") == []
