"""benchmarks/step_floor.py (issues 25 / 26): Megatron-Core's per-step floor from Megatron-LM's CI as a model variant --
derived from the CI's measured steps less tuner's own prediction of them, paid once a step by Megatron-Core on CUDA
clusters only, a cluster's measured step_overhead_ms kept, and the model put back as it was."""

from __future__ import annotations

import dataclasses
import statistics
import sys
from pathlib import Path

import pytest

from tuner.layout import Layout
from tuner.perfmodel import predict
from tuner.specs import make_workload

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import step_floor as sf  # noqa: E402

LAY = Layout(tp=1, pp=1, dp=32, micro_batch=1, recompute="none")


def test_the_floor_is_the_ci_step_less_what_the_model_already_predicts_of_it():
    floors = sf.floors_ms()
    for cluster, host in sf.HOST_OF_CI.items():
        with sf.Variant():
            with_floor = sf.ci_step(cluster)
        # with the floor, tuner predicts the CI cases' median step on the machine they ran on
        assert with_floor * 1e3 == pytest.approx(statistics.median(sf.CI_CASES[cluster].values()), abs=1e-6)
        assert floors[host] > 0
    assert floors["grace"] > floors["x86"]      # the Grace-hosted CI step is the slower one


def test_the_variant_pays_it_once_a_step_for_megatron_core_on_cuda_only_and_restores_the_model():
    w = make_workload("llama3-8b", 4, "b200", 32, "fp8", "megatron-core")
    before = predict(LAY, w)
    assert "step_overhead" not in before.time_breakdown          # not applied: the model states no floor
    with sf.Variant():
        one = predict(LAY, w)
        more = predict(LAY, dataclasses.replace(w, global_batch=128))
        others = [predict(LAY, dataclasses.replace(w, framework=f)) for f in ("megatron-deepspeed", "torchtitan")]
        amd = predict(LAY, make_workload("llama3-8b", 4, "mi300x", 32, "bf16", "megatron-core"))
        measured = predict(LAY, dataclasses.replace(w, cluster=dataclasses.replace(w.cluster, step_overhead_ms=5.0)))
    floor = sf.floors_ms()["x86"] * 1e-3
    assert one.time_breakdown["step_overhead"] == pytest.approx(floor)
    assert one.step_time_s == pytest.approx(before.step_time_s + floor)
    assert more.time_breakdown["step_overhead"] == one.time_breakdown["step_overhead"]    # per step, not micro-batch
    assert all("step_overhead" not in p.time_breakdown for p in (*others, amd))
    assert measured.time_breakdown["step_overhead"] == pytest.approx(0.005)               # a measured one is kept
    assert predict(LAY, w).step_time_s == before.step_time_s                               # restored
