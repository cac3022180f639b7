"""benchmarks/usable_capacity.py (issue 24): a preset's memory_gb against the bytes a PyTorch process can allocate on
that GPU (its total capacity in GiB, from published messages), and a benchmark run under that reading."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tuner.presets import presets
from tuner.specs import load_cluster

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import usable_capacity  # noqa: E402


def test_an_h100_holds_its_stated_total_capacity_in_bytes_not_its_nameplate():
    gb, source = usable_capacity.usable_gb(load_cluster("h100"))
    assert gb == pytest.approx(79.11 * 2 ** 30 / 1e9) and "79.11 GiB" in source and gb > 84.9


def test_every_gpu_preset_can_allocate_more_than_its_nameplate_reads_in_decimal_gb():
    for name in presets("clusters"):
        c = load_cluster(name)
        if c.name not in usable_capacity.LOCAL:
            assert c.memory_gb < usable_capacity.usable_gb(c)[0] < c.memory_gb * 2 ** 30 / 1e9


def test_a_missing_benchmark_is_one_line_and_exit_2():
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks/usable_capacity.py"), "no_such.py"],
                         capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1 and "no file" in out.stderr
