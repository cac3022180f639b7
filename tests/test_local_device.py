"""The local runner trains on what the cluster file says the GPUs are (task H's first-day find, session 16): on a
machine without CUDA, `tuner search --cluster h100 --runner local` ran its ranks on CPU cores and stored their step
times and OOMs as h100 measurements, which `tuner best --cluster h100` then read as "corrected by 1 measured trial".
A cluster file says device = "cpu" where its "GPUs" are CPU cores (local, local-slurm, a file `tuner calibrate`
wrote on CPUs); the runner trains there on CPU cores, and elsewhere only on CUDA devices."""

from __future__ import annotations

import dataclasses
import json

import pytest

import tuner.runners.local as local
from tests.test_runners import spec
from tuner.runners.slurm_jobs import Job
from tuner.runners.slurm_results import job_result
from tuner.trial import Status
from tuner.calibrate_fit import cluster_from_measurements
from tuner.cluster_spec import ClusterSpec
from tuner.errors import SpecError, UsageError
from tuner.specs import load_cluster


def test_a_gpu_cluster_on_a_machine_without_cuda_is_refused_naming_the_fix(monkeypatch):
    monkeypatch.setattr(local, "_detect_device", lambda device, gpus: "cpu")       # no CUDA device visible
    with pytest.raises(UsageError, match=r"on this machine's CPU cores .* measurements of 'h100' GPUs: .*--cluster local"):
        local.device_for(load_cluster("h100"), 8)
    monkeypatch.setattr(local, "_detect_device", lambda device, gpus: "cuda")      # a node with the GPUs
    assert local.device_for(load_cluster("h100"), 8) == "cuda"


def test_cpu_cluster_files_train_on_cpu_cores_even_where_cuda_is_visible(monkeypatch):
    monkeypatch.setattr(local, "_detect_device", lambda device, gpus: "cuda")
    for name in ("local", "local-slurm"):
        assert load_cluster(name).device == "cpu"
        assert local.device_for(load_cluster(name), 2) == "cpu"


def test_the_search_refuses_in_one_line_before_any_trial(tuner, monkeypatch):
    monkeypatch.setattr(local, "_detect_device", lambda device, gpus: "cpu")
    code, out, err = tuner("search", "--model", "tiny", "--cluster", "h100", "--nodes", "1", "--runner", "local",
                           "--budget", "1", "--study", "cpu-as-h100")
    assert code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, (code, err)
    assert "--cluster local" in err
    code, out, _ = tuner("trials", "cpu-as-h100")
    assert "ok" not in out and "oom" not in out                     # nothing stored as an h100 measurement


def test_device_is_checked_stored_only_when_given_and_written_by_calibrate():
    h100 = load_cluster("h100")
    assert h100.device is None and "device" not in h100.as_dict()          # stored studies read back the same
    assert ClusterSpec.from_dict(load_cluster("local").as_dict()).device == "cpu"
    with pytest.raises(SpecError, match="cluster key 'device' must be one of 'cpu', 'gpu'"):
        ClusterSpec.from_dict({**h100.as_dict(), "device": "tpu"})
    rank = {"matmul": [(256, 0.01), (1024, 0.05)], "copy_gbps": 10.0, "attention_tflops": 0.01, "baseline_gb": 0.3}
    m = {"ranks": [rank], "memory_gb": 8.0, "device": "cpu"}
    assert cluster_from_measurements(m, 1)["device"] == "cpu"
    assert "device" not in cluster_from_measurements({**m, "device": "cuda"}, 1)


def test_a_slurm_harness_run_on_cpu_cores_is_not_a_gpu_clusters_measurement(tmp_path):
    """The Slurm runner's harness trains on whatever its node shows: a node without CUDA (a CPU partition, a missing
    --gres) ran the trial on CPU cores, and its step time was stored as the GPU cluster's (the local runner's twin)."""
    ok = {"status": "ok", "samples_per_second": 2.0, "step_time_s": 1.0, "peak_memory_gb": 1.0, "device": "cpu"}
    (tmp_path / "result.json").write_text(json.dumps(ok))
    (tmp_path / "slurm-5.out").write_text("done\n")
    for cluster, status in (("frontier", Status.FAILED), ("local-slurm", Status.OK)):
        s = spec()
        c = dataclasses.replace(load_cluster(cluster), gpus_per_node=s.workload.cluster.gpus_per_node)
        s = dataclasses.replace(s, workload=dataclasses.replace(s.workload, cluster=c))
        r = job_result(s, Job(job_id="5", trial_dir=tmp_path, state="COMPLETED"), template="harness",
                       trial_timeout=None, warmup=1, peak_tflops=383.0)
        assert r.status == status, (cluster, r.message)
        assert ("trained on CPU cores" in r.message) == (status == Status.FAILED)
    (tmp_path / "result.json").write_text(json.dumps({**ok, "device": "cuda:0"}))
    r = job_result(spec(), Job(job_id="5", trial_dir=tmp_path, state="COMPLETED"), template="harness",
                   trial_timeout=None, warmup=1, peak_tflops=383.0)
    assert r.status == Status.OK
