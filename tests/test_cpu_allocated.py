"""A CPU rank's measured peak is its tensors' allocated bytes (tuner/runners/harness/allocated.py), as a GPU's is
max_memory_allocated -- not the process's resident set, which held the interpreter and libraries and missed every
buffer allocated but never touched: DeepSpeed's ZeRO 1 / 2 gradient-reduction bucket (reduce_bucket_size, 5e8
elements by default, bf16: 1.0 GB) is allocated in each backward whatever the model's size."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[1]
TINY = {"name": "tiny", "num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "seq_length": 32,
        "vocab_size": 128, "global_batch": 4}
BUCKET_GB = 5e8 * 2 / 1e9         # DeepSpeed's default reduce_bucket_size in bf16


COUNT = """
import torch
from tuner.runners.harness.allocated import CpuAllocated
before = torch.ones(4_000_000)                    # 16 MB allocated before the start: not counted
counter = CpuAllocated()
assert counter.stop_gb() is None                  # never started: nothing read
counter.start()
a = torch.ones(10_000_000)                        # 40 MB
b = a * 2                                         # 40 MB more, both alive
del a, b
c = torch.ones(1_000_000)                         # 4 MB after the peak
print(counter.stop_gb())
assert counter.stop_gb() is None                  # stopped once
"""


def test_counts_the_tensors_allocated_while_it_runs():
    # in a process of its own: the profiler's count is process-wide and carries over between its sessions
    out = subprocess.run([sys.executable, "-c", COUNT], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr[-2000:]
    peak = float(out.stdout.strip().splitlines()[-1])
    assert 0.080 <= peak < 0.085, peak


def run_harness(tmp: Path, zero: int) -> dict:
    layout = {"tp": 1, "pp": 1, "dp": 1, "micro_batch": 2, "zero_stage": zero, "recompute": "none"}
    d = tmp / f"z{zero}"
    d.mkdir()
    trial = {"layout": layout, "model": TINY, "cluster": "local", "nodes": 1, "gpus": 1, "global_batch": 4,
             "study": "test", "trial": zero}
    (d / "trial.json").write_text(json.dumps(trial))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TUNER_TRIAL_JSON": str(d / "trial.json"),
           "TUNER_RESULT_JSON": str(d / "result.json"), "TUNER_TRIAL_DIR": str(d), "TUNER_WARMUP_STEPS": "1",
           "TUNER_STEPS": "1", "TUNER_DTYPE": "bf16", "OMP_NUM_THREADS": "1", "TUNER_COLLECTIVE_TIMEOUT_S": "120",
           "CUDA_VISIBLE_DEVICES": "", "DS_ACCELERATOR": "cpu"}       # a CPU rank on a GPU machine too, as local.py
    torchrun = shutil.which("torchrun") or "torchrun"
    proc = subprocess.run([torchrun, "--standalone", "--nproc_per_node", "1", "-m", "tuner.runners.harness.train"],
                          cwd=d, env=env, capture_output=True, text=True, timeout=600, start_new_session=True)
    assert (d / "result.json").exists(), proc.stderr[-3000:]
    return json.loads((d / "result.json").read_text())


def test_the_harness_on_cpu_reports_allocated_bytes(tmp_path):
    pytest.importorskip("deepspeed")
    if sys.platform != "linux":
        pytest.skip("the harness's CPU ranks run on Linux")
    z1 = run_harness(tmp_path, 1)
    assert z1["status"] == "ok" and z1["device"] == "cpu", (z1.get("message"), z1.get("device"))
    # a tiny model's states and activations are a few MB beside DeepSpeed's bucket, which is allocated but never
    # touched whole, so never resident: the resident set (interpreter and libraries included) stays below it
    assert BUCKET_GB <= z1["peak_memory_gb"] < BUCKET_GB + 0.05
    assert 0.05 < z1["host_rss_gb"] < BUCKET_GB
