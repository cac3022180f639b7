"""Layout rules, spec loading and search spaces (pure core)."""

import pytest
from hypothesis import given, settings, strategies as st

from tuner.errors import InvalidLayout, SpecError, UsageError
from tuner.layout import Layout, micro_batches_per_pipeline, validate, why_invalid
from tuner.space import SearchSpace, load_space, no_layout_reason
from tuner.presets import presets
from tuner.specs import ClusterSpec, ModelSpec, load_cluster, load_model, make_workload

W175 = make_workload("175b", 16)   # 128 GCDs, global batch 640


def L(**kw):
    base = dict(tp=4, pp=16, dp=2, micro_batch=1, zero_stage=1, recompute="full")
    return Layout(**{**base, **kw})


def test_study_layouts_are_valid():
    assert why_invalid(L(), W175) is None
    assert why_invalid(Layout(tp=1, pp=8, dp=2, micro_batch=1), make_workload("22b", 2)) is None
    assert why_invalid(Layout(tp=4, pp=128, dp=2, micro_batch=1), make_workload("1t", 128)) is None


@pytest.mark.parametrize("kw, words", [
    (dict(dp=4), "tp*pp*dp"),
    (dict(tp=3, dp=8, pp=16 // 3 or 1), "tp*pp*dp"),
    (dict(tp=8, pp=16, dp=1, micro_batch=3), "global batch"),
    (dict(tp=4, pp=32, dp=1), "not divisible by pp"),  # 96 layers / 32 is fine: check it is valid
    (dict(zero_stage=2), "ZeRO-2 with pp=16"),
    (dict(zero_stage=4), "zero_stage must be"),
    (dict(micro_batch=0), "micro_batch must be >= 1"),
])
def test_rules_name_what_breaks(kw, words):
    reason = why_invalid(L(**kw), W175)
    if kw == dict(tp=4, pp=32, dp=1):
        assert reason is None
        return
    assert reason and words in reason


def test_heads_and_layers_divisibility():
    assert "heads (200)" in why_invalid(Layout(tp=16, pp=1, dp=1, micro_batch=1), make_workload("1t", 2))
    w = make_workload("22b", 4)  # 32 GPUs, 48 layers
    assert "layers (48) are not divisible by pp=32" in why_invalid(Layout(tp=1, pp=32, dp=1, micro_batch=1), w)
    with pytest.raises(InvalidLayout, match="tp1-pp32"):
        validate(Layout(tp=1, pp=32, dp=1, micro_batch=1), w)


def test_layout_key_and_roundtrip():
    lay = L()
    assert lay.key() == "tp4-pp16-dp2-mb1-z1-rcfull"
    assert Layout.from_dict(lay.as_dict()) == lay
    modern = Layout(tp=8, sequence_parallel=True, context_parallel=2, pp=4, virtual_pipeline=5, dp=2, micro_batch=1,
                    recompute="selective")
    assert modern.key() == "tp8-sp1-cp2-pp4-vp5-dp2-mb1-z1-rcselective" and modern.gpus == 8 * 2 * 4 * 2
    assert Layout.from_dict(modern.as_dict()) == modern
    old = {k: v for k, v in lay.as_dict().items() if k != "recompute"}          # a layout written before recompute
    assert Layout.from_dict({**old, "activation_checkpointing": False}).recompute == "none"
    assert Layout.from_dict({**old, "activation_checkpointing": True}) == lay
    assert modern.env()["TUNER_RECOMPUTE"] == "selective" and modern.env()["TUNER_SEQUENCE_PARALLEL"] == "1"
    assert lay.env()["TUNER_ACTIVATION_CHECKPOINTING"] == "1"
    assert micro_batches_per_pipeline(lay, 640) == 320
    with pytest.raises(InvalidLayout, match="missing"):
        Layout.from_dict({"tp": 1})
    for bad, words in (({"tp": 2.7}, "tp = 2.7 must be a whole number"),
                       ({"sequence_parallel": 2}, "must be true/false"),
                       ({"recompute": "some"}, "must be one of none, moe_act, norm_act, selective, mlp, mla_up, mla_up_mlp, mla_up_mlp_moe, norm_moe, full"),
                       ({"checkpointing": True}, "unknown layout key")):
        with pytest.raises(InvalidLayout, match=words):          # never silently truncated or coerced
            Layout.from_dict({**lay.as_dict(), **bad})


def test_presets_and_aliases():
    m = load_model("175b")
    assert (m.name, m.num_layers, m.hidden_size, m.ffn_hidden_size) == ("gpt-175b", 96, 12288, 4 * 12288)
    assert 170e9 < m.num_parameters < 180e9
    assert 0.9e12 < load_model("1t").num_parameters < 1.1e12
    c = load_cluster("frontier")
    assert (c.gpus_per_node, c.peak_tflops) == (8, 191.5)
    assert c.memory_gb == pytest.approx(63.98 * 2 ** 30 / 1e9)      # a GCD's 64 GiB as HIP allocates it, in GB
    assert c.intra_group_bandwidth(2) > c.intra_group_bandwidth(8)
    assert {"gpt-1.4b", "gpt-22b", "gpt-175b", "gpt-1t", "tiny", "small"} <= set(presets("models"))


def test_unknown_names_list_presets():
    with pytest.raises(UsageError, match="presets: .*gpt-175b"):     # a usage error, not a malformed file
        load_model("gpt-9000")
    with pytest.raises(UsageError, match="frontier"):
        load_cluster("summit-x")


def test_spec_files_reject_bad_keys(tmp_path):
    p = tmp_path / "m.toml"
    p.write_text('name="x"\nnum_layers=2\nhidden_size=8\nnum_attention_heads=2\nseq_length=4\nvocab_size=10\nlayers=3\n')
    with pytest.raises(SpecError, match=r"m.toml: unknown model key\(s\) layers; valid keys: name"):
        load_model(str(p))
    p.write_text('name="x"\nnum_layers=2\n')
    with pytest.raises(SpecError, match="missing model key"):
        load_model(str(p))
    p.write_text('name="x"\nnum_layers="two"\nhidden_size=8\nnum_attention_heads=2\nseq_length=4\nvocab_size=10\n')
    with pytest.raises(SpecError, match="'num_layers' must be int"):
        load_model(str(p))
    p.write_text('name = "x\nnum_layers=2\n')
    with pytest.raises(SpecError, match="malformed TOML.*line 1"):
        load_model(str(p))


def test_cluster_fraction_keys_checked():
    with pytest.raises(SpecError, match="matmul_efficiency"):
        ClusterSpec.from_dict({**load_cluster("frontier").as_dict(), "matmul_efficiency": 1.5})


def test_workload_needs_batch_and_nodes():
    m = ModelSpec("m", 2, 8, 2, 4, 10)
    with pytest.raises(UsageError, match="--global-batch"):
        make_workload(m, 1)
    with pytest.raises(UsageError, match="--nodes"):
        make_workload("175b", 0)


def test_default_space_enumerates_only_valid_layouts():
    sp = load_space()
    layouts = sp.enumerate_layouts(W175)
    assert L() in layouts
    assert len(layouts) == len(set(layouts)) > 100
    assert all(why_invalid(x, W175) is None and x.gpus == W175.gpus for x in layouts)
    assert all(not (x.pp > 1 and x.zero_stage >= 2) for x in layouts)


@settings(max_examples=60, deadline=None)
@given(model=st.sampled_from(["gpt-1.4b", "22b", "175b", "1t", "tiny", "small"]),
       nodes=st.sampled_from([1, 2, 3, 4, 6, 8, 16, 64, 128]))
def test_every_enumerated_layout_is_valid(model, nodes):
    w = make_workload(model, nodes)
    for lay in load_space().enumerate_layouts(w):
        assert lay.tp * lay.pp * lay.dp == w.gpus
        assert why_invalid(lay, w) is None


def test_space_constraints_and_errors(tmp_path):
    sp = SearchSpace.from_dict({"dimensions": {"tp": [1, 2], "pp": [1, 2], "micro_batch": [1]},
                                "constraints": {"tp_in_node": "tp <= gpus_per_node and m >= 2"}})
    w = make_workload("tiny", 1, "frontier")
    assert all(x.tp <= 2 for x in sp.enumerate_layouts(w))
    assert "tp=4 is not among" in sp.why_invalid(Layout(tp=4, pp=2, dp=1, micro_batch=1), w)
    with pytest.raises(SpecError, match="unknown name 'foo'"):
        SearchSpace.from_dict({"constraints": {"c": "foo > 1"}})
    with pytest.raises(SpecError, match="unsupported Call"):
        SearchSpace.from_dict({"constraints": {"c": "__import__('os')"}})
    with pytest.raises(SpecError, match="unknown dimension"):
        SearchSpace.from_dict({"dimensions": {"tpp": [1]}})
    with pytest.raises(SpecError, match="not found"):
        load_space("nope")


def test_no_layout_reason_names_the_rule():
    sp = load_space()
    w = make_workload("gpt-1t", 1)   # 8 GPUs, 200 heads: tp 8/16 do not divide the heads
    assert sp.enumerate_layouts(w)    # tp 1/2/4 still work
    tiny = ModelSpec("odd", 3, 6, 3, 4, 10, global_batch=7)
    w2 = make_workload(tiny, 1)      # 8 GPUs; batch 7 is prime to dp
    assert not sp.enumerate_layouts(w2)
    assert no_layout_reason(sp, w2)


@pytest.mark.parametrize("model, cluster, nodes, pins, rule", [
    ("gpt-22b", "frontier", 2, {"expert_parallel": 2}, "expert_parallel 2 needs a mixture-of-experts model"),
    ("mixtral-8x7b", "h100", 8, {"expert_parallel": 3}, "num_experts (8) is not divisible by expert_parallel=3"),
    ("mixtral-8x7b", "h100", 1, {"expert_parallel": 8, "expert_tensor_parallel": 4, "tp": 1},
     "ep*etp = 8*4 does not divide tp*cp*dp = 8"),
])
def test_no_layout_reason_probes_the_expert_dimensions(model, cluster, nodes, pins, rule):
    """Issue 20 review: a pinned ep / etp that leaves no layout is blamed, not the probe's plain ep 1."""
    sp, w = load_space().pinned(pins), make_workload(model, nodes, cluster)
    assert not sp.enumerate_layouts(w)
    assert rule in no_layout_reason(sp, w)


def test_no_layout_reason_is_given_whole(tuner, tmp_path):
    """Issue 12 item 10: the reason is the whole sentence, numbers and parentheses included."""
    odd = ModelSpec("odd", 2, 8, 2, 4, 16, global_batch=7)     # 8 GPUs: tp, pp <= 2, so dp >= 2
    assert not load_space().enumerate_layouts(make_workload(odd, 1))
    reason = "global batch (7) is not divisible by micro_batch*dp = 1*8"
    assert no_layout_reason(load_space(), make_workload(odd, 1)).startswith(reason + " (other layouts")  # issue 28
    (tmp_path / "odd.toml").write_text('name = "odd"\nnum_layers = 2\nhidden_size = 8\nnum_attention_heads = 2\n'
                                       'seq_length = 4\nvocab_size = 16\nglobal_batch = 7\n')
    code, _, err = tuner("plan", "--model", str(tmp_path / "odd.toml"), "--nodes", "1")
    assert code == 2 and f"(8 GPUs): {reason} (other layouts are also refused: " in err, err


def test_the_embedding_and_loss_aware_split():
    """126 layers (llama3-405b) over pp 8: not divisible, but 126 + 2 is -- Megatron-Core's split that
    counts the embedding and the loss as one layer each: 16 per rank, 15 on the first and the last."""
    from tuner.layout import stage_layers, uneven_split
    from tuner.space import load_space
    w = make_workload("llama3-405b", 128, "h100")
    lay = Layout(tp=8, sequence_parallel=True, context_parallel=2, pp=8, dp=8, micro_batch=1)
    assert why_invalid(lay, w) is None and uneven_split(lay, 126)
    assert [stage_layers(lay, 126, s) for s in range(8)] == [15] + [16] * 6 + [15]
    assert sum(stage_layers(lay, 126, s) for s in range(8)) == 126
    even = Layout(tp=8, pp=9, dp=16, micro_batch=1)
    assert not uneven_split(even, 126) and stage_layers(even, 126, 0) == 14
    bad = Layout(tp=8, pp=16, virtual_pipeline=3, dp=8, micro_batch=1)        # 48 divides neither 126 nor 128
    assert "nor are layers + 2" in why_invalid(bad, w)
    assert {8, 16, 64, 9, 14} <= set(load_space().choices("pp", w))          # stages:num_layers
    study = load_space("frontier-2023").enumerate_layouts(w)                  # DeepSpeed's even stages only
    assert study and not any(uneven_split(c, 126) for c in study)
