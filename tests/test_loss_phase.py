"""torchtitan's memory outside the layers at its loss's peak (issue 24, tuner/perfmodel/memory_loss.py), term by
term against the tracker's categories of the rows of benchmarks/data/memory_measured_torchtitan.toml (all seen by
this choice; every one peaks in the loss).

Chunked loss: the LM head's FSDP unit at its reduce-scatter is the tracker's Unsharded Param + Unsharded Grad + Temp
(12 + 4/d bytes per LM-head parameter on the rank). Un-chunked: the loss's backward temporaries are Temp (its
fp32 log-probabilities, 4 of the 12 / 16 bytes per logit, are activations)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from tuner.perfmodel.memory_loss import MEASURED_LOSS_CHUNKS, loss_phase
from tuner.specs import load_model

DATA = Path(__file__).resolve().parents[1] / "benchmarks" / "data" / "memory_measured_torchtitan.toml"
GIB = 2 ** 30


def _rows(chunked: bool) -> list[dict]:
    with open(DATA, "rb") as f:
        rows = tomllib.load(f)["row"]
    return [r for r in rows if not r.get("num_experts") and ("ChunkedLossWrapper" in r["note"]) == chunked]


def _cats(row: dict) -> dict:
    text = re.search(r"at its peak: ([^;]*);", row["note"]).group(1)
    return {k: float(v) for k, v in (p.rsplit(" ", 1) for p in text.split(", "))}


def _phase(row: dict, chunks: int) -> tuple[float, float]:
    model = load_model("llama3-8b")
    model = model.__class__(**{**model.__dict__, "hidden_size": row["hidden_size"], "vocab_size": row["vocab_size"],
                               "seq_length": row["seq_length"]})
    return loss_phase(model, row["tp"], row["tp"] > 1, row["micro_batch"], row["micro_batch"], row["dp"], chunks)


@pytest.mark.parametrize("row", _rows(chunked=True), ids=lambda r: f"{r['hidden_size']}-{r['seq_length']}-"
                         f"dp{r['dp']}-tp{r['tp']}-mb{r['micro_batch']}-{r['recompute']}")
def test_lm_head_unit_at_the_chunked_peak(row):
    c = _cats(row)
    measured = c["Unsharded Param"] + c["Unsharded Grad"] + c["Temp"]
    assert _phase(row, MEASURED_LOSS_CHUNKS)[1] / GIB == pytest.approx(measured, rel=0.03)


@pytest.mark.parametrize("row", _rows(chunked=False), ids=lambda r: f"tp{r['tp']}")
def test_unchunked_loss_temporaries(row):
    logits = row["seq_length"] * row["micro_batch"] * row["vocab_size"] / row["tp"]
    act, head = _phase(row, 1)
    per_logit = (act - (8.0 / row["tp"] + 2.0) * row["seq_length"] * row["micro_batch"] * row["hidden_size"]) / logits
    assert per_logit == (16.0 if row["tp"] > 1 else 12.0)
    assert (per_logit - 4.0) * logits / GIB == pytest.approx(_cats(row)["Temp"], rel=0.01)
    assert head / GIB == pytest.approx(_cats(row)["Unsharded Param"], rel=0.01)
