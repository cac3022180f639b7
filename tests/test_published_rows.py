"""benchmarks/data/llama_published.toml (issue 14, item 6): published, measured Llama-class throughputs.
Checks the data, not the model's accuracy: every row parses, names its source and release, and has a
layout the model accepts for its workload (or is marked as refused, truthfully), and the prediction is
a finite, positive throughput. No accuracy threshold here: benchmarks/model_accuracy.py prints that."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest

from tuner.layout import why_invalid
from tuner.specs import load_cluster

ROOT = Path(__file__).resolve().parents[1]


def _module():
    spec = importlib.util.spec_from_file_location("llama_accuracy", ROOT / "benchmarks" / "llama_accuracy.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


LA = _module()
ROWS = LA.load_rows()


def _id(row):
    return f"{row['model']}-{row['gpus']}-{row['precision']}-{row['release'].split(',')[0].replace(' ', '_')}"


def test_rows_parse_and_cite_their_source():
    assert len(ROWS) >= 15
    for r in ROWS:
        assert r["source"].strip() and r["release"].strip() and r["note"].strip()
        assert r["precision"] in ("bf16", "fp8")
        assert r["tokens_per_s_per_gpu"] > 0
        for k in ("sequence_parallel", "distributed_optimizer"):
            assert isinstance(r[k], bool) or r[k] == LA.UNSTATED, (k, r[k])
        assert r["recompute"] in ("none", "selective", "full", LA.UNSTATED)
        assert r["gpus"] % (r["tp"] * r["cp"] * r["pp"]) == 0
    assert len({r["source"].split(" @ ")[0].split()[0] for r in ROWS}) >= 2      # two or more repositories


@pytest.mark.parametrize("row", ROWS, ids=[_id(r) for r in ROWS])
def test_row_layout_is_valid_and_predicts_a_finite_throughput(row):
    layout, w = LA.layout_of(row), None
    if row["precision"] == "fp8" and not getattr(load_cluster(row["cluster"]), "peak_tflops_fp8", None):
        pytest.skip(f"{row['cluster']}.toml has no peak_tflops_fp8 yet: no FP8 workload can be made")
    w = LA.workload_of(row)
    bad = why_invalid(layout, w)
    if row.get("model_refuses"):
        assert bad, "marked model_refuses but the model accepts the layout: drop the mark"
        return
    assert bad is None, bad
    e = LA.evaluate(row)
    assert e["refused"] is None
    assert math.isfinite(e["tokens_per_s_per_gpu"]) and e["tokens_per_s_per_gpu"] > 0
    assert math.isfinite(e["memory_gb"]) and e["memory_gb"] > 0
