"""benchmarks/mlperf_steps.py (issue 26 round 2): MLPerf result logs read as mlperf_common writes them, and the
model's forward of a row at its components' forward shares."""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


sys.path.insert(0, str(ROOT / "benchmarks"))
import mlperf_steps as mod  # noqa: E402


def _line(value: dict, **meta) -> str:
    return ":::MLLOG " + json.dumps({"namespace": "", "time_ms": 1, "event_type": "POINT_IN_TIME",
                                     "key": "tracked_stats", "value": value, "metadata": meta})


def test_log_lines_and_the_validation_set_up_step(tmp_path):
    text = "\n".join([_line({"train_step_time": 0.09, "reduced_train_loss": 7.0}, step=31.0),
                      _line({"train_step_time": 0.0917}, samples_count=12288),          # a block mean: not a step
                      _line({"validation_step_time": 0.25}, step=0),                     # the pass's set-up
                      _line({"validation_step_time": 0.022}, step=1),
                      _line({"validation_step_time": 0.24}, step=16),                    # the next pass's set-up
                      _line({"validation_step_time": 0.021}, step=17),
                      ':::MLLOG {"key": "cache_clear", "value": true}'])
    assert mod.step_times(text) == ([0.09], [0.022, 0.021])
    folder = tmp_path / "NVIDIA" / "results" / "x" / "llama31_8b"
    folder.mkdir(parents=True)
    (folder / "result_0.txt").write_text(text)
    logs = mod.Logs(tmp_path)
    assert logs.listing("NVIDIA/results/x/llama31_8b") == ["NVIDIA/results/x/llama31_8b/result_0.txt"]


def test_the_forward_is_a_third_of_a_step_without_recompute():
    got = mod.rows()
    assert got and all("training_results_v5.1" in r["source"] and r["model"] == "llama3-8b" for r in got)
    step, fwd, comp = mod.model_forward(next(r for r in got if r["cluster"] == "gb200" and r["gpus"] == 72))
    assert comp < step and 3.0 < comp / fwd < 3.5       # backward 2x the GEMMs and traffic, 2.5x the attention


def test_a_missing_checkout_is_one_line(capsys):
    assert mod.main(["/nonexistent/training_results_v5.1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "mlcommons/training_results_v5.1" in err
