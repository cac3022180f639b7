"""A CPU harness run's failed / oom result says its device too (reliability task D, item 5; ec95d73 left it): the
harness wrote `device` only on an ok result, so slurm_results.cpu_run refused only those. A job on a node without CUDA
(a CPU partition, a missing --gres) whose rank ran out of the host's memory wrote {"status": "oom"} -- on CPU ranks the
host's memory is theirs (harness.classify) -- and the OOM was stored as the GPU cluster's: the guided searcher bounded
the layout's GPU memory by it and held back its neighbours. Now every result names its device, and an oom (or any
result) from CPU cores on a cluster that describes GPUs is `failed` with cpu_run's message; on a CPU cluster
(local-slurm) it stays an oom."""

from __future__ import annotations

import dataclasses
import json
import types

import pytest

from tests.test_runners import spec
from tuner.runners.slurm_jobs import Job
from tuner.runners.slurm_results import job_result
from tuner.specs import load_cluster
from tuner.trial import Status

torch = pytest.importorskip("torch")
harness = pytest.importorskip("tuner.runners.harness.train")

def on(cluster: str):
    s = spec()
    c = dataclasses.replace(load_cluster(cluster), gpus_per_node=s.workload.cluster.gpus_per_node)
    return dataclasses.replace(s, workload=dataclasses.replace(s.workload, cluster=c))


def harness_failure(monkeypatch, tmp_path, exc: BaseException) -> dict:
    """The result.json the harness's main() writes on a node without CUDA when training raises `exc`."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setitem(__import__("sys").modules, "deepspeed", types.SimpleNamespace(init_distributed=lambda **k: None))

    def fails(*a, **k):
        raise exc
    monkeypatch.setattr(harness, "train", fails)
    (tmp_path / "trial.json").write_text("{}")
    for k, v in {"TUNER_TRIAL_JSON": tmp_path / "trial.json", "TUNER_RESULT_JSON": tmp_path / "result.json",
                 "TUNER_TRIAL_DIR": tmp_path, "DS_ACCELERATOR": "cpu", "RANK": "0", "LOCAL_RANK": "0"}.items():
        monkeypatch.setenv(k, str(v))
    assert harness.main() == 1
    return json.loads((tmp_path / "result.json").read_text())


def test_a_cpu_ranks_oom_is_not_a_gpu_clusters(monkeypatch, tmp_path):
    result = harness_failure(monkeypatch, tmp_path, MemoryError("cannot allocate 2 GiB"))
    assert result["status"] == "oom" and result["device"] == "cpu"
    (tmp_path / "slurm-7.out").write_text("[rank 0] trial oom: MemoryError: cannot allocate 2 GiB\n")
    for cluster, status in (("frontier", Status.FAILED), ("local-slurm", Status.OOM)):
        for job in (Job(job_id="7", trial_dir=tmp_path, state="FAILED"),
                    Job(job_id="7", trial_dir=tmp_path, state="CANCELLED", reason="timeout")):
            r = job_result(on(cluster), job, template="harness", trial_timeout=600, warmup=1, peak_tflops=383.0)
            assert r.status == status, (cluster, job.reason, r.message)
            assert ("trained on CPU cores" in r.message) == (status == Status.FAILED), r.message


def test_every_harness_result_names_its_device(monkeypatch, tmp_path):
    result = harness_failure(monkeypatch, tmp_path, RuntimeError("the model exploded"))
    assert result["status"] == "failed" and result["device"] == "cpu" and "exploded" in result["message"]
