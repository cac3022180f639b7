"""Issue 26 (scale): a run's gradient bucket size as its config set it (Workload.ddp_bucket_size, read from a published
row's `ran_bucket_size`) reaches the bucket count and the last bucket predict charges; 0 is Megatron-Core's default,
what tuner launch leaves, and changes nothing."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest

import tuner.perfmodel as pm
from tuner.layout import Layout
from tuner.perfmodel import buckets, predict
from tuner.specs import Workload, make_workload

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import published  # noqa: E402
import reading  # noqa: E402

# the University of Florida's 256-GPU B200 MLPerf Training v5.1 Llama 3.1 8B layout (tp1 cp2 dp128)
LAY = Layout(tp=1, pp=1, dp=128, micro_batch=1, zero_stage=1, recompute="none", context_parallel=2)


def _workload(size: int = 0) -> Workload:
    return make_workload("llama3-8b", 32, "b200", 128, precision="fp8", framework="megatron-core",
                         ddp_bucket_size=size)


def test_a_smaller_bucket_runs_more_buckets_and_a_slower_step():
    default, small = _workload(), _workload(134_217_728)
    # Megatron-Core's default at dp x cp = 256 is 256 M elements; the config's 134 M cuts the same buffer finer
    assert buckets.default_bucket_size(256) == 256e6
    n_default, n_small = (buckets.bucket_count(w.model, LAY, w.ddp_bucket_size or None) for w in (default, small))
    assert n_small > n_default
    assert pm.bucket_latency(LAY, small) > pm.bucket_latency(LAY, default) > 0
    assert predict(LAY, small).step_time_s > predict(LAY, default).step_time_s
    # a larger one, fewer buckets: no slower than the default
    assert predict(LAY, _workload(768_000_000)).step_time_s <= predict(LAY, default).step_time_s


def test_the_default_size_stated_is_the_default():
    same = _workload(int(buckets.default_bucket_size(256)))
    assert predict(LAY, same).time_breakdown == predict(LAY, _workload()).time_breakdown


def test_a_stored_workload_keeps_it_and_one_without_is_unchanged():
    w = _workload(768_000_000)
    assert Workload.from_dict(w.as_dict()) == w
    assert "ddp_bucket_size" not in _workload().as_dict()       # stored workloads of before read the same
    assert Workload.from_dict(_workload().as_dict()).ddp_bucket_size == 0


def test_the_published_row_is_read_with_the_size_its_config_set():
    row = next(r for r in published.hardware() if r["cluster"] == "b200" and r["model"] == "llama3-8b"
               and r["gpus"] == 256 and "University of Florida" in r["release"])
    assert row["ran_bucket_size"] == 134_217_728        # conf/custom.yaml's default; no config of theirs sets it
    w = reading.workload_of(row)
    assert w.ddp_bucket_size == 134_217_728
    assert reading.workload_of({k: v for k, v in row.items() if k != "ran_bucket_size"}).ddp_bucket_size == 0
    assert dataclasses.replace(w, ddp_bucket_size=0) != w
    lay = reading.layout_of(row)
    assert predict(lay, w).step_time_s > predict(lay, dataclasses.replace(w, ddp_bucket_size=0)).step_time_s


@pytest.mark.parametrize("size", [1, 10**18])
def test_any_size_gives_at_least_one_bucket_and_no_more_than_parameters(size):
    w = _workload(size)
    n = buckets.bucket_count(w.model, LAY, w.ddp_bucket_size)
    assert 1 <= n <= len(buckets._first_chunk_params(w.model, LAY))
