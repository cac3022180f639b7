"""The Slurm runner against the real one-node Slurm that `.ci/start-slurm.sh` starts (no mocks).

Skips, with the reason, when Slurm's client commands are missing or no node answers. The local
Slurm has 2 CPUs, so each 2-task job takes the whole node and jobs queue behind each other; every
test is bounded by a pytest timeout and leaves the queue empty.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tuner.layout import Layout
from tuner.runners import make_runner
from tuner.specs import load_cluster, make_workload
from tuner.trial import Status, TrialSpec

sys.path.insert(0, str(Path(__file__).parent))
from test_runners import Case, TestRunnerContract, trial_processes  # noqa: E402,F401  (the shared contract)
from conftest import service_unavailable  # noqa: E402

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(240)]
FIXTURES = Path(__file__).parent / "fixtures"
PY = sys.executable
CLUSTER = load_cluster("local-slurm")


def _slurm_ready() -> str | None:
    for cmd in ("sinfo", "sbatch", "squeue", "scancel"):
        if shutil.which(cmd) is None:
            return f"Slurm's `{cmd}` is not on PATH: start a local Slurm with `.ci/start-slurm.sh` (as root)"
    try:
        p = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, timeout=15)
    except subprocess.TimeoutExpired:
        return "sinfo did not answer in 15 s: slurmctld is not running (`.ci/start-slurm.sh`)"
    states = p.stdout.split()
    if p.returncode != 0 or not any(s.rstrip("*~#") in ("idle", "mixed", "allocated", "completing")
                                    for s in states):
        return f"no Slurm node responds (sinfo: {(p.stdout + p.stderr).strip()[:200]}); run `.ci/start-slurm.sh`"
    return None


@pytest.fixture(scope="module", autouse=True)
def slurm():
    reason = _slurm_ready()
    if reason:
        service_unavailable("Slurm", reason)      # under CI (TUNER_CI=1): a failure, not a skip


def trial(study: str, number: int = 0, **layout) -> TrialSpec:
    w = make_workload("tiny", 1, CLUSTER, 16)
    return TrialSpec(study, number, Layout(**{"tp": 1, "pp": 1, "dp": 2, "micro_batch": 2, **layout}), w)


def runner(tmp_path, command=None, **kw):
    if command is not None:
        kw.update(template="command", command=command)
    return make_runner("slurm", cluster=CLUSTER, results_dir=tmp_path, poll_interval=0.5, **kw)


def queued(job_ids) -> list[str]:
    """Jobs of `job_ids` still pending or running."""
    p = subprocess.run(["squeue", "-h", "-j", ",".join(job_ids), "-o", "%i"], capture_output=True, text=True)
    return p.stdout.split()


def job_ids(tmp_path) -> list[str]:
    return [p.read_text().strip() for p in tmp_path.glob("trials/*/*/job_id")]


FAKE = [PY, str(FIXTURES / "fake_trainer.py")]
RANK_ENV = [PY, "-c", "import json, os\n"
            "keys = ('RANK', 'WORLD_SIZE', 'LOCAL_RANK', 'MASTER_ADDR', 'MASTER_PORT', 'TUNER_TP')\n"
            "open(os.environ['TUNER_TRIAL_DIR'] + '/rank%s.json' % os.environ['RANK'], 'w')"
            ".write(json.dumps({k: os.environ[k] for k in keys}))\n"
            "if os.environ['RANK'] == '0':\n"
            "    json.dump({'status': 'ok', 'tflops_per_gpu': 1.5, 'samples_per_second': 3.0},"
            " open(os.environ['TUNER_RESULT_JSON'], 'w'))\n"]


# ---- the shared runner contract -----------------------------------------------------------------
@pytest.fixture
def case() -> Case:
    def make(tmp, timeout):
        return runner(tmp, FAKE, trial_timeout=timeout)
    return Case(make=make, ok=trial("contract-ok"), bad=trial("contract-fail"), slow=trial("contract-hang"),
                timeout=3.0, cancel_after=2.0)


# ---- the harness, for real ----------------------------------------------------------------------
def test_harness_trial_through_sbatch(tmp_path):
    pytest.importorskip("deepspeed", reason="the harness needs pip install 'tuner[deepspeed]'")
    if not (Path(__file__).parents[1] / "tuner/runners/harness/train.py").exists():
        pytest.skip("the harness (tuner/runners/harness/train.py) has not landed")
    r = runner(tmp_path, trial_timeout=180)
    t = trial("harness", 3, tp=1, pp=1, dp=2, micro_batch=2)
    res = r.run(t)
    assert res.status == Status.OK, res.message
    assert res.tflops_per_gpu > 0 and res.samples_per_second > 0 and res.peak_memory_gb > 0
    assert res.peak_fraction == pytest.approx(res.tflops_per_gpu / CLUSTER.peak_tflops, rel=0.01)
    d = tmp_path / "trials" / "harness" / "3"
    assert json.loads((d / "trial.json").read_text()) == t.as_json()
    job = (d / "job_id").read_text().strip()
    assert f"slurm job {job}" in res.message and res.log_path == str((d / f"slurm-{job}.out").resolve())
    assert json.loads((d / "result.json").read_text())["world_size"] == 2
    assert queued([job]) == []


# ---- the command template: env, threads, failures -----------------------------------------------
def test_each_rank_gets_the_rendezvous_environment(tmp_path):
    res = runner(tmp_path, RANK_ENV).run(trial("env", 0, tp=2, dp=1))
    assert res.status == Status.OK and res.samples_per_second == 3.0, res.message
    d = tmp_path / "trials" / "env" / "0"
    ranks = [json.loads((d / f"rank{i}.json").read_text()) for i in (0, 1)]
    assert {r["RANK"] for r in ranks} == {"0", "1"} and {r["WORLD_SIZE"] for r in ranks} == {"2"}
    assert {r["LOCAL_RANK"] for r in ranks} == {"0", "1"} and ranks[0]["TUNER_TP"] == "2"
    assert ranks[0]["MASTER_ADDR"] == ranks[1]["MASTER_ADDR"] and ranks[0]["MASTER_PORT"].isdigit()


def test_runs_from_several_threads_share_one_poller(tmp_path):
    r = runner(tmp_path, FAKE)
    out = {}
    threads = [threading.Thread(target=lambda i=i: out.__setitem__(i, r.run(trial("par", i, micro_batch=1 + i))))
               for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    assert all(out[i].status == Status.OK for i in range(3)), out
    assert [out[i].samples_per_second for i in range(3)] == [11.0, 12.0, 13.0]
    assert len({out[i].message for i in range(3)}) == 3            # three jobs
    assert queued(job_ids(tmp_path)) == []


def test_a_crash_without_result_is_failed_with_the_log_tail(tmp_path):
    res = runner(tmp_path, FAKE).run(trial("crash-fail"))
    assert res.status == Status.FAILED and "something broke" in res.message and not res.retryable


def test_an_out_of_memory_message_is_oom(tmp_path):
    cmd = ["bash", "-c", "echo 'RuntimeError: CUDA out of memory. Tried to allocate 2 GiB' >&2; exit 1"]
    assert runner(tmp_path, cmd).run(trial("oom")).status == Status.OOM


# ---- cancellation, timeout, resume, node failure ------------------------------------------------
def wait_running(tmp_path, n: int = 1, limit: float = 60) -> list[str]:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        ids = job_ids(tmp_path)
        if len(ids) >= n:
            p = subprocess.run(["squeue", "-h", "-j", ",".join(ids), "-o", "%T"], capture_output=True, text=True)
            if p.stdout.split().count("RUNNING") >= 1:
                return ids
        time.sleep(0.3)
    raise AssertionError("job did not start")


def test_cancel_scancels_running_and_queued_jobs(tmp_path):
    r = runner(tmp_path, FAKE)
    out = []
    threads = [threading.Thread(target=lambda i=i: out.append(r.run(trial("cancel-hang", i)))) for i in range(2)]
    for t in threads:
        t.start()
    ids = wait_running(tmp_path, 2)                 # one runs, the other queues behind it
    r.cancel()
    for t in threads:
        t.join(30)
    assert [o.status for o in out] == [Status.INTERRUPTED] * 2, out
    assert queued(ids) == []
    assert trial_processes(tmp_path) == []


def test_runner_side_timeout_cancels_the_job(tmp_path):
    res = runner(tmp_path, FAKE, trial_timeout=2).run(trial("timeout-hang"))    # the job never ends by itself
    assert res.status == Status.TIMEOUT and "--trial-timeout" in res.message
    assert queued(job_ids(tmp_path)) == []


def test_resume_cancels_the_jobs_an_interrupted_driver_left(tmp_path):
    first = runner(tmp_path, FAKE)                  # the driver that "dies" with a job running
    out = []
    th = threading.Thread(target=lambda: out.append(first.run(trial("resume-hang", 4))))
    th.start()
    ids = wait_running(tmp_path)
    again = runner(tmp_path, FAKE)                  # the resumed driver
    assert again.job_ids_for("resume-hang") == ids
    assert again.cancel_study_jobs("resume-hang") == ids
    th.join(30)
    assert out[0].status == Status.INTERRUPTED and "outside tuner" in out[0].message
    assert queued(ids) == [] and again.cancel_study_jobs("resume-hang") == []


def test_node_failure_is_resubmitted_once(tmp_path):
    node = subprocess.run(["sinfo", "-h", "-N", "-o", "%N"], capture_output=True, text=True).stdout.split()[0]
    marker = tmp_path / "trials" / "node-down" / "first"
    cmd = ["bash", "-c", "if [ -e ../first ]; then exec \"$@\"; fi; touch ../first; sleep 300", "x", *FAKE]
    r = runner(tmp_path, cmd)
    out = []
    th = threading.Thread(target=lambda: out.append(r.run(trial("node-down", 0))))
    th.start()
    try:
        ids = wait_running(tmp_path)
        deadline = time.monotonic() + 30
        while not marker.exists() and time.monotonic() < deadline:   # the first attempt is in its sleep
            time.sleep(0.2)
        subprocess.run(["scontrol", "update", f"NodeName={node}", "State=DOWN", "Reason=tuner-test"], check=True)
        th.join(90)
    finally:
        # Back in service (slurmd answering usually does it at once), and nothing left running.
        subprocess.run(["scontrol", "update", f"NodeName={node}", "State=RESUME"], capture_output=True)
        r.cancel()
        th.join(30)
    assert out and out[0].status == Status.OK, out
    second = (tmp_path / "trials" / "node-down" / "0" / "job_id").read_text().strip()
    assert second != ids[0] and f"slurm job {ids[0]},{second}" in out[0].message
    assert queued([ids[0], second]) == []


# ---- the megatron template (a stand-in pretrain_gpt.py that prints Megatron's log lines) --------
def megatron_runner(tmp_path, **env):
    table = {**CLUSTER.slurm, "megatron_dir": str(FIXTURES / "megatron"), "iterations": 4,
             "env": {**CLUSTER.slurm["env"], **env}}
    import dataclasses
    return make_runner("slurm", cluster=dataclasses.replace(CLUSTER, slurm=table), template="megatron",
                       results_dir=tmp_path, poll_interval=0.5)


def test_megatron_template_parses_the_log(tmp_path):
    res = megatron_runner(tmp_path).run(trial("megatron", 0, tp=2, dp=1, micro_batch=4))
    assert res.status == Status.OK, res.message
    assert res.tflops_per_gpu > 0 and res.samples_per_second > 0
    assert "median of 3 iterations" in res.message and "recomputed" not in res.message


def test_megatron_tflops_counting_phantom_samples_are_flagged(tmp_path):
    res = megatron_runner(tmp_path, FAKE_TFLOPS_FACTOR="4").run(trial("megatron-bug", 0))
    assert res.status == Status.OK, res.message
    assert "recomputed from samples processed" in res.message and "(4.00x)" in res.message


def test_early_stop_scancels_a_clearly_worse_job_and_keeps_its_partial_measurement(tmp_path):
    r = runner(tmp_path, [PY, str(FIXTURES / "progress_trainer.py")])
    r.early_stop = lambda progress: len(progress) >= 3      # the driver's hook: clearly worse after warm-up
    res = r.run(trial("early-stop", tp=2, dp=1))
    assert res.status == Status.STOPPED and "stopped early" in res.message, res
    assert res.samples_per_second == 1.0                     # the fixture's throughput at tp=2
    assert not list(tmp_path.glob("trials/early-stop/*/result.json"))   # cut before it finished
    assert queued(job_ids(tmp_path)) == []
