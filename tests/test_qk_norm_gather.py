"""benchmarks/reading.qk_norm_gather_s (issue 25): torchtitan's Qwen3 tensor-parallel plan before pytorch/torchtitan #1870
gathered q and k at q_norm / k_norm; a row that ran it (`ran_qk_norm = "gathered"`) is predicted with those seconds."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import framework_accuracy  # noqa: E402
import published  # noqa: E402
import reading  # noqa: E402


def _gathered_rows() -> list[dict]:
    return [r for r in framework_accuracy.load_rows() if r.get("ran_qk_norm")]


def test_only_torchtitans_qwen3_tp_rows_before_the_fix_state_it():
    rows = _gathered_rows()
    assert len(rows) == 4
    for r in rows:
        assert r["framework"] == "torchtitan" and r["tp"] > 1 and "d66b72a6" in r["release"], r["release"]
        assert r["ran_qk_norm"] in reading.QK_NORM_READINGS


def test_the_reading_moves_no_row_across_the_split():
    for r in _gathered_rows():
        bare = {k: v for k, v in r.items() if k != "ran_qk_norm"}
        assert published.split_key(r) == published.split_key(bare)


def test_a_row_that_gathered_is_predicted_slower_by_the_gathers_and_whole_head_work():
    r = next(r for r in _gathered_rows() if r["tp"] == 8)
    bare = {k: v for k, v in r.items() if k != "ran_qk_norm"}
    lay, w = reading.layout_of(r), reading.workload_of(r)
    extra = reading.qk_norm_gather_s(r, lay, w)
    assert reading.qk_norm_gather_s(bare, lay, w) == 0.0
    # q (64 x 128) and k (8 x 128) over 8 ranks, 131,072 tokens a micro-batch, 64 layers: seconds, not milliseconds
    assert 1.0 < extra < 10.0
    with_it, without = framework_accuracy.evaluate(r), framework_accuracy.evaluate(bare)
    assert with_it["pred"] < without["pred"]
    step = w.global_batch * r["seq_length"] / r["gpus"] / without["pred"]
    assert with_it["pred"] == pytest.approx(without["pred"] * step / (step + extra))


def test_more_ranks_replicate_more_of_the_work():
    r = next(r for r in _gathered_rows() if r["tp"] == 8)
    lay, w = reading.layout_of(r), reading.workload_of(r)
    per_rank = [reading.qk_norm_gather_s(r, dataclasses.replace(lay, tp=t), w) for t in (1, 2, 4, 8)]
    assert 0.0 == per_rank[0] < per_rank[1] < per_rank[2] < per_rank[3]


def test_another_stack_stating_it_is_refused():
    r = _gathered_rows()[0]
    lay, w = reading.layout_of(r), reading.workload_of(r)
    with pytest.raises(ValueError, match="ran_qk_norm"):
        reading.qk_norm_gather_s({**r, "ran_qk_norm": "local"}, lay, w)
