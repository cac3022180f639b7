"""benchmarks/h100_gap.py (issue 25): the TP overlap's cost costs time, and a model variant leaves the model as it was."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

from tuner.cluster_spec import ClusterSpec, load_cluster
from tuner.perfmodel import compute
from tuner.specs import load_model

ROOT = Path(__file__).resolve().parents[1]


sys.path.insert(0, str(ROOT / "benchmarks"))
import h100_gap as gap  # noqa: E402


def test_tp_overlap_costs_a_few_percent_of_the_gemms_on_the_measured_curve():
    h100 = dataclasses.replace(load_cluster("h100"), **gap.MEASURED)
    model = load_model("llama3-70b")
    for t in (2, 4, 8):
        sh = compute.Shape(b=1, t=t, c=2, sp=True)
        plain = compute.layer_times(model, h100, sh)["gemm"]
        cost = gap.tp_overlap_seconds(model, h100, sh)
        assert 1.0 < cost / plain < 1.15, (t, cost / plain)
    fp8 = compute.Shape(b=1, t=4, c=2, sp=True, fp8="fp8", backward_gemm=compute.SPLIT_ACCUMULATOR)
    assert gap.tp_overlap_seconds(model, h100, fp8) > compute.layer_times(model, h100, fp8)["gemm"]


def test_a_variant_reads_the_curve_and_puts_the_model_back():
    before = (ClusterSpec.__dict__["from_dict"], compute.layer_times)
    with gap.Variant(gap.MEASURED, True):
        assert load_cluster("h100").matmul_efficiency == gap.MEASURED["matmul_efficiency"]
        assert load_cluster("h200").gemm_knee_gflop == gap.MEASURED["gemm_knee_gflop"]
        assert load_cluster("a100").matmul_efficiency != gap.MEASURED["matmul_efficiency"]
    assert (ClusterSpec.__dict__["from_dict"], compute.layer_times) == before
    assert load_cluster("h100").matmul_efficiency == 0.7
