"""benchmarks/parallel_bounds.py (issue 26): each candidate changes what it names and puts the model back."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tuner.cluster_spec import load_cluster
from tuner.perfmodel import comm, compute, stages, tp_overlap
from tuner.specs import load_model

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import parallel_bounds as pb  # noqa: E402


def test_the_overlaps_own_cost_slows_a_tp_layers_gemms_on_b200_by_a_few_percent():
    b200, model = load_cluster("b200"), load_model("llama3-405b")
    for fp8 in (None, "fp8"):
        sh = compute.Shape(b=1, t=4, c=2, sp=True, fp8=fp8)
        ratio = pb.tp_cost_seconds(model, b200, sh) / compute.layer_times(model, b200, sh)["gemm"]
        assert 1.0 < ratio < 1.15, (fp8, ratio)


def test_the_trays_measured_nvlink_rate_is_below_what_the_files_charge():
    gb200 = load_cluster("gb200")
    assert pb.NVLINK_TRAY_EFFICIENCY == pytest.approx(0.737, abs=1e-3)
    assert pb.NVLINK_TRAY_EFFICIENCY < gb200.network_efficiency
    with pb.candidate("nvlink"):
        slow = comm.allreduce_time(1e9, 4, gb200.intra_node_bandwidth_gbps, gb200)
    assert slow > comm.allreduce_time(1e9, 4, gb200.intra_node_bandwidth_gbps, gb200)


def test_every_candidate_puts_the_model_back():
    before = (compute.layer_times, comm._bw_bytes, tp_overlap.exposed_seconds, stages.layer_comm, stages.overlaps_of)
    for name in pb.CANDIDATES:
        with pb.candidate(name):
            now = (compute.layer_times, comm._bw_bytes, tp_overlap.exposed_seconds, stages.layer_comm,
                   stages.overlaps_of)
            assert now != before, name
        assert (compute.layer_times, comm._bw_bytes, tp_overlap.exposed_seconds, stages.layer_comm,
                stages.overlaps_of) == before
    with pytest.raises(ValueError):
        pb.candidate("nothing")


def test_every_candidate_moves_a_layout_that_uses_tp_cp_and_pp_and_the_model_comes_back():
    """Each candidate reaches predict (no cache keeps the model's account): a B200 layout with tp, cp and pp runs slower
    under every one, and exactly as before once it ends; tp-cost on GB300 (the model charges it on B200 itself)."""
    from tuner.layout import Layout
    from tuner.perfmodel import predict
    from tuner.specs import make_workload
    lay = Layout(tp=4, sequence_parallel=True, context_parallel=2, pp=4, virtual_pipeline=5, dp=2, micro_batch=1,
                 zero_stage=1, recompute="none")
    for name in pb.CANDIDATES:
        cluster, nodes = ("gb300", 16) if name == "tp-cost" else ("b200", 8)       # 64 GPUs either way
        w = make_workload("llama3-70b", nodes, cluster, 128, precision="fp8", framework="megatron-core")
        base = predict(lay, w).step_time_s
        with pb.candidate(name):
            assert predict(lay, w).step_time_s > base * 1.001, name
        assert predict(lay, w).step_time_s == base, name


def test_tp_cost_adds_nothing_where_the_model_charges_it():
    from tuner.layout import Layout
    from tuner.perfmodel import predict
    from tuner.specs import make_workload
    w = make_workload("llama3-70b", 8, "b200", 128, precision="fp8", framework="megatron-core")
    lay = Layout(tp=4, sequence_parallel=True, context_parallel=2, pp=4, virtual_pipeline=5, dp=2, micro_batch=1,
                 zero_stage=1, recompute="none")
    base = predict(lay, w).step_time_s
    with pb.candidate("tp-cost"):
        assert predict(lay, w).step_time_s == base
