"""DeepSpeed's ZeRO gradient-reduction bucket (tuner.perfmodel.ds_buffers): reduce_bucket_size elements in bf16, 1.0 GB
whatever the model's size, through the backward at ZeRO 1 / 2 and kept at ZeRO 3; under the pipeline engine at ZeRO 1
a second one after the backward. The real DeepSpeed trials on CPU ranks (benchmarks/data/harness_measured_cpu.jsonl,
their tensors' allocated peaks) hold it; before it, every ZeRO 1 / 2 / 3 row was 0.92-1.94 GB above the account."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from tuner.frameworks import of
from tuner.layout import Layout
from tuner.perfmodel import predict
from tuner.perfmodel.ds_buffers import BUCKET_BYTES, after_backward_bytes, backward_bytes
from tuner.specs import Workload, load_cluster, load_model

ROWS = Path(__file__).resolve().parents[1] / "benchmarks" / "data" / "harness_measured_cpu.jsonl"


def _workload(gpus: int, framework: str = "megatron-deepspeed") -> Workload:
    cluster = dataclasses.replace(load_cluster("local"), gpus_per_node=gpus)
    return Workload(load_model("small"), cluster, 1, 8, framework=framework)


def _rows():
    """The ZeRO >= 1 rows: at ZeRO 0 the CPU trial runs PyTorch's Adam, not the GPU's DeepSpeed wrapper (no bucket), so
    those rows test nothing here and are not collected (they passed vacuously before)."""
    rows = [json.loads(x) for x in ROWS.read_text().splitlines() if x]
    return [r for r in rows if r["layout"]["zero_stage"] >= 1]


def test_the_rows_hold_every_zero_stage_and_the_pipeline():
    stages = {(r["layout"]["zero_stage"], r["layout"]["pp"]) for r in _rows()}
    assert {(1, 1), (2, 1), (3, 1), (1, 2)} <= stages, stages


@pytest.mark.parametrize("row", _rows(), ids=lambda r: r["key"])
def test_the_account_holds_deepspeeds_buckets(row):
    lay = Layout.from_dict(row["layout"])
    w = _workload(lay.gpus)
    account = predict(lay, w).memory_gb - w.cluster.memory_reserved_gb
    assert row["status"] == "ok" and abs(row["peak_memory_gb"] - account) < 0.07, (row["peak_memory_gb"], account)


def test_phases_by_stage_and_engine():
    fw, lay = of(_workload(2)), Layout(tp=1, pp=1, dp=2, micro_batch=1)
    w = _workload(2)
    assert BUCKET_BYTES == 1e9
    assert backward_bytes(dataclasses.replace(lay, zero_stage=0), fw) == 0.0
    for z in (1, 2, 3):
        assert backward_bytes(dataclasses.replace(lay, zero_stage=z), fw) == BUCKET_BYTES
    piped = Layout(tp=1, pp=2, dp=1, micro_batch=1, zero_stage=1)
    assert after_backward_bytes(piped, w, fw, 1e6, 0.0) == 2 * BUCKET_BYTES          # the pipeline engine's second
    assert after_backward_bytes(dataclasses.replace(lay, zero_stage=1), w, fw, 1e6, 0.0) == 6e6 / 2   # step copies
    mcore = of(_workload(2, "megatron-core"))                                        # not DeepSpeed's engine
    assert backward_bytes(dataclasses.replace(lay, zero_stage=1), mcore) == 0.0
    assert after_backward_bytes(piped, w, mcore, 1e6, 0.0) == 0.0
