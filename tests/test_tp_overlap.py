"""Megatron-Core's --tp-comm-overlap hides each TP collective under its own GEMM (Transformer Engine's userbuffers bind
one to one), not under the layer's GEMMs together (issue 24: NVIDIA's Llama 3 70B recipe; issue 25: TP overlap)."""

from __future__ import annotations

import dataclasses

import pytest

from tuner.layout import Layout
from tuner.perfmodel import comm, compute, predict, tp_overlap
from tuner.perfmodel.compute import shape_of
from tuner.perfmodel.stages import stage_times
from tuner.specs import make_workload


def test_each_method_shows_what_outlasts_its_gemm():
    # ring exchange: the rank's own chunk needs no transfer, the other tp - 1 chunks wait for theirs
    assert tp_overlap.ring(0.7, 1.0, 8) == 0.0
    assert tp_overlap.ring(1.5, 1.0, 8) == pytest.approx(1.5 - 7 / 8)
    # pipeline: the last of 4 chunks' reduce-scatter always shows
    assert tp_overlap.pipeline(0.4, 1.0) == pytest.approx(0.1)
    assert tp_overlap.pipeline(2.0, 1.0) == pytest.approx(2.0 - 0.75)
    assert tp_overlap.bulk(0.5, 1.0) == 0.0 and tp_overlap.bulk(1.5, 1.0) == pytest.approx(0.5)


def _tp_comm(layout, w):
    return stage_times(layout, w)[-1]["tp_comm"]


def test_tp8_on_llama3_70b_shows_what_its_small_gemms_cannot_hide():
    w = make_workload("llama3-70b", 8, "h100", 128, "bf16", "megatron-core")
    lay = Layout(tp=8, pp=2, dp=4, micro_batch=1, virtual_pipeline=8, sequence_parallel=True, recompute="none")
    sh = shape_of(lay, w)
    qkv, proj, fc1, fc2 = (compute.gemm_time(w.cluster, f) for f in compute.layer_gemm_flops(w.model, 1, 8))
    half = 0.5 * comm.tp_allreduce_time(w.cluster, 8, 2.0 * w.model.seq_length * w.model.hidden_size)
    # the attention projection's reduce-scatter outlasts its GEMM; fc1's all-gather hides under its far larger one
    assert half > proj and half < fc1 * 7 / 8
    per_layer = tp_overlap.exposed_seconds(w.model, w.cluster, sh)
    # the layer's collectives together (4 all-reduces) are far below its GEMMs forward and backward: the old rule
    # (all of them under all of those) showed none of them
    assert 4 * comm.tp_allreduce_time(w.cluster, 8, 2.0 * w.model.seq_length * w.model.hidden_size) < 3 * (
        qkv + proj + fc1 + fc2)
    assert per_layer > 0.2 * half
    layers = w.model.num_layers // 2
    assert _tp_comm(lay, w) >= layers * per_layer
    # tp 4 with cp 2 (the recipe's cut) hides all but the pipelined reduce-scatters' last chunks
    recipe = Layout(tp=4, pp=4, dp=2, micro_batch=1, virtual_pipeline=5, context_parallel=2, sequence_parallel=True,
                    recompute="none")
    rsh = shape_of(recipe, w)
    rs4 = 0.5 * comm.tp_allreduce_time(w.cluster, 4, w.model.seq_length * w.model.hidden_size)
    assert tp_overlap.exposed_seconds(w.model, w.cluster, rsh) == pytest.approx(2 * rs4 / 4)
    assert predict(recipe, w).samples_per_second > predict(lay, w).samples_per_second


def test_fp8_gathers_move_one_byte_and_full_recompute_pays_the_forward_again(monkeypatch):
    w = make_workload("llama3-70b", 8, "h100", 128, "bf16", "megatron-core")
    lay = Layout(tp=8, pp=2, dp=4, micro_batch=1, virtual_pipeline=8, sequence_parallel=True, recompute="none")
    sh = shape_of(lay, w)
    none = tp_overlap.exposed_seconds(w.model, w.cluster, sh)
    full = tp_overlap.exposed_seconds(w.model, w.cluster, dataclasses.replace(sh, recompute="full"))
    assert full > none
    sizes = []
    real = comm.tp_allreduce_time

    def spy(cluster, tp, nbytes):
        sizes.append(nbytes)
        return real(cluster, tp, nbytes)

    monkeypatch.setattr(comm, "tp_allreduce_time", spy)
    act = 2.0 * w.model.seq_length * w.model.hidden_size
    tp_overlap.exposed_seconds(w.model, w.cluster, sh)
    assert sizes == [act, act]                     # reduce-scatters and all-gathers in bf16
    sizes.clear()
    tp_overlap.exposed_seconds(w.model, w.cluster, dataclasses.replace(sh, fp8="fp8"))
    assert sizes == [act, act / 2]                 # FP8 GEMMs: the all-gather buffers hold FP8 (TE's fp8_buf)


def test_groups_without_the_overlap_show_every_collective():
    # Megatron-DeepSpeed has no TP overlap: its four all-reduces a layer show whole, as before
    w = make_workload("llama3-70b", 8, "h100", 128, "bf16", "megatron-deepspeed")
    lay = Layout(tp=8, pp=2, dp=4, micro_batch=1, sequence_parallel=True, recompute="none")
    act = 2.0 * w.model.seq_length * w.model.hidden_size
    per_layer = 4 * comm.tp_allreduce_time(w.cluster, 8, act)
    assert stage_times(lay, w)[0]["tp_comm"] == pytest.approx(40 * per_layer + comm.tp_allreduce_time(w.cluster, 8, act))
