"""Megatron-DeepSpeed ZeRO-3 prefetches each layer's parameters and reduce-scatters its gradients on side streams
(issue 30; DeepSpeed's partitioned_param_coordinator.fetch_sub_module, stage3.__reduce_and_partition_ipg_grads with
overlap_comm on at stage 3): its gathers and reduce-scatters hide under the neighbouring layer's compute, as FSDP's do
(tuner.perfmodel.zero3_time), instead of showing whole after the compute."""

from __future__ import annotations

import dataclasses

import pytest

import tuner.perfmodel as pm
from tuner.frameworks import of as framework_of
from tuner.layout import Layout, micro_batches_per_pipeline
from tuner.perfmodel import comm, memory, predict
from tuner.specs import make_workload

Z3 = Layout(tp=1, pp=1, dp=16, micro_batch=1, recompute="none", zero_stage=3)


def _bare(lay, w) -> dict:
    """The step's ZeRO-3 collectives with nothing hiding them: each pass's all-gather and each micro-batch's
    reduce-scatter of the GPU's bf16 weights (comm.dp_time), as tuner charged them before."""
    m = micro_batches_per_pipeline(lay, w.global_batch)
    params = memory.max_layer_params(w.model, lay) * w.model.num_layers + memory.embedding_params(w.model, lay.tp)
    return comm.dp_time(w.cluster, lay.tp, lay.dp, 3, params, m, lay.checkpointing)


def test_22b_zero3_gathers_hide_under_the_compute():
    w = make_workload("22b", 2, "frontier", 64, "bf16", "megatron-deepspeed")
    for lay in (Z3, dataclasses.replace(Z3, recompute="full")):
        shown, bare = predict(lay, w).time_breakdown, _bare(lay, w)
        # the first gather and the last reduce-scatter of each micro-batch's passes still show
        assert 0.0 < shown["dp_param_gather"] < 0.25 * bare["param_gather"]
        assert 0.0 < shown["dp_grad_reduce"] + shown["dp_param_gather"] < 0.25 * (bare["grad_reduce"] + bare["param_gather"])


def test_with_no_compute_every_collective_shows():
    w = make_workload("22b", 2, "frontier", 64, "bf16", "megatron-deepspeed")
    m = micro_batches_per_pipeline(Z3, w.global_batch)
    bare = _bare(Z3, w)
    whole = pm.zero3_time(Z3, w, 0.0, m, framework_of(w).grad_bytes(w))
    # the same bytes, a collective a layer (and the first gather / last reduce-scatter once more): no less than before
    assert sum(whole.values()) >= 0.99 * (bare["param_gather"] + bare["grad_reduce"])
    less = pm.zero3_time(Z3, w, 1.0, m, 2.0)
    assert less["param_gather"] < whole["param_gather"] and less["grad_reduce"] < whole["grad_reduce"]


def test_recompute_gathers_each_layer_again_under_its_backward():
    w = make_workload("22b", 2, "frontier", 64, "bf16", "megatron-deepspeed")
    m = micro_batches_per_pipeline(Z3, w.global_batch)
    plain = pm.zero3_time(Z3, w, 0.0, m, 2.0)
    again = pm.zero3_time(dataclasses.replace(Z3, recompute="full"), w, 0.0, m, 2.0)
    assert again["grad_reduce"] - plain["grad_reduce"] == pytest.approx(plain["param_gather"] - m * _first(w), rel=1e-6)


def _first(w) -> float:
    """One micro-batch's first gather of the forward (fsdp_time's `first`: the larger of a layer's and the embedding)."""
    bw = comm.group_bandwidth(w.cluster, Z3.dp, Z3.tp)
    size = max(2.0 * memory.max_layer_params(w.model, Z3), 2.0 * memory.embedding_params(w.model, Z3.tp))
    return comm.allgather_time(size, Z3.dp, bw, w.cluster)


def test_zero_1_and_megatron_core_are_charged_as_before(monkeypatch):
    w = make_workload("22b", 2, "frontier", 64, "bf16", "megatron-deepspeed")
    core = make_workload("22b", 2, "frontier", 64, "bf16", "megatron-core")
    cases = [(w, dataclasses.replace(Z3, zero_stage=1)), (core, Z3)]
    before = [predict(lay, wl).step_time_s for wl, lay in cases]
    monkeypatch.setattr(pm, "zero3_time", lambda *a, **k: pytest.fail("zero3_time asked"))
    assert [predict(lay, wl).step_time_s for wl, lay in cases] == before
