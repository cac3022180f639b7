"""Issue 26: GB200's and B300's GEMM fractions are B200's measured curve put on each part by the MAMF finder, which
measured all three the same way (workloads/clusters/gb200.toml [7], b300.toml [5]); the in-split rows' script never
predicts a held-out row."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tuner.specs import load_cluster

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

#: stas00/ml-engineering @ 744d01e compute/accelerator/README.md, MAMF as a share of each part's own dense peak (%)
MAMF = {"b200": (77.6, 76.3), "gb200": (72.9, 72.3), "b300": (78.6, 74.5)}


@pytest.mark.parametrize("name", ["gb200", "b300"])
def test_gemm_fractions_are_b200s_times_the_mamf_ratio(name):
    b200, c = load_cluster("b200"), load_cluster(name)
    bf16, fp8 = (mine / ref for mine, ref in zip(MAMF[name], MAMF["b200"]))
    assert c.matmul_efficiency == pytest.approx(b200.matmul_efficiency * bf16, abs=5e-4)
    assert c.matmul_efficiency_fp8 == pytest.approx(b200.matmul_efficiency_fp8 * fp8, abs=5e-4)
    assert c.matmul_efficiency_fp4 == b200.matmul_efficiency_fp4        # the finder has no FP4 row: B200's ESTIMATE


def test_gb200_gemms_run_at_the_finders_ratio_to_b200_not_the_datasheets():
    """GB200's best GEMM rate over B200's is the finder's 1.044 (bf16) / 1.053 (FP8), not the peaks' 1.11."""
    b200, gb200 = load_cluster("b200"), load_cluster("gb200")
    bf16 = gb200.peak_tflops * gb200.matmul_efficiency / (b200.peak_tflops * b200.matmul_efficiency)
    fp8 = gb200.peak_tflops_fp8 * gb200.matmul_efficiency_fp8 / (b200.peak_tflops_fp8 * b200.matmul_efficiency_fp8)
    assert bf16 == pytest.approx(1822.0 / 1745.0, abs=2e-3)
    assert fp8 == pytest.approx(3615.6 / 3432.5, abs=2e-3)


def test_gb300_keeps_b200s_fractions_without_a_measurement():
    b200, gb300 = load_cluster("b200"), load_cluster("gb300")
    assert (gb300.matmul_efficiency, gb300.matmul_efficiency_fp8) == (b200.matmul_efficiency,
                                                                      b200.matmul_efficiency_fp8)


def test_in_split_rows_never_hold_a_held_out_row():
    import in_split_rows
    import published
    rows = in_split_rows.in_split()
    assert rows and not any(published.held_out(r) for r in rows)
    assert {r["cluster"] for r in rows} == set(in_split_rows.BLACKWELL)
    held = [r for r in published.hardware() if r["cluster"] == "gb200" and published.held_out(r)]
    assert held and not any(r in rows for r in held)


def test_hopper_ratio_scales_the_blackwell_parts_only_and_only_inside_its_block():
    import in_split_rows
    import reading
    before = reading.load_cluster
    with in_split_rows.hopper_ratio():
        b200, h100 = reading.load_cluster("b200"), reading.load_cluster("h100")
    assert reading.load_cluster is before
    plain = load_cluster("b200")
    ratio = in_split_rows.HOPPER_RATIO
    assert b200.matmul_efficiency == pytest.approx(plain.matmul_efficiency * ratio["matmul"])
    assert b200.matmul_efficiency_fp4 == pytest.approx(plain.matmul_efficiency_fp4 * ratio["matmul"])
    assert b200.attention_efficiency == pytest.approx(plain.attention_efficiency * ratio["attention"])
    assert b200.memory_bandwidth_efficiency == pytest.approx(plain.memory_bandwidth_efficiency * ratio["hbm"])
    assert h100 == load_cluster("h100")


def test_gemm_scale_moves_only_the_blackwell_gemm_fractions_and_refuses_a_bad_factor():
    import subprocess
    import in_split_rows
    import reading
    before = reading.load_cluster
    with in_split_rows.scaled_rates(0.9):
        b200, h100 = reading.load_cluster("b200"), reading.load_cluster("h100")
    assert reading.load_cluster is before
    plain = load_cluster("b200")
    for key in ("matmul_efficiency", "matmul_efficiency_fp8", "matmul_efficiency_fp4"):
        assert getattr(b200, key) == pytest.approx(getattr(plain, key) * 0.9), key
    assert (b200.attention_efficiency, b200.memory_bandwidth_efficiency) == (
        plain.attention_efficiency, plain.memory_bandwidth_efficiency)
    assert h100 == load_cluster("h100")
    script = Path(in_split_rows.__file__)
    bad = subprocess.run([sys.executable, str(script), "--gemm-scale", "fast"], capture_output=True, text=True,
                         cwd=script.parents[1], timeout=60)
    assert bad.returncode == 2 and "--gemm-scale F" in bad.stderr
