"""benchmarks/harness_gpu.py's launch of one trial: a trial that runs past --trial-timeout is killed with every
process it started -- torchrun's worker calls setsid, so killing torchrun alone left the worker holding the GPU
under the next trials (their memory and out-of-memory rows measured beside it)."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

psutil = pytest.importorskip("psutil")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import harness_gpu  # noqa: E402

FIXTURES = ROOT / "tests" / "fixtures"


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_a_timed_out_trial_leaves_nothing_running(tmp_path):
    # the fixture's child shares its group, its grandchild has a session of its own (as torchrun's worker); the
    # timeout leaves the fixture 8 s to start and spawn them on a busy machine
    env = {**os.environ, "TUNER_TRIAL_DIR": str(tmp_path)}
    tail, code = harness_gpu.launch([sys.executable, str(FIXTURES / "spawn_child_hang.py")], env, tmp_path, 8.0,
                                    cwd=tmp_path)
    assert code is None and tail.startswith("timed out after 8.0 s") and "spawned" in tail, tail
    pids = json.loads((tmp_path / "pids.json").read_text())
    time.sleep(0.5)
    assert not [name for name, pid in pids.items() if _running(pid)], pids


def test_a_trial_that_ends_returns_its_output_and_code(tmp_path):
    env = {**os.environ, "TUNER_TRIAL_DIR": str(tmp_path)}
    tail, code = harness_gpu.launch([sys.executable, "-c", "import sys; print('bye'); sys.exit(3)"], env, tmp_path,
                                    60.0, cwd=tmp_path)
    assert code == 3 and tail.strip() == "bye"
