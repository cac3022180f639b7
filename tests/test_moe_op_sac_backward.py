"""torchtitan's per-op SAC recomputes an MoE block in its backward (issue 24, twelfth session: tuner/perfmodel/moe.py
op_sac_moe_backward_bytes), checked against the fake-tensor tracker's categories of the op-SAC Qwen3-30B-A3B rows
(benchmarks/data/memory_measured_torchtitan*.toml, all seen by this choice: each peaks in a routed experts' backward),
and the chunked loss a published run ran (benchmarks/reading.ran_loss_chunks)."""

from __future__ import annotations

import dataclasses
import re
import sys
import tomllib
from pathlib import Path

import pytest
from tuner.layout import Layout
from tuner.perfmodel import memory
from tuner.perfmodel.compute import shape_of
from tuner.perfmodel.moe import op_sac_moe_backward_bytes
from tuner.specs import load_cluster, load_model, make_workload

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
GIB = 2 ** 30


def _rows() -> list[dict]:
    out = []
    for name in ("memory_measured_torchtitan.toml", "memory_measured_torchtitan_rows.toml"):
        with open(ROOT / "benchmarks" / "data" / name, "rb") as f:
            out += [r for r in tomllib.load(f)["row"] if r.get("num_experts") and r["recompute"] == "selective"]
    return out


def _case(mb: int, seq: int, recompute: str = "selective"):
    model = dataclasses.replace(load_model("qwen3-30b-a3b"), seq_length=seq)
    w = make_workload(model, 1, load_cluster("b200"), global_batch=8 * mb, framework="torchtitan")
    lay = Layout(tp=1, pp=1, dp=8, micro_batch=mb, zero_stage=3, recompute=recompute, expert_parallel=1)
    return lay, w


@pytest.mark.parametrize("row", _rows(), ids=lambda r: f"mb{r['micro_batch']}-s{r['seq_length']}")
def test_block_backward_is_the_trackers_temp_and_the_peak(row):
    """The term is the tracker's Temp at the peak (the routed experts' backward); with it the step's allocated peak
    is within 3 % of the measured one (8 loss chunks, as measured); without it the 8 x 8,192-token row is 15 % low."""
    lay, w = _case(row["micro_batch"], row["seq_length"])
    sh = shape_of(lay, w)
    temp = float(re.search(r"Temp ([\d.]+)", row["note"]).group(1))
    assert op_sac_moe_backward_bytes(w.model, sh) / GIB == pytest.approx(temp, rel=0.01)
    mem = memory.stage_memory(lay, w, 0, 1, sh, loss_chunks=8)
    assert (mem["total"] - mem["reserved"]) * 1e9 / GIB == pytest.approx(row["peak_allocated_gib"], rel=0.03)


def test_only_op_sac_moe_blocks():
    lay, w = _case(2, 4096, "full")
    assert op_sac_moe_backward_bytes(w.model, shape_of(lay, w)) == 0.0
    dense = make_workload(load_model("llama3-8b"), 1, load_cluster("b200"), global_batch=16, framework="torchtitan")
    lay = Layout(tp=1, pp=1, dp=8, micro_batch=2, zero_stage=3, recompute="selective")
    assert op_sac_moe_backward_bytes(dense.model, shape_of(lay, dense)) == 0.0


def test_a_row_that_ran_a_chunked_loss_is_read_so():
    """pith-train #79's torchtitan Qwen3-30B-A3B on 8 B200 ran 8 loss chunks: read so, its logits are not the
    un-chunked loss's 120.8 GB and it fits (it ran at 141.79 GiB reserved)."""
    import published
    import reading
    row = next(r for r in published.hardware() if any("pith-train" in s for s in r["sources"]))
    lay, w = reading.layout_of(row), reading.workload_of(row)
    assert reading.ran_loss_chunks(row) == 8
    gb, p_fit = reading.memory_as_ran(row, lay, w)
    assert p_fit >= 0.5 and gb < w.cluster.memory_gb
    unchunked = {k: v for k, v in row.items() if k != "ran_loss_chunks"}
    assert reading.memory_as_ran(unchunked, lay, w)[1] < 0.5
    with pytest.raises(ValueError):
        reading.ran_loss_chunks({**row, "ran_loss_chunks": 1})
