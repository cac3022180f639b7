"""The GB200 MLPerf Training v6.0 DeepSeek-V3 rows (TP 2) as their recipe ran them: without --tp-comm-overlap
(Megatron-Bridge 26.04-alpha.rc2 deepseek_v3_pretrain_config: CommOverlapConfig(tp_comm_overlap=False), which the
submission's pretrain.py never overrides), so their sequence-parallel collectives are predicted whole (issue 25
fifteenth session (moe))."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import moe_accuracy  # noqa: E402
import published  # noqa: E402
import reading  # noqa: E402

from tuner.perfmodel import predict  # noqa: E402


def _rows() -> list[dict]:
    return [r for r in published.hardware() if r["cluster"] == "gb200" and r["model"] == "deepseek-v3"
            and any(s.startswith("MLPerf Training v6.0") for s in r["releases"])]


def test_every_gb200_v6_deepseek_row_states_tp_overlap_off():
    rows = _rows()
    assert len(rows) == 5 and all(r["tp"] == 2 and r["tp_comm_overlap"] is False for r in rows)
    ex = moe_accuracy.exchange_of(rows[0])
    assert ex.overlaps is not None and "tp" not in ex.overlaps and {"dp", "p2p", "ep"} <= ex.overlaps
    assert ex.dispatcher == "flex" and ex.graphed and ex.overlap


def test_the_collectives_show_whole_and_slow_the_prediction():
    r = min(_rows(), key=lambda x: x["gpus"])
    w, lay, ex = reading.workload_of(r), reading.layout_of(r), moe_accuracy.exchange_of(r)
    off = predict(lay, w, ex)
    on = predict(lay, w, moe_accuracy.exchange_of({k: v for k, v in r.items() if k != "tp_comm_overlap"}))
    assert off.time_breakdown["tp_comm"] > 3.0 * on.time_breakdown["tp_comm"]
    assert off.step_time_s > on.step_time_s


def test_the_choice_names_the_in_split_rows_it_saw():
    """benchmarks/seen.py marks the four in-split rows (their errors were printed before the reading) and not the held-out
    one, which no one printed."""
    rows = _rows()
    mine = published.HARDWARE_SEEN["GB200 MLPerf v6.0 DeepSeek-V3 without --tp-comm-overlap (tp_comm_overlap)"][1]
    assert sorted(r["gpus"] for r in rows if mine(r)) == [256, 2048, 4096, 8192]
    assert [r["gpus"] for r in rows if published.held_out(r)] == [512] and not any(mine(r) for r in rows if published.held_out(r))
