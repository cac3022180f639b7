"""What Transformer Engine's TP overlap itself costs the GEMMs it hides under (issue 26): charged where a cluster file says
its GEMM curve is a kernel measurement without it (tp_overlap_gemm_cost, with sm_count: b200, gb200), nowhere else."""

from __future__ import annotations

import dataclasses

from tuner.cluster_spec import ClusterSpec, load_cluster
from tuner.layout import Layout
from tuner.perfmodel import compute, predict, tp_overlap
from tuner.perfmodel.stages import stage_times
from tuner.specs import make_workload

LAYOUT = Layout(tp=4, sequence_parallel=True, context_parallel=2, pp=4, virtual_pipeline=5, dp=2, micro_batch=1,
                zero_stage=1, recompute="none")


def _without(w):
    """`w` on its cluster with the term off (the file's key unset)."""
    return dataclasses.replace(w, cluster=dataclasses.replace(w.cluster, tp_overlap_gemm_cost=None))


def test_the_overlaps_cost_slows_a_tp_layout_on_b200_by_a_few_percent_of_its_gemms():
    for precision in ("bf16", "fp8", "mxfp8"):
        w = make_workload("llama3-70b", 8, "b200", 128, precision=precision, framework="megatron-core")
        assert w.cluster.tp_overlap_gemm_cost and w.cluster.sm_count == 148
        on, off = stage_times(LAYOUT, w)[0], stage_times(LAYOUT, _without(w))[0]
        extra = on["tp_comm"] - off["tp_comm"]
        assert 0.005 * on["gemm"] < extra < 0.10 * on["gemm"], (precision, extra / on["gemm"])
        assert predict(LAYOUT, w).step_time_s > predict(LAYOUT, _without(w)).step_time_s * 1.003, precision


def test_the_cost_is_the_settings_account_over_the_gemms_whole():
    b200 = load_cluster("b200")
    w = make_workload("llama3-405b", 32, "b200", 256, precision="fp8", framework="megatron-core")
    sh = compute.Shape(b=1, t=4, c=2, sp=True, fp8="fp8")
    whole = compute.layer_times(w.model, b200, sh)["gemm"]
    run = tp_overlap.overlapped_gemm_seconds(w.model, b200, sh, tp_overlap.BLACKWELL_USERBUFFERS, 148)
    assert tp_overlap.gemm_cost_seconds(w.model, b200, sh) == run - whole > 0
    # more SMs held (fewer left to the GEMMs) costs more
    assert tp_overlap.overlapped_gemm_seconds(w.model, b200, sh, tp_overlap.BLACKWELL_USERBUFFERS, 100) > run
    # an MoE layer's attention alone costs less than the dense layer's four GEMMs
    assert 0 < tp_overlap.gemm_cost_seconds(w.model, b200, sh, mlp=False) < tp_overlap.gemm_cost_seconds(
        w.model, b200, sh)


def test_no_cost_without_tp_without_the_key_or_without_the_overlap():
    w = make_workload("llama3-70b", 8, "b200", 128, precision="fp8", framework="megatron-core")
    sh1 = compute.Shape(b=1, t=1, c=2, sp=False, fp8="fp8")
    assert tp_overlap.gemm_cost_seconds(w.model, w.cluster, sh1) == 0.0
    sh = compute.Shape(b=1, t=4, c=2, sp=True, fp8="fp8")
    for name in ("h100", "gb300", "b300", "mi300x"):       # a guessed curve that carries it; no sm_count; no key
        assert tp_overlap.gemm_cost_seconds(w.model, load_cluster(name), sh) == 0.0, name
    no_sms = dataclasses.replace(w.cluster, sm_count=None)
    assert tp_overlap.gemm_cost_seconds(w.model, no_sms, sh) == 0.0
    h100 = make_workload("llama3-70b", 8, "h100", 128, precision="fp8", framework="megatron-core")
    assert stage_times(LAYOUT, h100) == stage_times(LAYOUT, _without(h100))
    # without sequence parallelism Megatron-Core runs no userbuffers overlap: nothing charged
    no_sp = dataclasses.replace(LAYOUT, sequence_parallel=False)
    assert stage_times(no_sp, w) == stage_times(no_sp, _without(w))
    # torchtitan runs no userbuffers either
    tt = make_workload("llama3-70b", 8, "b200", 128, precision="bf16", framework="torchtitan")
    lay = Layout(tp=4, sequence_parallel=True, pp=1, dp=16, micro_batch=1, zero_stage=3, recompute="none")
    assert stage_times(lay, tt) == stage_times(lay, _without(tt))


def test_the_key_is_stored_only_where_a_file_states_it():
    b200, h100 = load_cluster("b200"), load_cluster("h100")
    assert b200.as_dict()["tp_overlap_gemm_cost"] is True
    assert "tp_overlap_gemm_cost" not in h100.as_dict()
    assert ClusterSpec.from_dict(b200.as_dict()) == b200
