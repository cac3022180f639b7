"""Model architectures (issue 14, items 1 and 3): GQA, SwiGLU, RoPE, untied embeddings, RMSNorm and
bias-free layers in the spec, the FLOP counts, parameter counts, memory and compute, checked against
hand-computed values for the Llama 3 presets; GPT numbers stay what they were."""

from __future__ import annotations

import dataclasses

import pytest

from tuner.errors import SpecError
from tuner.layout import Layout
from tuner.perfmodel import compute, memory, predict, rank
from tuner.perfmodel.compute import Shape
from tuner.perfmodel.flops import megatron_flops, model_flops
from tuner.space import load_space, valid_layouts
from tuner.specs import ModelSpec, load_cluster, load_model, make_workload

H100 = load_cluster("h100")
FRONTIER = load_cluster("frontier")


def lay(tp, pp, dp, mb=1, z=1, ac=True):
    return Layout(tp=tp, pp=pp, dp=dp, micro_batch=mb, zero_stage=z, recompute="full" if ac else "none")


# ------------------------------------------------------------------------------ the presets
# (L, h, a, g, f, V, s, global batch) from Meta's "The Llama 3 Herd of Models" (2024), Table 3.
LLAMA3 = {
    "llama3-8b": (32, 4096, 32, 8, 14336, 128256, 8192, 512),
    "llama3-70b": (80, 8192, 64, 8, 28672, 128256, 8192, 512),
    "llama3-405b": (126, 16384, 128, 8, 53248, 128256, 8192, 2048),
}


@pytest.mark.parametrize("name", LLAMA3)
def test_llama3_presets_load_with_the_published_architecture(name):
    m = load_model(name)
    L, h, a, g, f, V, s, gb = LLAMA3[name]
    assert (m.num_layers, m.hidden_size, m.num_attention_heads, m.num_query_groups, m.ffn_hidden_size,
            m.vocab_size, m.seq_length, m.global_batch) == (L, h, a, g, f, V, s, gb)
    assert (m.ffn_type, m.position_embedding, m.tie_embeddings, m.normalization, m.add_bias_linear) == \
        ("swiglu", "rope", False, "rmsnorm", False)
    assert m.head_size == 128 and m.kv_size == 8 * 128
    assert ModelSpec.from_dict(m.as_dict()) == m          # a stored study reads the model back


def test_gpt_presets_keep_the_gpt_architecture():
    for name in ("gpt-1.4b", "gpt-22b", "gpt-175b", "gpt-1t", "tiny", "small"):
        m = load_model(name)
        assert (m.num_query_groups, m.ffn_type, m.position_embedding, m.tie_embeddings, m.normalization,
                m.add_bias_linear) == (m.num_attention_heads, "gelu", "learned", True, "layernorm", True)
        assert m.ffn_hidden_size == 4 * m.hidden_size and m.kv_size == m.hidden_size


def test_a_stored_model_without_the_new_keys_reads_back_as_gpt():
    old = {"name": "gpt-175b", "num_layers": 96, "hidden_size": 12288, "num_attention_heads": 96,
           "seq_length": 2048, "vocab_size": 50688, "ffn_hidden_size": 49152, "global_batch": 640}
    assert ModelSpec.from_dict(old) == load_model("gpt-175b")


# ------------------------------------------------------------------------------ parameter counts
# Per layer: Q and O h x h, K and V h x kv, three h x f SwiGLU matrices, two RMSNorm weights (h each),
# no biases; plus the word embedding V*h, the untied LM head V*h and the final RMSNorm h.
#   8B:   attention 2*4096^2 + 2*4096*1024 = 33,554,432 + 8,388,608 = 41,943,040
#         FFN 3*4096*14336 = 176,160,768; norms 8,192 -> layer 218,112,000; x 32 = 6,979,584,000
#         embedding 128256*4096 = 525,336,576 (twice: untied) + final norm 4,096
#         total 6,979,584,000 + 1,050,673,152 + 4,096 = 8,030,261,248
#   70B:  attention 2*8192^2 + 2*8192*1024 = 134,217,728 + 16,777,216 = 150,994,944
#         FFN 3*8192*28672 = 704,643,072; norms 16,384 -> layer 855,654,400; x 80 = 68,452,352,000
#         embedding 128256*8192 = 1,050,673,152 (x 2) + 8,192 -> 70,553,706,496
#   405B: attention 2*16384^2 + 2*16384*1024 = 536,870,912 + 33,554,432 = 570,425,344
#         FFN 3*16384*53248 = 2,617,245,696; norms 32,768 -> layer 3,187,703,808; x 126 = 401,650,679,808
#         embedding 128256*16384 = 2,101,346,304 (x 2) + 16,384 -> 405,853,388,800
# (These are the released checkpoints' exact parameter counts: 8.03 B, 70.55 B, 405.85 B.)
PARAMS = {"llama3-8b": 8_030_261_248, "llama3-70b": 70_553_706_496, "llama3-405b": 405_853_388_800}
LAYER = {"llama3-8b": 218_112_000, "llama3-70b": 855_654_400, "llama3-405b": 3_187_703_808}


@pytest.mark.parametrize("name", LLAMA3)
def test_llama3_parameter_counts_hand_computed(name):
    m = load_model(name)
    assert m.layer_parameters == LAYER[name]
    assert m.num_parameters == PARAMS[name]
    # the memory model holds exactly these: one GPU, one stage, everything
    assert memory.stage_params(m, Layout(tp=1, pp=1, dp=1, micro_batch=1), 0) == PARAMS[name]


def test_gpt_parameter_count_is_the_sc21_formula():
    """GPT (tied, learned positions, biases, LayerNorm): L(12h^2 + 13h) + Vh + sh + 2h (Narayanan et al.
    2021, plus the final LayerNorm). 175B: 96*(12*12288^2 + 13*12288) + 50688*12288 + 2048*12288 + 2*12288."""
    m = load_model("gpt-175b")
    L, h, V, s = 96, 12288, 50688, 2048
    assert m.num_parameters == L * (12 * h * h + 13 * h) + V * h + s * h + 2 * h == 174_609_555_456
    assert memory.stage_params(m, Layout(tp=1, pp=1, dp=1, micro_batch=1), 0) == m.num_parameters            # tied: one copy on one stage
    # with pp > 1 the last stage keeps a copy of the tied embedding (DeepSpeed's TiedLayerSpec)
    assert sum(memory.stage_params(m, Layout(tp=1, pp=4, dp=1, micro_batch=1), i) for i in range(4)) == m.num_parameters + V * h


def test_untied_head_sits_on_the_last_stage_and_is_never_synchronised():
    m = load_model("llama3-8b")
    V, h = 128256, 4096
    stages = [memory.stage_params(m, Layout(tp=2, pp=4, dp=1, micro_batch=1), i) for i in range(4)]
    middle = 8 * memory.layer_params(m, 2)
    assert stages[1] == stages[2] == middle
    assert stages[0] == middle + V * h / 2                                    # embedding, no position table
    assert stages[3] == middle + V * h / 2 + h                                # LM head + final RMSNorm
    assert sum(memory.stage_params(m, Layout(tp=1, pp=4, dp=1, micro_batch=1), i) for i in range(4)) == m.num_parameters   # no copies
    assert memory.tied_embedding_params(m, 2, 4) == 0.0
    w = make_workload("llama3-8b", 1, H100)
    assert predict(lay(2, 4, 1), w).time_breakdown["embedding_sync"] == 0.0
    gpt = make_workload("gpt-1.4b", 1, H100)
    assert predict(lay(2, 4, 1), gpt).time_breakdown["embedding_sync"] > 0.0


def test_layer_params_per_tp_rank_hand_computed():
    m = load_model("llama3-8b")
    # (2h^2 + 2h*kv + 3hf)/t + 2h (two RMSNorm weights, no biases), t = 8: 218,103,808 / 8 + 8,192
    assert memory.layer_params(m, 8) == 218_103_808 / 8 + 8192
    gpt = load_model("gpt-175b")
    h = 12288
    assert memory.layer_params(gpt, 4) == (12 * h * h + 7 * h) / 4 + 6 * h


# ------------------------------------------------------------------------------ FLOPs
# Megatron's count per sample: 24*c*s*L*h^2*(G + s/(6h) + V/(16Lh)), G = (attention + FFN weights)/(12h^2),
# i.e. per token c*L*(2*(A + F) + 4*s*h) + 1.5*c*h*V; MFU uses c = 3, recompute c = 4.
#   8B, per token, c = 3: GEMMs 6*32*(41,943,040 + 176,160,768) = 6*32*218,103,808 = 41,875,931,136
#                         attention 12*32*8192*4096 = 12,884,901,888
#                         LM head 4.5*4096*128256 = 2,364,014,592
#                         sum 57,124,847,616 per token; x 8192 = 467,966,751,670,272 per sample
#                c = 4:   8*32*218,103,808 + 16*32*8192*4096 + 6*4096*128256
#                         = 55,834,574,848 + 17,179,869,184 + 3,152,019,456 = 76,166,463,488 per token
MODEL_FLOPS_PER_TOKEN = {"llama3-8b": 57_124_847_616}
MEGATRON_FLOPS_PER_TOKEN = {"llama3-8b": 76_166_463_488}


def per_token(name, c):
    L, h, a, g, f, V, s, _ = LLAMA3[name]
    kv = g * h // a
    weights = 2 * h * h + 2 * h * kv + 3 * h * f
    return c * L * (2 * weights + 4 * s * h) + 3 * c * h * V / 2


def test_llama3_8b_flops_hand_computed():
    m = load_model("llama3-8b")
    assert per_token("llama3-8b", 3) == MODEL_FLOPS_PER_TOKEN["llama3-8b"]
    assert per_token("llama3-8b", 4) == MEGATRON_FLOPS_PER_TOKEN["llama3-8b"]
    assert model_flops(m, 1) == pytest.approx(57_124_847_616 * 8192, rel=1e-12)
    assert megatron_flops(m, 1, True) == pytest.approx(76_166_463_488 * 8192, rel=1e-12)
    assert megatron_flops(m, 512, False) == pytest.approx(512 * model_flops(m, 1), rel=1e-12)


@pytest.mark.parametrize("name", LLAMA3)
def test_llama3_flops_per_architecture(name):
    m = load_model(name)
    s = m.seq_length
    assert model_flops(m, 1) == pytest.approx(per_token(name, 3) * s, rel=1e-12)
    assert megatron_flops(m, 1, True) == pytest.approx(per_token(name, 4) * s, rel=1e-12)
    # the layers' terms are Megatron-Core's num_floating_point_operations (12*s*L*h^2*((1 + g/a + s/h)
    # + 1.5*f/h) per sample for GQA + SwiGLU, no recompute); only the LM-head term differs (4.5 vs 6 shV)
    L, h, a, g, f, V, _, _ = LLAMA3[name]
    mcore_layers = 12 * s * L * h * h * ((1 + g / a + s / h) + 1.5 * f / h)
    assert model_flops(m, 1) - 4.5 * s * h * V == pytest.approx(mcore_layers, rel=1e-12)
    # about 6 FLOPs per parameter and token for the weights, plus attention and the head
    assert model_flops(m, 1) / s > 6 * (m.num_parameters - 2 * V * h)


def test_untying_changes_parameters_not_flops():
    m = load_model("llama3-8b")
    tied = dataclasses.replace(m, tie_embeddings=True)
    assert m.num_parameters - tied.num_parameters == 128256 * 4096
    assert model_flops(tied, 7) == model_flops(m, 7)
    assert megatron_flops(tied, 7, True) == megatron_flops(m, 7, True)


# ------------------------------------------------------------------------------ GQA == MHA when g = a
def test_gqa_with_groups_equal_to_heads_is_multi_head_exactly():
    gpt = load_model("gpt-175b")
    explicit = ModelSpec.from_dict({**gpt.as_dict(), "num_query_groups": 96})
    assert explicit == gpt
    w, we = make_workload(gpt, 16, FRONTIER, 640), make_workload(explicit, 16, FRONTIER, 640)
    for layout in valid_layouts(load_space("default"), w)[:60]:
        assert predict(layout, we) == predict(layout, w)
    # a Llama-style model with g = a has the multi-head sizes: 4h^2 attention, QKV GEMM 3h^2
    mha = dataclasses.replace(load_model("llama3-8b"), num_query_groups=32)
    h, f, s = 4096, 14336, 8192
    assert mha.kv_size == h and mha.attention_weights == 4 * h * h
    assert compute.layer_gemm_flops(mha, 1, 1)[0] == 2 * s * 3 * h * h
    assert sum(compute.layer_gemm_flops(mha, 1, 2)) == pytest.approx(2 * s * (4 * h * h + 3 * h * f) / 2)
    assert memory.split_activation_bytes(mha) == 8 + 6 * f / h
    assert model_flops(mha, 1) > model_flops(load_model("llama3-8b"), 1)


# ------------------------------------------------------------------------------ memory and compute
def test_llama3_8b_activations_hand_computed():
    m = load_model("llama3-8b")
    sbh = 8192 * 4096
    # split bytes per s*b*h: Q 2 + K, V 2*kv/h each (0.5 + 0.5) + O input 2 = 5; SwiGLU: gate and up
    # outputs 2*2f/h + fc2 input 2f/h = 6*14336/4096 = 21 -> 26; replicated 10
    assert memory.split_activation_bytes(m) == 26.0
    assert memory.activation_bytes_per_layer(m, Shape(1, 1), flash_attention=True) == 36 * sbh
    assert memory.activation_bytes_per_layer(m, Shape(2, 8), flash_attention=True) == pytest.approx(2 * (10 + 26 / 8) * sbh)
    assert memory.activation_bytes_per_layer(m, Shape(2, 8, sp=True), True) == pytest.approx(2 * 36 / 8 * sbh)
    # without FlashAttention the a*s^2 scores come back: 5*a*s/(h*t) = 5*32*8192/4096 = 320 at t = 1
    assert memory.activation_bytes_per_layer(m, Shape(1, 1), flash_attention=False) == 356 * sbh
    assert memory.split_activation_bytes(load_model("gpt-175b")) == 24.0           # Korthikanti et al.


def test_llama3_8b_gemm_and_elementwise_hand_computed():
    m = load_model("llama3-8b")
    s, h, kv, f = 8192, 4096, 1024, 14336
    qkv, proj, fc1, fc2 = compute.layer_gemm_flops(m, 1, 4)
    assert qkv == 2 * s * h * (h + 2 * kv) / 4          # 6144 wide: Q 4096, K 1024, V 1024
    assert proj == 2 * s * h * h / 4
    assert fc1 == 2 * s * h * 2 * f / 4                 # gate and up, fused
    assert fc2 == 2 * s * f * h / 4
    assert qkv + proj + fc1 + fc2 == pytest.approx(2 * s * (m.attention_weights + m.ffn_weights) / 4)
    # element-wise split bytes: attention I/O 4 + 4*kv/h = 5, SwiGLU 6f/h = 21, RoPE on Q and K 5 -> 31
    assert compute.elementwise_split_bytes(m) == 31.0
    assert compute.elementwise_split_bytes(load_model("gpt-175b")) == 24.0


def test_llama3_8b_on_one_h100_node_is_sane():
    w = make_workload("llama3-8b", 1, H100)
    preds = rank(valid_layouts(load_space("default"), w), w)
    fits = [p for p in preds if p.fits]
    assert fits, "llama3-8b fits at no layout on 8 H100s"
    best = fits[0]
    assert 0.2 < best.mfu < 0.7, best
    assert best.memory_gb <= H100.memory_gb
    # every term is named, and they add up
    assert {"weights", "gradients", "optimizer", "activations", "logits", "reserved"} <= set(best.memory_breakdown)
    assert {"gemm", "attention", "elementwise", "tp_comm", "bubble", "embedding_sync"} <= set(best.time_breakdown)
    assert sum(best.time_breakdown.values()) == pytest.approx(best.step_time_s)
    # 8B parameters at 16 bytes each do not fit one 80 GB GPU without sharding: ZeRO-0 DP-8 is refused
    assert not predict(lay(1, 1, 8, z=0), w).fits


def test_swiglu_costs_more_than_gelu_of_the_same_width():
    m = load_model("llama3-8b")
    gelu = dataclasses.replace(m, ffn_type="gelu")
    assert m.ffn_weights == 3 * 4096 * 14336 and gelu.ffn_weights == 2 * 4096 * 14336
    assert model_flops(m, 1) > model_flops(gelu, 1)
    assert memory.layer_params(m, 1) > memory.layer_params(gelu, 1)
    assert memory.split_activation_bytes(m) - memory.split_activation_bytes(gelu) == 2 * 14336 / 4096


def test_gqa_shrinks_kv_weights_activations_and_work():
    m = load_model("llama3-70b")
    mha = dataclasses.replace(m, num_query_groups=64)
    h = 8192
    assert mha.attention_weights - m.attention_weights == 2 * h * (h - 1024)
    assert memory.activation_bytes_per_layer(m, Shape(1, 8), True) < memory.activation_bytes_per_layer(mha, Shape(1, 8), True)
    assert sum(compute.layer_gemm_flops(m, 1, 8)) < sum(compute.layer_gemm_flops(mha, 1, 8))
    w, wm = make_workload(m, 8, H100), make_workload(mha, 8, H100)
    layout = lay(8, 4, 2)
    assert predict(layout, w).step_time_s < predict(layout, wm).step_time_s
    assert predict(layout, w).memory_gb < predict(layout, wm).memory_gb


# ------------------------------------------------------------------------------ bad input
BASE = {"name": "m", "num_layers": 2, "hidden_size": 64, "num_attention_heads": 8, "seq_length": 16,
        "vocab_size": 100}


@pytest.mark.parametrize("extra, words", [
    ({"num_query_groups": 3}, "num_query_groups 3 must divide num_attention_heads 8"),
    ({"num_query_groups": 16}, "num_query_groups 16 must divide num_attention_heads 8"),
    ({"num_query_groups": 0}, "'num_query_groups' must be > 0"),
    ({"ffn_type": "relu"}, "'ffn_type' must be one of 'gelu', 'swiglu', got 'relu'"),
    ({"position_embedding": "alibi"}, "'position_embedding' must be one of 'learned', 'rope'"),
    ({"normalization": "batchnorm"}, "'normalization' must be one of 'layernorm', 'rmsnorm'"),
    ({"tie_embeddings": "no"}, "'tie_embeddings' must be bool"),
    ({"ffn_type": "swiglu"}, "ffn_type \"swiglu\" needs ffn_hidden_size"),
    ({"ffn_type": "line\nbreak"}, "must be one of"),
])
def test_bad_architecture_is_one_line_spec_error(extra, words):
    with pytest.raises(SpecError) as exc:
        ModelSpec.from_dict({**BASE, **extra}, "m.toml")
    msg = str(exc.value)
    assert words in msg and "\n" not in msg and msg.startswith("m.toml: ")


def test_bad_architecture_in_a_file_names_the_file(tmp_path):
    p = tmp_path / "gqa.toml"
    p.write_text('name = "x"\nnum_layers = 2\nhidden_size = 64\nnum_attention_heads = 8\n'
                 'num_query_groups = 3\nseq_length = 16\nvocab_size = 100\n')
    with pytest.raises(SpecError, match=r"gqa\.toml: num_query_groups 3 must divide num_attention_heads 8"):
        load_model(str(p))


def test_mqa_and_valid_groups_load():
    for g in (1, 2, 4, 8):
        m = ModelSpec.from_dict({**BASE, "num_query_groups": g})
        assert m.kv_size == g * 8
    swiglu = ModelSpec.from_dict({**BASE, "ffn_type": "swiglu", "ffn_hidden_size": 176})
    assert swiglu.ffn_hidden_size == 176 and swiglu.ffn_matrices == 3


def test_tensor_parallelism_must_split_whole_key_value_heads():
    from tuner.layout import Layout, why_invalid
    from tuner.specs import make_workload
    w = make_workload("llama3-8b", 2, "h100")            # 8 KV heads, 32 query heads
    assert "num_query_groups 8" in why_invalid(Layout(tp=16, pp=1, dp=1, micro_batch=1), w)
    assert why_invalid(Layout(tp=8, pp=1, dp=2, micro_batch=1), w) is None


def test_the_harness_runs_only_what_it_can_build(tmp_path):
    """A study on the local runner's harness: its candidates leave out what the harness cannot run
    (virtual stages, context parallelism, an uneven split); a space with nothing else, an FP8 study and a
    model it cannot build are refused before anything is stored -- never run as something else."""
    import dataclasses

    import pytest as _pytest

    from tuner import study
    from tuner.errors import UsageError
    from tuner.space import SearchSpace, load_space
    from tuner.specs import make_workload
    from tuner.store import open_store
    store = open_store(f"sqlite:///{tmp_path}/s.db")
    w = make_workload("llama3-tiny", 1, "local")
    rec = study.new_record("ok", w, load_space(), runner="local", runner_options={"gpus": 2})
    cands = study.runnable_layouts(rec, w, load_space())
    assert cands and all(c.virtual_pipeline == 1 and c.context_parallel == 1 for c in cands)
    assert any(c.sequence_parallel for c in cands)                    # what it can build stays in
    wc = dataclasses.replace(w, framework="megatron-core")
    sim = study.new_record("sim", wc, load_space())
    # the simulator runs every layout the framework has: Megatron-Core's interleaving and context parallelism
    assert any(c.virtual_pipeline > 1 for c in study.runnable_layouts(sim, wc, load_space()))
    only_vp = SearchSpace.from_dict({"dimensions": {"tp": [1], "pp": [2], "virtual_pipeline": [2]}})
    for bad, words in ((study.new_record("vp", wc, only_vp, runner="local"), "cannot run virtual_pipeline = 2"),
                       (study.new_record("vp", w, only_vp, runner="local"), "megatron-deepspeed cannot run virtual"),
                       (study.new_record("mc", wc, load_space(), runner="local"), "trains as Megatron-DeepSpeed does"),
                       (study.new_record("fp8", dataclasses.replace(wc, precision="fp8"), load_space(), runner="local"),
                        "trains in bf16"),
                       (study.new_record("odd", dataclasses.replace(w, model=dataclasses.replace(
                           w.model, hidden_size=8 * 7, ffn_hidden_size=56)), load_space(), runner="local"),
                        "RoPE with an odd head size")):
        with _pytest.raises(UsageError, match=words):
            study.create(store, bad)
    assert store.study_names() == []
