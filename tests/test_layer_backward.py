"""Megatron-Core's layer backward on every stage (issue 24 round 8, tuner/perfmodel/layer_backward.py,
memory.megatron_phases), against the fake-tensor peaks of benchmarks/data/memory_measured_megatron-core*.toml (only
rows some memory choice has seen: published.clean rows are never pinned by a test)."""

from __future__ import annotations

import dataclasses

import pytest

from test_megatron_loss import _rows
from tuner.layout import micro_batches_per_pipeline
from tuner.perfmodel import memory
from tuner.perfmodel.compute import shape_of
from tuner.perfmodel.layer_backward import megatron_backward_bytes

#: the stages whose peak is a layer's backward: a first or middle stage of 1F1B, or full recompute's working layer
BACKWARD = _rows(lambda r, lay: lay.virtual_pipeline == 1
                 and (r.get("stage", 0) < lay.pp - 1 or lay.recompute == "full"))


@pytest.mark.parametrize("e", BACKWARD, ids=lambda e: e["layout"].key() + f"-s{e['workload'].model.seq_length}")
def test_backward_peaked_rows_within_one_and_a_half_percent(e):
    """Every dense first-stage / full-recompute row (flash stand-in): within 0.015 in log (before the layer backward: up
    to +0.088 -- FRESH's GPT tp8 pp2 full recompute --, and FRESH2's first stages +0.015 to +0.081; before the RoPE
    copies, the recomputed output and the harness's RoPE / dropout read as ran, up to +0.031)."""
    assert abs(e["exact"]) < 0.015


def test_there_are_backward_peaked_rows():
    assert len(BACKWARD) >= 20


def _model(**kw):
    e = BACKWARD[0]
    return dataclasses.replace(e["workload"].model, **kw)


def test_gelu_peaks_at_fc2s_weight_gradient():
    """GPT-22B's shape, tp 2 with SP, s 8192, b 2 (FRESH2's first stage, whose live tensors at the peak were read): the
    received gradient (T h / t), fc2's gathered output gradient (T h), its input gradient (T f / t) and its bf16 weight
    gradient (h f / t), 2 bytes each."""
    m = _model(hidden_size=6144, ffn_hidden_size=24576, ffn_type="gelu", seq_length=8192, num_experts=0,
               tie_embeddings=True, vocab_size=50688)
    T, h, f, t = 8192 * 2, 6144, 24576, 2
    assert megatron_backward_bytes(m, t, True, 2.0, 2) == pytest.approx(2 * (T * h / t + T * h + T * f / t + h * f / t))


def test_swiglu_at_a_long_sequence_peaks_in_the_activations_backward():
    """Llama 3 8B, tp 1, s 8192, b 2: SwiGLU's backward writes the gradient of both fc1 halves (T 2f) after fc2's saved
    input was freed, more than fc2's moment (T h + T f + h f)."""
    m = _model(hidden_size=4096, ffn_hidden_size=14336, ffn_type="swiglu", seq_length=8192, num_experts=0,
               tie_embeddings=False, vocab_size=128256)
    T, h, f = 8192 * 2, 4096, 14336
    assert megatron_backward_bytes(m, 1, False, 2.0, 2) == pytest.approx(2 * (T * h + 2 * T * f))


def test_tied_output_weight_gradient_waits_only_with_one_stage():
    m = _model(hidden_size=6144, ffn_hidden_size=24576, ffn_type="gelu", seq_length=2048, num_experts=0,
               tie_embeddings=True, vocab_size=50688)
    one, two = megatron_backward_bytes(m, 4, True, 1.0, 1), megatron_backward_bytes(m, 4, True, 1.0, 2)
    assert one - two == pytest.approx(2 * 50688 * 6144 / 4)
    untied = dataclasses.replace(m, tie_embeddings=False)
    assert megatron_backward_bytes(untied, 4, True, 1.0, 1) == pytest.approx(two)


def test_first_stage_holds_the_backward_on_top_of_its_activations():
    """A first stage of pp 2 (no loss there): stage_memory's activations are the kept passes, the SP gather buffer and
    the layer backward; Megatron-DeepSpeed's account (no megatron_loss) is unchanged by it."""
    e = next(e for e in BACKWARD if e["layout"].pp > 1 and e["row"].get("stage", 0) == 0)
    lay, w = e["layout"], dataclasses.replace(e["workload"], framework="megatron-core")
    sh, m = shape_of(lay, w), micro_batches_per_pipeline(lay, w.global_batch)
    kept = memory.stage_activation_bytes(w.model, lay, 0, m, sh, w.cluster.flash_attention, None, True)
    kept += memory.sp_gather_bytes(w.model, sh) if sh.sp and lay.tp > 1 else 0.0
    bwd = megatron_backward_bytes(w.model, lay.tp, sh.sp, sh.tokens, lay.pp)
    assert bwd > 0
    assert memory.stage_memory(lay, w, 0, m, sh)["activations"] == pytest.approx((kept + bwd) / 1e9, rel=1e-12)
    mds = dataclasses.replace(w, framework="megatron-deepspeed")
    msh = shape_of(lay, mds)
    plain = memory.stage_activation_bytes(w.model, lay, 0, m, msh, w.cluster.flash_attention, None, False)
    assert memory.stage_memory(lay, mds, 0, m, msh)["activations"] == pytest.approx(plain / 1e9, rel=1e-12)


def test_full_recompute_holds_the_recomputed_layers_output():
    """Under full recompute the recomputed layer's output (T h / t with SP) is alive through its backward too."""
    m = _model(hidden_size=6144, ffn_hidden_size=24576, ffn_type="gelu", seq_length=4096, num_experts=0,
               tie_embeddings=True, vocab_size=50688)
    full = megatron_backward_bytes(m, 4, True, 2.0, 2, "full")
    assert full - megatron_backward_bytes(m, 4, True, 2.0, 2) == pytest.approx(2 * 4096 * 2 * 6144 / 4)


def test_the_harness_rows_are_read_as_they_ran():
    """benchmarks/memory_accuracy.harness_rope_dropout_gb: a dropout-free Llama row measured with the unfused RoPE and
    the stand-in's v view gets its cos / sin and rotated q, k (2 + 2kv/h per element / t) and loses the account's two
    mask bytes (2 per element / t with SP): more in all; a GPT row (dropout 0.1, learned positions) 0."""
    import memory_accuracy
    llama = next(e for e in BACKWARD if "dropout 0.0" in e["row"]["note"] and e["layout"].recompute == "none")
    gpt = next(e for e in BACKWARD if "dropout 0.1" in e["row"]["note"] and e["layout"].recompute == "none")
    for e, sign in ((llama, 1), (gpt, 0)):
        lay, w = e["layout"], dataclasses.replace(e["workload"], framework="megatron-core")
        m = micro_batches_per_pipeline(lay, w.global_batch)
        mem = memory.stage_memory(lay, w, e["row"].get("stage", 0), m)
        got = memory_accuracy.harness_rope_dropout_gb(e["row"], lay, w, m, mem)
        assert (got > 0) - (got < 0) == sign


def test_moe_model_has_no_backward_term():
    assert megatron_backward_bytes(_model(num_experts=8, moe_top_k=2), 2, True, 1.0, 2) == 0.0
