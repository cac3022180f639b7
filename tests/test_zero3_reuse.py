"""DeepSpeed ZeRO-3 keeps a sub-module's gathered parameters where the module trace uses them again within
stage3_max_reuse_distance elements (default 1e9; partitioned_param_coordinator.py @ 38327e07f `__params_to_release`):
after a layer's recompute forward its backward follows at once, so the backward re-gathers only the sub-modules
whose reuse lies beyond that many elements (buckets.zero3_gather_passes; issue 30, round 25)."""

from __future__ import annotations

import pytest

from tuner.layout import Layout
from tuner.perfmodel import buckets, predict
from tuner.specs import load_model, make_workload


def _z3(recompute: str, dp: int = 32) -> Layout:
    return Layout(tp=1, pp=1, dp=dp, micro_batch=1, recompute=recompute, zero_stage=3)


def test_recompute_regathers_nothing_where_a_layer_fits_the_reuse_distance():
    # Llama 3 8B: a layer holds 2.2e8 elements, so after its recompute every sub-module's backward comes within 1e9
    w = make_workload("llama3-8b", 4, "a100", 32, "bf16", "megatron-deepspeed")
    full, none = predict(_z3("full"), w), predict(_z3("none"), w)
    assert buckets.zero3_gather_passes(w.model, _z3("full")) == pytest.approx(2.0)
    assert full.time_breakdown["dp_param_gather"] == pytest.approx(none.time_breakdown["dp_param_gather"])


def test_gpt3_175b_keeps_fc2_from_its_recompute_to_its_backward():
    # a layer of 1.81e9 elements: fc2 (6.0e8) is used again at once; fc1 after fc2's 2 x 6.0e8 >= 1e9: re-gathered
    w = make_workload("gpt-175b", 48, "a100", 1536, "bf16", "megatron-deepspeed")
    model = w.model
    layer = 4 * model.hidden_size ** 2 + 2 * model.hidden_size * model.ffn_hidden_size
    emb = buckets.embedding_params(model, 1)
    want = (2 * emb + model.num_layers * (3 * layer - model.hidden_size * model.ffn_hidden_size)) / (
        emb + model.num_layers * layer)
    assert buckets.zero3_gather_passes(model, _z3("full", 384)) == pytest.approx(want, rel=1e-3)
    assert 2.6 < want < 2.7
    full, none = predict(_z3("full", 384), w), predict(_z3("none", 384), w)
    ratio = full.time_breakdown["dp_param_gather"] / none.time_breakdown["dp_param_gather"]
    assert ratio == pytest.approx(want / 2.0, rel=1e-3)


def test_no_reuse_distance_releases_every_module():
    # stage3_max_reuse_distance 0: every gathered sub-module released after it runs -- the layers 3 passes with
    # recompute, 2 without; the word embedding (not recomputed) 2 either way
    for name in ("llama3-8b", "gpt-175b", "mixtral-8x7b"):
        model = load_model(name)
        layers = sum(map(sum, buckets._layer_modules(model, _z3("full"))))
        emb = buckets.embedding_params(model, 1)
        assert buckets.zero3_gather_passes(model, _z3("full"), reuse=0.0) == pytest.approx(
            (2 * emb + 3 * layers) / (emb + layers))
        assert buckets.zero3_gather_passes(model, _z3("none"), reuse=0.0) == pytest.approx(2.0)
        # kept: each layer's last sub-modules into its backward (and Mixtral's last experts across the LM head)
        assert 1.99 < buckets.zero3_gather_passes(model, _z3("full")) < 3.0


def test_without_recompute_the_last_layers_stay_gathered_across_the_lm_head():
    # the small model's LM head and last layers walk fewer than 1e9 elements from forward to backward
    small = load_model("gpt-1.4b")
    assert buckets.zero3_gather_passes(small, _z3("none")) < 2.0
    assert buckets.zero3_gather_passes(small, _z3("none"), reuse=0.0) == pytest.approx(2.0)
