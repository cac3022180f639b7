"""The executor contract, run against every executor: inline, thread, and Ray (a private Ray on loopback).

An executor takes `submit(runner, trial)` and returns a future of the runner's TrialResult; a runner's
failure comes back as a result and a runner's bug (an exception) out of the future; a trial the driver
stops (runner.cancel(), then executor.shutdown()) comes back INTERRUPTED; and the runner's `early_stop`
hook reaches the trial wherever it runs, answering from the driver's live state (a Ray worker asks the
driver through tuner.executors.ray's relay). The runner contract is TestRunnerContract in
tests/test_runners.py. No mocks: real runners, real processes, a real Ray.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import threading
from pathlib import Path

import pytest

from tuner.driver import Driver
from tuner.executors import InlineExecutor, ThreadExecutor
from tuner.layout import Layout
from tuner.runners import make_runner
from tuner.search import make_searcher
from tuner.space import SearchSpace
from tuner.specs import make_workload
from tuner.store import StudyRecord, open_store
from tuner.trial import Status, TrialSpec

FIXTURES = Path(__file__).parent / "fixtures"
HAS_RAY = importlib.util.find_spec("ray") is not None
LOOPBACK_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_AUTH_MODE": "disabled",
                "RAY_USAGE_STATS_ENABLED": "0"}
HANG_GUARD = 120       # seconds: a bound on a wait that ends by itself, not a timing


def fixture_cmd(name: str) -> str:
    return f"{sys.executable} {FIXTURES / name}"


@pytest.fixture(scope="module")
def ray_session():
    """One private Ray on loopback for the module (see tests/test_ray.py for the loopback rules); each
    RayExecutor joins it, so its shutdown leaves the session up for the next test."""
    with pytest.MonkeyPatch.context() as mp:
        for k, v in LOOPBACK_ENV.items():
            mp.setenv(k, v)
        from tuner.executors.ray import _import_ray
        ray = _import_ray(local=True)
        ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False, logging_level="WARNING")
        try:
            yield ray
        finally:
            ray.shutdown()


EXECUTORS = ["inline", "thread",
             pytest.param("ray", marks=[pytest.mark.ray, pytest.mark.timeout(300),
                                        pytest.mark.skipif(not HAS_RAY, reason="ray is not installed: "
                                                           "pip install 'tuner[ray]'")])]


@pytest.fixture(params=EXECUTORS)
def executor(request):
    if request.param == "inline":
        ex = InlineExecutor()
    elif request.param == "thread":
        ex = ThreadExecutor(2)
    else:
        request.getfixturevalue("ray_session")
        from tuner.executors.ray import RayExecutor
        ex = RayExecutor(parallel=2)
    yield ex
    ex.shutdown()


def workload():
    return make_workload("tiny", 1, "local")       # 2 "GPUs"


def trial(study: str, number: int = 0, tp: int = 1, results: Path | None = None) -> TrialSpec:
    w = workload()
    d = results / "trials" / study / str(number) if results else None
    return TrialSpec(study, number, Layout(tp=tp, pp=1, dp=2 // tp, micro_batch=1), w, d)


class TestExecutorContract:
    def test_submit_returns_a_future_of_each_result(self, executor):
        futs = [executor.submit(make_runner("sim"), trial("ok", i)) for i in range(3)]
        results = [f.result(HANG_GUARD) for f in futs]
        assert [r.status for r in results] == [Status.OK] * 3 and all(r.samples_per_second > 0 for r in results)

    def test_a_trials_failure_is_a_result(self, executor, tmp_path):
        runner = make_runner("command", command=fixture_cmd("fake_trainer.py"), results_dir=tmp_path)
        r = executor.submit(runner, trial("contract-fail", results=tmp_path)).result(HANG_GUARD)
        assert r.status == Status.FAILED and "exit status 3" in r.message, r

    def test_a_runners_bug_comes_out_of_the_future(self, executor):
        broken = TrialSpec("bug", 0, trial("bug").layout, None)    # no workload: the simulator raises
        fut = executor.submit(make_runner("sim"), broken)
        with pytest.raises(AttributeError):
            fut.result(HANG_GUARD)

    def test_a_stopped_study_interrupts_its_running_trials(self, executor):
        """What the driver does on Ctrl-C: cancel the runner, shut the executor down."""
        runner = make_runner("sim", delay=600)            # would wait ten minutes and succeed
        stop = threading.Timer(1.0, lambda: (runner.cancel(), executor.shutdown()))
        stop.start()                                      # the inline executor's submit blocks until then
        try:
            fut = executor.submit(runner, trial("stop"))
            assert fut.result(HANG_GUARD).status == Status.INTERRUPTED
        finally:
            stop.cancel()

    def test_early_stop_reaches_the_trial_and_answers_live(self, executor, tmp_path):
        """The hook is the driver's: its answer changes after the trial started (as the best so far does),
        and the trial, wherever it runs, is stopped by the new answer."""
        asked = threading.Event()
        worse = threading.Event()

        def hook(progress):
            asked.set()                                   # the driver was asked about this running trial
            return worse.is_set() and len(progress) >= 2

        def verdict():
            if asked.wait(HANG_GUARD):
                worse.set()

        runner = make_runner("command", command=fixture_cmd("fake_trainer.py"), results_dir=tmp_path,
                             env={"FAKE_STEPS": "100", "FAKE_STEP_SECONDS": "0.1"}, poll_interval=0.1)
        runner.early_stop = hook
        judge = threading.Thread(target=verdict, daemon=True)
        judge.start()
        r = executor.submit(runner, trial("progress", results=tmp_path)).result(HANG_GUARD)
        assert r.status == Status.STOPPED and "stopped early" in r.message, r
        assert r.samples_per_second >= 10.0                                 # its partial measurement
        lines = (tmp_path / "trials" / "progress" / "0" / "progress.jsonl").read_text().splitlines()
        assert 2 <= len(lines) < 100 and not (tmp_path / "trials" / "progress" / "0" / "result.json").exists()


def test_driver_early_stop_through_each_executor(executor, tmp_path):
    """`--early-stop 0.5` end to end: the fast layout (tp=1, 10 samples/s) finishes, the slow one (tp=2,
    1 sample/s) is stopped after its warm-up step and keeps its partial measurement -- under Ray too,
    where the driver's hook does not travel with the pickled runner."""
    w = workload()
    sp = SearchSpace.from_dict({"dimensions": {"tp": [1, 2], "pp": [1], "micro_batch": [1], "zero_stage": [0],
                                               "activation_checkpointing": [False]}})
    store = open_store(f"sqlite:///{tmp_path / 'd.db'}")
    store.create_study(StudyRecord(name="es", workload=w.as_dict(), space={}, searcher="grid", runner="command"))
    runner = make_runner("command", command=fixture_cmd("progress_trainer.py"), results_dir=tmp_path,
                         trial_timeout=60, poll_interval=0.1)
    d = Driver(store=store, study="es", workload=w, runner=runner, executor=executor,
               searcher=make_searcher("grid", sp.enumerate_layouts(w)), budget=5, results_dir=tmp_path,
               early_stop=0.5, prune=False)
    out = d.run()
    assert out.reason == "exhausted" and out.ran == 2
    by_tp = {t.layout.tp: t for t in store.trials("es")}
    assert by_tp[1].status == Status.OK and by_tp[1].samples_per_second == 10.0
    slow = by_tp[2]
    assert slow.status == Status.STOPPED and "stopped early" in slow.message, slow.message
    assert slow.samples_per_second == 1.0                   # the partial measurement is kept
    lines = [json.loads(x) for x in (Path(slow.log_path) / "progress.jsonl").read_text().splitlines()]
    assert 2 <= len(lines) < 12                             # stopped after warm-up, before the end
