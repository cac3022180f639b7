"""Issue 25: benchmarks/fp8_split.py groups the in-split Megatron-Core low-precision rows by what could carry an
FP8-only mechanism; it never predicts a held-out row, reads each row's FP8 recipe from its note, pairs rows that differ
only in precision, and its --cast-scale what-if changes the casts' traffic only inside its block."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))


def test_no_held_out_row_is_ever_predicted(monkeypatch, capsys):
    import fp8_split
    import framework_accuracy
    import published
    seen, real = [], fp8_split.hardware_accuracy.evaluate
    monkeypatch.setattr(fp8_split.hardware_accuracy, "evaluate", lambda r: seen.append(r) or real(r))
    fp8_split.main()
    assert "held-out rows skipped before prediction" in capsys.readouterr().out
    mine = [r for r in framework_accuracy.load_rows() if r["framework"] == "megatron-core"]
    assert any(published.held_out(r) for r in mine)               # there were held-out rows to skip
    assert seen and not any(published.held_out(r) for r in seen)
    assert len(seen) == sum(not published.held_out(r) for r in mine)


@pytest.mark.parametrize("precision, note, want", [
    ("fp8", "FP8=True, FP8_HYBRID=True, FP8_RECIPE=tensorwise (per-tensor current scaling)", "fp8 tensorwise"),
    ("fp8", "no activation recompute; FP8 current scaling ('FP8-CS')", "fp8 tensorwise"),
    ("fp8", "config_fp8.sh: FP8=True, FP8_HYBRID=True", "fp8 delayed"),
    ("fp8", "table states FP8, DGX-H100, GBS/MBS", "fp8 unstated"),
    ("mxfp8", "FP8 current scaling", "mxfp8"),
])
def test_the_recipe_is_read_from_the_note(precision, note, want):
    import fp8_split
    assert fp8_split.recipe({"precision": precision, "note": note}) == want


def test_pairs_differ_only_in_precision():
    import fp8_split
    base = {"framework": "megatron-core", "model": "llama3-8b", "cluster": "h100", "gpus": 8, "seq_length": 8192,
            "global_batch": 128, "micro_batch": 1, "tp": 1, "pp": 1, "cp": 2, "vp": 1, "sequence_parallel": False,
            "recompute": "none"}
    fp8, bf16 = {**base, "precision": "fp8"}, {**base, "precision": "bf16"}
    other = {**base, "precision": "bf16", "gpus": 16}
    done = [(fp8, {"e": 1}), (bf16, {"e": 2}), (other, {"e": 3})]
    assert fp8_split.pairs(done) == [((fp8, {"e": 1}), (bf16, {"e": 2}))]


def test_cast_scale_moves_the_casts_only_inside_its_block():
    import fp8_split
    from tuner.perfmodel import compute
    from tuner.frameworks import of
    from tuner.specs import make_workload
    w = make_workload("llama3-8b", 1, "h100", 128, precision="fp8", seq_length=8192)
    before = compute.cast_units("fp8", of(w), w.cluster)
    with fp8_split.cast_scaled(0.5):
        assert compute.cast_units("fp8", of(w), w.cluster) == pytest.approx(0.5 * before)
    assert compute.cast_units("fp8", of(w), w.cluster) == before


def test_a_bad_option_is_refused_with_exit_2():
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "fp8_split.py"), "--cast-scale", "x"],
                         capture_output=True, text=True)
    assert out.returncode == 2 and "--cast-scale needs a factor" in out.stderr


def test_the_models_ratio_of_an_moe_row_uses_the_exchange_its_prediction_used():
    """An MoE row is predicted with its config's token exchange (hardware_accuracy.evaluate): its bf16 twin must be
    too, or the ratio compares two exchanges (a Qwen3-235B row read 0.59 so, where its step times differ by 10 %)."""
    import fp8_split
    import published
    import reading
    row = next(r for r in published.published() if r["framework"] == "megatron-core" and not published.held_out(r)
               and r.get("ep", 1) > 1 and r["precision"] == "fp8" and r["model"].startswith("qwen3-235b"))
    e, eb = (fp8_split.hardware_accuracy.evaluate(x) for x in (row, {**row, "precision": "bf16"}))
    ratio = fp8_split.bf16_speedup(row, reading.layout_of(row), reading.workload_of(row), e["pred"])
    assert ratio == pytest.approx(e["pred"] / eb["pred"], rel=1e-9)
    assert 1.0 < ratio < 1.3
