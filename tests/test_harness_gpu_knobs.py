"""The harness's GPU-side knobs, checked without a GPU: TUNER_TORCH_ADAM (PyTorch's Adam where DeepSpeed could not
build its FusedAdam kernel) and the device-use figures a GPU result carries (benchmarks/harness_gpu.py reads them)."""

from __future__ import annotations

import pytest

harness = pytest.importorskip("tuner.runners.harness.train")
torch = pytest.importorskip("torch")

from tuner.layout import Layout  # noqa: E402
from tuner.specs import make_workload  # noqa: E402

LAYOUT = Layout(tp=1, pp=1, dp=1, micro_batch=1, zero_stage=0, recompute="none")


def _config(monkeypatch, device: str, torch_adam: str | None) -> dict:
    if torch_adam is None:
        monkeypatch.delenv("TUNER_TORCH_ADAM", raising=False)
    else:
        monkeypatch.setenv("TUNER_TORCH_ADAM", torch_adam)
    monkeypatch.delenv("TUNER_OPTIMIZER", raising=False)
    w = make_workload("tiny", 1, "local", global_batch=4)
    return harness.ds_config(LAYOUT, w, "bf16", torch.device(device))


def test_gpu_ranks_use_fused_adam_unless_told_otherwise(monkeypatch):
    assert "torch_adam" not in _config(monkeypatch, "cuda", None)["optimizer"]["params"]
    assert "torch_adam" not in _config(monkeypatch, "cuda", "0")["optimizer"]["params"]
    assert _config(monkeypatch, "cuda", "1")["optimizer"]["params"]["torch_adam"] is True


def test_cpu_ranks_always_use_torch_adam(monkeypatch):
    assert _config(monkeypatch, "cpu", None)["optimizer"]["params"]["torch_adam"] is True


def test_device_use_is_read_only_on_a_gpu():
    assert harness.device_used_gb(torch.device("cpu")) == {}
