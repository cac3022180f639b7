"""The host running out of memory is not the layout's OOM on GPUs (review of the OOM work, task I, session 16): a
dataloader's fork failing with ENOMEM ("Cannot allocate memory"), Python's MemoryError, std::bad_alloc or Slurm's
OUT_OF_MEMORY state (the job's cgroup: host memory) were stored as `oom`, so the guided searcher bounded the layout's
GPU memory at the GPUs' capacity and held back its neighbours, and `best` capped their p_fit. Where the ranks are CPU
cores (the cluster says device "cpu": local, local-slurm) the host's memory is theirs, and those stay OOMs."""

from __future__ import annotations

import dataclasses
import sys

import pytest

from tests.test_runners import spec
from tuner.runners.command import CommandRunner
from tuner.runners.slurm_jobs import Job
from tuner.runners.slurm_results import job_result
from tuner.specs import load_cluster
from tuner.trial import Status, looks_oom

FORK = "OSError: [Errno 12] Cannot allocate memory"         # a DataLoader worker's fork under the host's limit
CUDA = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."


def on(cluster: str, number: int = 0):
    """A trial of test_runners' spec on `cluster`'s GPUs (or CPU cores)."""
    s = spec(number=number)
    c = dataclasses.replace(load_cluster(cluster), gpus_per_node=s.workload.cluster.gpus_per_node)
    return dataclasses.replace(s, workload=dataclasses.replace(s.workload, cluster=c))


def test_the_markers_split_into_the_devices_and_the_hosts():
    for text in (FORK, "MemoryError", "terminate called after throwing an instance of 'std::bad_alloc'"):
        assert looks_oom(text) and looks_oom(text, host=True) and not looks_oom(text, host=False)
    assert looks_oom(CUDA, host=False) and looks_oom("hipErrorOutOfMemory", host=False)


@pytest.mark.parametrize("cluster, status", [("frontier", Status.FAILED), ("local", Status.OOM)])
def test_the_command_runner_stores_the_hosts_enomem_as_the_layouts_only_on_cpu_ranks(tmp_path, cluster, status):
    script = f"import sys; sys.stderr.write({FORK!r} + chr(10)); sys.exit(1)"
    r = CommandRunner([sys.executable, "-c", script], results_dir=tmp_path).run(on(cluster))
    assert r.status == status and "Cannot allocate memory" in r.message
    script = f"import sys; sys.stderr.write({CUDA!r} + chr(10)); sys.exit(1)"
    assert CommandRunner([sys.executable, "-c", script], results_dir=tmp_path).run(on(cluster, 1)).status == Status.OOM


@pytest.mark.parametrize("cluster, status", [("frontier", Status.FAILED), ("local-slurm", Status.OOM)])
def test_slurms_out_of_memory_state_is_the_hosts(tmp_path, cluster, status):
    job = Job(job_id="91", trial_dir=tmp_path, state="OUT_OF_MEMORY")
    (tmp_path / "slurm-91.out").write_text("slurmstepd: error: Detected 1 oom_kill event in StepId=91.0. Some of the "
                                           "step tasks have been OOM Killed.\n")
    r = job_result(on(cluster), job, template="harness", trial_timeout=None, warmup=1, peak_tflops=383.0)
    assert r.status == status and ("host memory" in r.message) == (status == Status.FAILED)
    job = Job(job_id="92", trial_dir=tmp_path, state="OUT_OF_MEMORY")     # the GPUs' OOM in its log: an OOM
    (tmp_path / "slurm-92.out").write_text(f"[rank0]: {CUDA}\n")
    assert job_result(on(cluster, 1), job, template="harness", trial_timeout=None, warmup=1,
                      peak_tflops=383.0).status == Status.OOM


def test_the_harness_rank_on_a_gpu_writes_failed_for_the_hosts_memory(monkeypatch):
    torch = pytest.importorskip("torch")
    from tuner.runners.harness.train import classify
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)       # CPU ranks: the host's memory is theirs
    assert classify(MemoryError()) == "oom" and classify(OSError(12, "Cannot allocate memory")) == "oom"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)        # a GPU rank
    assert classify(MemoryError()) == "failed" and classify(OSError(12, "Cannot allocate memory")) == "failed"
    assert classify(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB.")) == "oom"
    assert classify(RuntimeError(CUDA)) == "oom"


def test_a_runner_that_knows_its_ranks_are_cpu_cores_says_so(tmp_path):
    """The local runner knows where its ranks ran (its device), whatever the trial's cluster file says: on CPU cores
    the host's memory is theirs (the slow suite's RLIMIT_AS OOM of a CPU harness run on a GPU-described test cluster)."""
    script = f"import sys; sys.stderr.write({FORK!r} + chr(10)); sys.exit(1)"
    r = CommandRunner([sys.executable, "-c", script], results_dir=tmp_path, host_memory=True).run(on("frontier"))
    assert r.status == Status.OOM
    local = pytest.importorskip("tuner.runners.local")
    pytest.importorskip("deepspeed")
    assert local.LocalRunner(gpus=1, results_dir=tmp_path, device="cpu")._cmd.host_memory is True
