"""Mixture-of-experts models and expert parallelism (issue 20): the model keys and presets against the
published parameter counts, the layout rules of ep / etp, active-parameter FLOPs, memory sharded by EP,
the all-to-all inside a node and across nodes, the launch flags (checked against the frameworks' own
argument definitions), the search space, the store migration and the CLI."""

from __future__ import annotations

import dataclasses
import tomllib

import pytest
from sqlalchemy import text

from tuner.errors import SpecError
from tuner.frameworks import FRAMEWORKS
from tuner.layout import Layout, expert_data_parallel, stage_layer_indices, stage_layers, stage_moe_layers, why_invalid
from tuner.perfmodel import comm, memory, predict
from tuner.perfmodel.compute import shape_of
from tuner.perfmodel.flops import model_flops
from tuner.perfmodel.moe_exchange import (FLEX_EFFICIENCY, TokenExchange, alltoall_seconds, dispatcher_for,
                                          ep_group_nodes, flex_alltoall_time, flex_backend)
from tuner.render import mcore, torchtitan
from tuner.space import load_space
from tuner.specs import ModelSpec, load_cluster, load_model, make_workload
from tuner.store import SCHEMA_VERSION, open_store
from tuner.store.store import upgrade

from tests.test_launch_frameworks import MCORE_FLAGS, TORCHTITAN_KEYS, toml_keys
from tests.test_store import ok, study

# Megatron-LM at d98e8a64ddf3 (as tests/test_launch_frameworks.py): A: megatron/training/arguments.py, TC:
# megatron/core/transformer/transformer_config.py, MPC: megatron/core/model_parallel_config.py. The TC and MPC
# fields are generated flags (ArgumentGroupFactory, "--" + field with "_" -> "-"); none of them is in
# arguments.py's exclude list (lines 2279-2371), which does exclude moe_layer_freq,
# moe_router_load_balancing_type and moe_aux_loss_coeff: those three are the literal A: flags.
MOE_FLAGS = {
    "--num-experts": "A:3518 (num_moe_experts is excluded from the generated flags: 'args uses same var')",
    "--moe-router-topk": "TC:760", "--moe-ffn-hidden-size": "TC:740",
    "--moe-layer-freq": "A:3520 (moe_freq_type: an int or a list expression)",
    "--moe-token-dispatcher-type": "TC:891 ('allgather' | 'alltoall' | 'flex', default allgather)",
    "--moe-flex-dispatcher-backend": "TC:898 ('deepep' | 'hybridep' | 'ncclep'; only hybridep in the MNNVL case)",
    "--moe-router-dtype": "TC:811 ('fp32' | 'fp64'; moe/token_dispatcher.py 1135-1139, 1312-1316: HybridEP and "
                          "DeepEP take fp32 probabilities)",
    "--moe-grouped-gemm": "TC:850", "--moe-shared-expert-intermediate-size": "TC:701",
    "--moe-expert-capacity-factor": "TC:917", "--moe-router-score-function": "TC:808 ('softmax' | 'sigmoid')",
    "--moe-router-num-groups": "TC:780", "--moe-router-group-topk": "TC:796",
    "--moe-router-topk-scaling-factor": "TC:804", "--moe-router-enable-expert-bias": "TC:816",
    "--moe-router-load-balancing-type": "A:3532 ('aux_loss' | 'seq_aux_loss' | ...)", "--moe-aux-loss-coeff": "A:3536",
    "--expert-model-parallel-size": "MPC:127", "--expert-tensor-parallel-size": "MPC:130 (None: tp, arguments.py 587)",
    "--overlap-moe-expert-parallel-comm": "MPC:343 (transformer_config.py 3002-3041: ep > 1, no full recompute, "
                                           "vp with pp > 1, alltoall/flex dispatcher)",
    "--delay-wgrad-compute": "MPC:348 (TC:3073-3077: only with --overlap-moe-expert-parallel-comm; A:1903-1906: "
                             "transformer_engine, TE >= 2.8.0 with --overlap-grad-reduce)",
    "--kv-channels": "TC:184", "--qk-layernorm": "TC:259", "--multi-latent-attention": "TC:288",
    "--q-lora-rank": "A:3548", "--kv-lora-rank": "A:3550", "--qk-head-dim": "A:3552",
    "--qk-pos-emb-head-dim": "A:3554", "--v-head-dim": "A:3556",
}
# torchtitan at 238fa9953e4a (as TORCHTITAN_KEYS): torchtitan/config/job_config.py.
TORCHTITAN_MOE_KEYS = {
    "parallelism.expert_parallel_degree": "Parallelism:454",
    "parallelism.expert_tensor_parallel_degree": "Parallelism:464 ('etp = tp' or 'etp = 1')",
    "quantize.grouped_mm.float8.fqns": "Float8GroupedMM:757 (converter name: components/quantization/float8.py:239)",
}
PRESETS = ("mixtral-8x7b", "mixtral-8x22b", "qwen3-30b-a3b", "qwen3-235b-a22b", "deepseek-v3")


def h100(model: str, nodes: int, framework: str = "megatron-core", precision: str = "bf16"):
    return make_workload(model, nodes, "h100", precision=precision, framework=framework)


# ------------------------------------------------------------------------------------ presets, counts
@pytest.mark.parametrize("name, total, active", [
    ("mixtral-8x7b", 46.7e9, 12.9e9),          # Jiang et al. 2024 (arXiv:2401.04088)
    ("mixtral-8x22b", 141e9, 39e9),            # Mistral AI's announcement
    ("qwen3-30b-a3b", 30.5e9, 3.3e9),          # Qwen3 technical report, Table 2
    ("qwen3-235b-a22b", 235e9, 22e9),
])
def test_preset_parameters_match_the_published_totals(name, total, active):
    m = load_model(name)
    assert m.num_parameters == pytest.approx(total, rel=0.01)
    assert m.active_parameters == pytest.approx(active, rel=0.02)


def test_deepseek_v3_counts_and_its_dense_layers():
    """671 B total; 36.7 B activated of which 0.9 B the output head (DeepSeek-V3's README_WEIGHTS.md), so
    the count leaves out the input embedding, which multiplies nothing."""
    m = load_model("deepseek-v3")
    assert m.num_parameters == pytest.approx(671e9, rel=0.002)
    assert m.active_parameters - m.vocab_size * m.hidden_size == pytest.approx(36.7e9, rel=0.005)
    assert m.moe_layer_pattern[:4] == (False, False, False, True) and m.num_moe_layers == 58
    mla = m.attention_weights          # q 7168x1536 + 1536x128x192, kv 7168x576 + 512x128x256, o 16384x7168
    assert mla == 7168 * 1536 + 1536 * 128 * 192 + 7168 * 576 + 512 * 128 * 256 + 128 * 128 * 7168


def test_every_layer_is_counted_once():
    m = load_model("deepseek-v3")
    dense = m.num_layers - m.num_moe_layers
    assert m.num_parameters == (dense * m.layer_parameters + m.num_moe_layers * m.moe_layer_parameters
                                + m.embedding_parameters + m.output_parameters)
    moe_layer = m.moe_dense_parameters + m.num_experts * m.expert_parameters
    assert m.moe_layer_parameters == moe_layer and m.expert_parameters == 3 * 7168 * 2048


def test_model_keys_are_checked():
    base = {"name": "x", "num_layers": 4, "hidden_size": 64, "num_attention_heads": 4, "seq_length": 128,
            "vocab_size": 100, "ffn_type": "swiglu", "ffn_hidden_size": 128}
    with pytest.raises(SpecError, match="needs moe_top_k"):
        ModelSpec.from_dict({**base, "num_experts": 8})
    with pytest.raises(SpecError, match="describe experts: set num_experts"):
        ModelSpec.from_dict({**base, "moe_top_k": 2})
    with pytest.raises(SpecError, match="moe_router_num_groups 3 must divide num_experts 8"):
        ModelSpec.from_dict({**base, "num_experts": 8, "moe_top_k": 2, "moe_router_num_groups": 3,
                             "moe_router_group_topk": 1})
    with pytest.raises(SpecError, match="multi_latent_attention needs kv_lora_rank"):
        ModelSpec.from_dict({**base, "multi_latent_attention": True})
    m = ModelSpec.from_dict({**base, "num_experts": 8, "moe_top_k": 2})
    assert m.moe_ffn_hidden_size == 128 and m.moe_layer_pattern == (True,) * 4     # default: the FFN width


@pytest.mark.parametrize("name", PRESETS + ("llama3-70b", "175b"))
def test_stored_form_round_trips_and_a_dense_model_keeps_its_old_form(name):
    m = load_model(name)
    assert ModelSpec.from_dict(m.as_dict()) == m
    if not m.is_moe:
        assert not {"num_experts", "moe_top_k", "head_dim", "multi_latent_attention"} & set(m.as_dict())


# ------------------------------------------------------------------------------------------- FLOPs
def test_flops_count_the_active_experts_only():
    """MFU's FLOPs: top_k routed experts (and shared ones, and the router) per token, never the others:
    doubling the experts at the same top_k doubles the expert parameters and leaves the FLOPs."""
    m = load_model("mixtral-8x7b")
    more = dataclasses.replace(m, num_experts=16)
    assert more.num_parameters - m.num_parameters == 8 * 32 * (m.expert_parameters + m.hidden_size)   # + router rows
    s, h, L, V = m.seq_length, m.hidden_size, m.num_layers, m.vocab_size
    expected = 6 * s * (m.gemm_weights_per_token + V * h * 0.75) + 12 * s * s * h * L
    assert model_flops(m, 1) == pytest.approx(expected, rel=1e-9)
    # top_k x expert FLOPs per MoE layer, plus attention and router
    per_layer = m.attention_weights + m.router_parameters + 2 * m.expert_parameters
    assert m.gemm_weights_per_token == L * per_layer
    assert model_flops(more, 1) - model_flops(m, 1) == pytest.approx(6 * s * L * h * 8, rel=1e-9)  # the router only


def test_dense_flops_are_unchanged():
    m = load_model("175b")
    s, h, L, V = m.seq_length, m.hidden_size, m.num_layers, m.vocab_size
    assert model_flops(m, 1) == pytest.approx(72 * s * L * h * h * (1 + s / (6 * h) + V / (16 * L * h)), rel=1e-12)


# ------------------------------------------------------------------------------------------- rules
def test_layout_rules_of_expert_parallelism():
    w = h100("mixtral-8x7b", 8)
    good = Layout(tp=2, sequence_parallel=True, pp=1, dp=32, expert_parallel=8, micro_batch=1)
    assert why_invalid(good, w) is None and expert_data_parallel(good) == 8
    assert "not divisible by expert_parallel=16" in why_invalid(dataclasses.replace(good, expert_parallel=16), w)
    folded = dataclasses.replace(good, tp=8, dp=8, expert_parallel=8, expert_tensor_parallel=8)
    assert why_invalid(folded, w) is None      # MoE parallel folding: ep*etp = 64 = tp*cp*dp
    too_many = Layout(tp=1, pp=8, dp=8, expert_parallel=8, expert_tensor_parallel=2, micro_batch=1)
    assert "does not divide tp*cp*dp = 8" in why_invalid(too_many, w)
    assert "only with sequence_parallel on" in why_invalid(dataclasses.replace(good, sequence_parallel=False), w)
    dense = h100("llama3-8b", 1)
    assert "needs a mixture-of-experts model" in why_invalid(Layout(tp=1, pp=1, dp=8, expert_parallel=2,
                                                                     micro_batch=1), dense)


def test_framework_rules():
    lay = Layout(tp=2, sequence_parallel=True, pp=1, dp=32, expert_parallel=8, micro_batch=1, zero_stage=1)
    assert "DeepSpeed-MoE" in why_invalid(lay, h100("mixtral-8x7b", 8, "megatron-deepspeed"))
    tt = h100("mixtral-8x7b", 8, "torchtitan")
    z3 = dataclasses.replace(lay, zero_stage=3)
    assert why_invalid(z3, tt) is None
    assert "ETP=TP or ETP=1" in why_invalid(dataclasses.replace(z3, tp=4, dp=16, expert_tensor_parallel=2), tt)
    assert "must equal tp (2)" in why_invalid(dataclasses.replace(z3, expert_parallel=1), tt)


def test_dense_layout_keys_do_not_change():
    assert Layout(tp=4, pp=16, dp=2, micro_batch=1).key() == "tp4-pp16-dp2-mb1-z1-rcfull"
    moe = Layout(tp=2, sequence_parallel=True, pp=4, dp=16, expert_parallel=8, expert_tensor_parallel=2, micro_batch=1)
    assert moe.key() == "tp2-sp1-pp4-dp16-ep8-etp2-mb1-z1-rcfull"
    assert Layout.from_dict(moe.as_dict()) == moe
    assert Layout.from_dict({"tp": 4, "pp": 16, "dp": 2, "micro_batch": 1}).expert_parallel == 1


def test_stage_layers_follow_megatrons_chunks():
    m = load_model("deepseek-v3")
    lay = Layout(tp=1, pp=3, dp=1, micro_batch=1)             # (61 + 2) / 3: 20, 21, 20 layers
    sizes = [len(stage_layer_indices(lay, 61, s)) for s in range(3)]
    assert sizes == [stage_layers(lay, 61, s) for s in range(3)] == [20, 21, 20]
    assert [stage_moe_layers(lay, m, s) for s in range(3)] == [17, 21, 20]    # the 3 dense layers on stage 0


# ------------------------------------------------------------------------------------------ memory
def test_expert_memory_shrinks_with_ep_and_is_sharded_over_expert_dp():
    w = h100("mixtral-8x7b", 8)
    mems = {}
    for ep in (1, 2, 4, 8):
        lay = Layout(tp=1, pp=4, dp=16, expert_parallel=ep, micro_batch=1, zero_stage=1)
        experts = memory.stage_expert_params(w.model, lay, 0)
        assert experts == pytest.approx(8 * w.model.num_layers // 4 * w.model.expert_parameters / ep)
        mems[ep] = memory.stage_memory(lay, w, 0, 16)
    assert mems[1]["weights"] > mems[2]["weights"] > mems[4]["weights"] > mems[8]["weights"]
    # the distributed optimizer shards expert states over expert-dp = 16/ep: their optimizer bytes stay equal
    lay1, lay8 = (Layout(tp=1, pp=4, dp=16, expert_parallel=e, micro_batch=1) for e in (1, 8))
    e1, e8 = (memory.stage_expert_params(w.model, lay, 0) for lay in (lay1, lay8))
    dense = memory.stage_params(w.model, lay1, 0) - e1
    assert mems[1]["optimizer"] * 1e9 == pytest.approx(12 * dense / 16 + 12 * e1 / 16)
    assert mems[8]["optimizer"] * 1e9 == pytest.approx(12 * dense / 16 + 12 * e8 / 2)


def test_the_expert_gradients_sync_is_its_own_term_beside_the_dense_one():
    """The DP time is two collectives: the dense parameters' over the data-parallel group, the experts' over
    the expert-dp group (issue 30). Split in the breakdown, the step unchanged: the expert part grows with the
    experts a GPU holds and vanishes when every expert has one replica (expert-dp 1); a dense model has none."""
    w = h100("mixtral-8x7b", 8)
    for zero, ep, etp in ((3, 1, 1), (3, 2, 4), (0, 2, 1), (0, 8, 8)):
        lay = Layout(tp=1, pp=1, dp=64, expert_parallel=ep, expert_tensor_parallel=etp, micro_batch=1, zero_stage=zero)
        pr = predict(lay, w)
        t = pr.time_breakdown
        assert sum(t.values()) == pytest.approx(pr.step_time_s, rel=1e-12)
        expert = t["dp_expert_grad_reduce"] + t["dp_expert_param_gather"]
        if expert_data_parallel(lay) == 1:
            assert expert == 0.0
        else:
            assert expert > 5 * (t["dp_grad_reduce"] + t["dp_param_gather"]) > 0     # Mixtral: 96 % of it is experts
    mcore = lambda name: predict(Layout(tp=1, pp=1, dp=16, micro_batch=1, zero_stage=3), h100(name, 2))   # noqa: E731
    assert "dp_expert_grad_reduce" not in mcore("llama3-8b").time_breakdown
    assert mcore("qwen3-30b-a3b").time_breakdown["dp_expert_grad_reduce"] > 0     # FSDP's layer-by-layer path


# ------------------------------------------------------------------------------------- all-to-all
def test_alltoall_inside_a_node_is_faster_than_across_nodes():
    c = load_cluster("h100")
    n = 256e6
    inside, across = comm.alltoall_time(c, n, 8, 1), comm.alltoall_time(c, n, 16, 1)
    assert across > 3 * inside                     # NVLink 450 GB/s against 50 GB/s of injection per GPU
    assert comm.alltoall_time(c, n, 8, 2) > inside      # ep 8, etp 2: 16 consecutive ranks, two nodes
    assert ep_group_nodes(c, 8, 1) == 1 and ep_group_nodes(c, 8, 2) == 2 and ep_group_nodes(c, 64, 1) == 8
    assert comm.alltoall_time(c, n, 1, 1) == 0.0


def test_the_alltoall_is_its_own_term_in_predict():
    """With full recompute Megatron-Core cannot overlap it: the term is whole, and larger when the EP
    group leaves the node (ep 16) than inside it (ep 8) for the same tokens (the alltoall dispatcher: more
    than twice; the dispatcher tuner picks, `dispatcher_for`, is never slower than it)."""
    w = h100("qwen3-30b-a3b", 2)
    inside = Layout(tp=1, pp=1, dp=16, expert_parallel=8, micro_batch=1, recompute="full")
    across = dataclasses.replace(inside, expert_parallel=16)
    plain = TokenExchange(dispatcher="alltoall")
    a, b = predict(inside, w, plain), predict(across, w, plain)
    assert a.time_breakdown["all_to_all"] > 0 and b.time_breakdown["all_to_all"] > 2 * a.time_breakdown["all_to_all"]
    m = 512 // 16
    per_layer = alltoall_seconds(w.model, w.cluster, shape_of(inside, w))
    assert a.time_breakdown["all_to_all"] == pytest.approx(m * 48 * per_layer)
    for lay, alltoall in ((inside, a), (across, b)):
        picked = predict(lay, w).time_breakdown["all_to_all"]
        assert 0 < picked <= alltoall.time_breakdown["all_to_all"]
    assert predict(across, w).time_breakdown["all_to_all"] > predict(inside, w).time_breakdown["all_to_all"]
    dense = predict(Layout(tp=1, pp=1, dp=16, micro_batch=1), h100("llama3-8b", 2))
    assert "all_to_all" not in dense.time_breakdown


def test_megatron_core_overlaps_the_alltoall_only_where_it_may():
    w = h100("qwen3-30b-a3b", 2)
    lay = Layout(tp=1, pp=1, dp=16, expert_parallel=16, micro_batch=1, recompute="none")
    fw = FRAMEWORKS["megatron-core"]
    assert fw.ep_overlap(lay) and not fw.ep_overlap(dataclasses.replace(lay, recompute="full"))
    assert not fw.ep_overlap(dataclasses.replace(lay, pp=2, dp=8, expert_parallel=8))        # pp > 1 needs vp
    assert not FRAMEWORKS["torchtitan"].ep_overlap(lay)
    hidden, whole = predict(lay, w), predict(lay, dataclasses.replace(w, framework="torchtitan"))
    assert hidden.time_breakdown["all_to_all"] < whole.time_breakdown["all_to_all"]


def test_an_exchange_without_the_overlap_exposes_the_whole_alltoall():
    """A run configured without --overlap-moe-expert-parallel-comm (NVIDIA's Qwen3-30B-A3B H100 config):
    every dispatch and combine of every micro-batch shows; the default is what `launch` writes."""
    w = h100("qwen3-30b-a3b", 2)
    lay = Layout(tp=1, pp=1, dp=16, expert_parallel=16, micro_batch=1, recompute="none")
    off = predict(lay, w, TokenExchange(overlap=False))
    sh = shape_of(lay, w)
    per_layer = alltoall_seconds(w.model, w.cluster, sh, dispatcher_for(w.model, w.cluster, sh, w.framework))
    assert off.time_breakdown["all_to_all"] == pytest.approx((512 // 16) * 48 * per_layer)
    assert predict(lay, w).time_breakdown["all_to_all"] < off.time_breakdown["all_to_all"]
    assert predict(lay, w, TokenExchange(overlap=True)).step_time_s == predict(lay, w).step_time_s
    full = dataclasses.replace(lay, recompute="full")      # Megatron-Core refuses the overlap there: no effect
    assert predict(full, w, TokenExchange(overlap=True)).step_time_s == predict(full, w).step_time_s


def test_the_overlap_hides_each_exchange_only_under_its_own_phase():
    """Megatron-Core's 1F1B A2A overlap pairs combine_bwd with the attention forward, dispatch fwd + bwd with
    the MLP's backward and forward, combine_fwd with the attention backward: compute in one phase cannot hide
    the exchange of another (the old stage-wide account hid 4 s under 5 s of compute here)."""
    from tuner.perfmodel.moe_exchange import exposed_alltoall
    assert exposed_alltoall(4.0, 0.0, 0.0, 1 / 3) == 4.0                  # no compute: all of it shows
    assert exposed_alltoall(4.0, 3.0, 2.0, 1 / 3) == 0.0                  # every phase covers its exchange
    assert exposed_alltoall(4.0, 4.5, 0.5, 1 / 3) == pytest.approx(1.5)   # MLP too short: 2 - 0.5 shows
    assert exposed_alltoall(4.0, 0.6, 5.0, 1 / 3) == pytest.approx(0.8 + 0.6)   # attention too short both ways


def test_the_overlap_shows_the_exchanges_of_the_unpaired_passes():
    """Megatron-Core's combined 1F1B runs its warm-up forwards and cool-down backwards unpaired: pp 1, one of each
    (combined_1f1b_schedule_for_no_pipelining); interleaved, (pp - rank - 1) * 2 + (vp - 1) * pp + 1 chunk passes of
    the rank's m * vp (get_pp_rank_microbatches). Their exchanges show whole, so fewer micro-batches expose more."""
    from tuner.perfmodel import stage_times
    from tuner.perfmodel.moe_exchange import unpaired_share
    assert unpaired_share(1, 1, 0, 32) == pytest.approx(1 / 32)
    assert unpaired_share(8, 4, 0, 128) == pytest.approx(39 / 512)       # 14 + 24 + 1 warm-up chunk passes
    assert unpaired_share(8, 4, 7, 128) == pytest.approx(25 / 512)
    assert unpaired_share(8, 4, 0, 4) == 1.0                              # all in warm-up: none paired
    w = h100("qwen3-30b-a3b", 2)
    lay = Layout(tp=1, pp=1, dp=16, expert_parallel=16, micro_batch=1, recompute="none")
    sh = shape_of(lay, w)
    a2a = alltoall_seconds(w.model, w.cluster, sh, dispatcher_for(w.model, w.cluster, sh, w.framework))
    shown = stage_times(lay, w)[0]["all_to_all"] / 48
    paired = stage_times(lay, dataclasses.replace(w, global_batch=10 ** 7))[0]["all_to_all"] / 48
    assert paired < shown < a2a
    assert shown == pytest.approx(a2a / 32 + paired * 31 / 32, rel=1e-3)     # m = 512 / 16 = 32


def test_the_flex_kernels_take_their_sms_from_the_compute_they_hide_under():
    """DeepEP's kernels hold 20 SMs (deep_ep/buffer.py num_sms) of an H100's 132 while they run: compute beside an
    overlapped exchange runs 20/132 slower for as long as it hides it; none without the overlap, none for NCCL's
    alltoall (in the measured efficiencies), none on a cluster that states no sm_count."""
    from tuner.perfmodel import SM_SHARE, stage_times
    from tuner.perfmodel.moe_exchange import FLEX_SMS, sm_contention
    w = h100("qwen3-30b-a3b", 2)
    assert w.cluster.sm_count == 132 and FLEX_SMS == 20
    assert sm_contention(w.cluster, "flex", 1.32) == pytest.approx(0.2) and sm_contention(w.cluster, "alltoall", 1.0) == 0
    assert sm_contention(dataclasses.replace(w.cluster, sm_count=None), "flex", 1.0) == 0
    lay = Layout(tp=1, pp=1, dp=16, expert_parallel=16, micro_batch=1, recompute="none")
    on = stage_times(lay, w, exchange=TokenExchange(overlap=True, dispatcher="flex"))[0]
    assert on[SM_SHARE] == pytest.approx(on["hidden_under_compute"] * 20 / 132)
    assert SM_SHARE not in stage_times(lay, w, exchange=TokenExchange(overlap=False, dispatcher="flex"))[0]
    assert SM_SHARE not in stage_times(lay, w, exchange=TokenExchange(overlap=True, dispatcher="alltoall"))[0]


def test_the_flex_dispatcher_sends_a_token_once_per_remote_node():
    """HybridEP / DeepEP: over 2 nodes of 8 a token with top-8 of 128 experts crosses the network once
    (it almost surely has an expert on the other node), where the alltoall dispatcher sends the 4 copies
    for the other node's experts; NVLink carries one copy per GPU hit, not per expert."""
    w = h100("qwen3-30b-a3b", 2)
    sh = shape_of(Layout(tp=1, pp=1, dp=16, expert_parallel=16, micro_batch=1, recompute="none"), w)
    m, c = w.model, w.cluster
    tokens = 4096
    flex = flex_alltoall_time(m, c, sh, 2.0 * m.hidden_size)
    one_copy = tokens * 2.0 * m.hidden_size / (FLEX_EFFICIENCY["network"] * comm.GB * c.inter_node_bandwidth_gbps / 8)
    assert one_copy < flex < 1.01 * one_copy + 2 * c.latency_us * 1e-6
    alltoall = comm.alltoall_time(c, tokens * m.moe_top_k * 2.0 * m.hidden_size, 16, 1)
    nccl_copy = one_copy * FLEX_EFFICIENCY["network"] / c.network_efficiency    # at NCCL's efficiency, not DeepEP's
    assert alltoall == pytest.approx(4 * nccl_copy, rel=0.01)
    assert alltoall_seconds(m, c, sh, "flex") == pytest.approx(4 * flex)     # dispatch + combine, fwd + bwd
    inside = shape_of(Layout(tp=1, pp=1, dp=16, expert_parallel=8, micro_batch=1), w)
    assert 0 < flex_alltoall_time(m, c, inside, 2.0 * m.hidden_size) < alltoall_seconds(m, c, inside) / 4


# ------------------------------------------------------------------------------------------ launch
def _flags(args):
    return {a for a in args if a.startswith("--")}


@pytest.mark.parametrize("model, lay", [
    ("mixtral-8x7b", Layout(tp=2, sequence_parallel=True, pp=4, virtual_pipeline=2, dp=8, expert_parallel=8,
                            micro_batch=1, recompute="none")),
    ("deepseek-v3", Layout(tp=8, sequence_parallel=True, pp=1, dp=128, expert_parallel=64, micro_batch=1,
                           recompute="full")),
    ("qwen3-30b-a3b", Layout(tp=1, pp=1, dp=64, expert_parallel=16, micro_batch=1, recompute="selective")),
])
def test_megatron_core_moe_flags_are_checked(model, lay):
    w = h100(model, 8 if model == "mixtral-8x7b" else 128 if model == "deepseek-v3" else 8)
    args = mcore.pretrain_args(lay, w)
    assert _flags(args) <= set(MCORE_FLAGS) | set(MOE_FLAGS), _flags(args) - set(MCORE_FLAGS) - set(MOE_FLAGS)
    v = {a: args[i + 1] for i, a in enumerate(args[:-1])}
    m = w.model
    assert v["--num-experts"] == str(m.num_experts) and v["--moe-router-topk"] == str(m.moe_top_k)
    assert v["--expert-model-parallel-size"] == str(lay.expert_parallel)
    assert v["--expert-tensor-parallel-size"] == "1"          # written: Megatron's default would be tp
    sh = shape_of(lay, w)
    picked = dispatcher_for(m, w.cluster, sh, w.framework)
    assert v["--moe-token-dispatcher-type"] == picked and "--moe-grouped-gemm" in args
    if picked == "flex":
        assert v["--moe-flex-dispatcher-backend"] == "deepep" and v["--moe-router-dtype"] == "fp32"
    else:
        assert "--moe-flex-dispatcher-backend" not in args
    assert ("--overlap-moe-expert-parallel-comm" in args) == FRAMEWORKS["megatron-core"].ep_overlap(lay)
    assert ("--delay-wgrad-compute" in args) == ("--overlap-moe-expert-parallel-comm" in args)
    if model == "deepseek-v3":
        assert v["--moe-layer-freq"] == "([0]*3+[1]*58)" and v["--moe-shared-expert-intermediate-size"] == "2048"
        assert v["--q-lora-rank"] == "1536" and "--multi-latent-attention" in args
        assert v["--moe-router-score-function"] == "sigmoid" and "--moe-router-enable-expert-bias" in args
    if model == "qwen3-30b-a3b":
        assert v["--kv-channels"] == "128" and "--qk-layernorm" in args and v["--moe-layer-freq"] == "1"


def test_megatron_core_dense_flags_are_unchanged():
    args = mcore.pretrain_args(Layout(tp=8, pp=4, dp=2, micro_batch=1), h100("llama3-70b", 8))
    assert not {a for a in _flags(args) if a in MOE_FLAGS}


def test_torchtitan_moe_keys_and_flavors():
    w = h100("qwen3-30b-a3b", 2, "torchtitan", "fp8")
    lay = Layout(tp=1, pp=1, dp=16, expert_parallel=8, micro_batch=1, zero_stage=3, recompute="none")
    job = tomllib.loads(torchtitan.render_job(lay, w))
    assert toml_keys(job) <= set(TORCHTITAN_KEYS) | set(TORCHTITAN_MOE_KEYS)
    assert job["model"]["name"] == "qwen3" and job["model"]["flavor"] == "30B-A3B"
    assert job["parallelism"]["expert_parallel_degree"] == 8 and job["parallelism"]["expert_tensor_parallel_degree"] == 1
    assert job["model"]["converters"] == ["quantize.linear.float8", "quantize.grouped_mm.float8"]
    assert torchtitan.flavor(load_model("deepseek-v3")) == ("deepseek_v3", "671B")
    for name in ("mixtral-8x7b", "qwen3-235b-a22b"):        # no flavor; the 235B flavor's RoPE base is 5e6
        with pytest.raises(Exception, match="cannot describe model"):
            torchtitan.flavor(load_model(name))


# ------------------------------------------------------------------------------- space, store, CLI
def test_the_default_space_offers_ep_for_moe_models_only():
    space = load_space()
    moe, dense = h100("mixtral-8x7b", 8), h100("llama3-8b", 8)
    assert space.choices("expert_parallel", moe) == [1, 2, 4, 8]
    assert space.choices("expert_parallel", dense) == [1] and space.choices("expert_tensor_parallel", dense) == [1]
    assert space.pinned({"expert_parallel": 4}).choices("expert_parallel", dense) == [4]     # refused later, named
    layouts = space.pinned({"tp": 2, "pp": 1, "micro_batch": 1}).enumerate_layouts(moe)
    assert {lay.expert_parallel for lay in layouts} == {1, 2, 4, 8}
    assert all(why_invalid(lay, moe) is None for lay in layouts)


def test_an_old_store_gains_the_expert_columns(tmp_path):
    from tuner.store import migrations
    url = f"sqlite:///{tmp_path / 'old.db'}"
    lay = Layout(tp=1, pp=8, dp=8, micro_batch=1)
    with open_store(url) as s:
        s.create_study(study("old3", "22b", 8))
        s.record_trial("old3", lay, None, ok(0.3), "sim")
        with s.engine.begin() as conn:      # as schema 3 left it
            for col in ("expert_parallel", "expert_tensor_parallel", "pipeline_split", "offload_layers"):  # 5, 6 the last
                conn.execute(text(f"ALTER TABLE trials DROP COLUMN {col}"))
            conn.execute(text("UPDATE meta SET value = '3' WHERE key = 'schema_version'"))
            conn.execute(text(f"UPDATE {migrations.VERSION_TABLE} SET version_num = '0003'"))
    assert f"from schema version 3 to {SCHEMA_VERSION}" in upgrade(url)     # Alembic revision 0004
    with open_store(url) as s:
        (t,) = s.trials("old3")
    assert t.layout == lay and t.layout.key() == lay.key() and t.layout.expert_parallel == 1


def test_predict_prints_the_moe_line(tuner):
    code, out, err = tuner("predict", "--model", "qwen3-30b-a3b", "--cluster", "h100", "--nodes", "2", "--tp", "1",
                           "--pp", "1", "--ep", "16", "--micro-batch", "1", "--recompute", "full")
    assert code == 0, err
    assert "ep16" in out and "all_to_all" in out
    assert "MoE: all-to-all" in out and "over 2 nodes (network)" in out and "3.4 B of 30.5 B" in out
    code, out, err = tuner("predict", "--model", "llama3-8b", "--cluster", "h100", "--nodes", "1", "--tp", "1",
                           "--pp", "1", "--ep", "2", "--micro-batch", "1")
    assert code == 2 and "needs a mixture-of-experts model" in err and "Traceback" not in err


def test_predict_turns_sequence_parallelism_on_where_megatron_core_requires_it(tuner):
    """Megatron-Core runs an MoE model with tp > 1 only with sequence parallelism: predict assumes it when not
    told (as it does for torchtitan's TP), and a layout that turns it off is refused naming the flag."""
    args = ("predict", "--model", "qwen3-30b-a3b", "--cluster", "h100", "--nodes", "2", "--framework",
            "megatron-core", "--tp", "2", "--pp", "1", "--ep", "8", "--micro-batch", "1")
    code, out, err = tuner(*args)
    assert code == 0 and "tp2-sp1-" in out, err
    code, _, err = tuner(*args, "--no-sequence-parallel")
    assert code == 2 and "add --sequence-parallel" in err and "Traceback" not in err
    code, out, err = tuner("predict", "--model", "llama3-8b", "--cluster", "h100", "--nodes", "1", "--framework",
                           "megatron-core", "--tp", "2", "--pp", "1", "--micro-batch", "1")
    assert code == 0 and "tp2-pp1-" in out, err           # a dense model: off, Megatron's default


@pytest.mark.parametrize("cluster, framework, ep, nodes, want", [
    ("h100", "megatron-core", 32, 32, ("flex", "deepep")),     # 4 nodes of 8: DeepEP forwards over NVLink
    ("gb200", "megatron-core", 32, 64, ("flex", "hybridep")),  # 8 trays of one NVL72 rack: only HybridEP (MNNVL)
    ("h100", "torchtitan", 32, 32, ("alltoall", None)),         # torchtitan has no flex dispatcher
    ("mi300x", "megatron-core", 32, 32, ("alltoall", None)),    # DeepEP / HybridEP are CUDA libraries
])
def test_the_dispatcher_is_the_faster_one_the_stack_runs_and_launch_writes_it(cluster, framework, ep, nodes, want):
    """Issue 25: where a run names no dispatcher, Megatron-Core on CUDA is predicted with the flex dispatcher
    when it moves the layout's tokens faster than alltoall (never slower than alltoall), and `launch` writes
    the dispatcher the prediction used, with its backend and the fp32 router probabilities it needs."""
    w = make_workload("qwen3-235b-a22b", nodes, cluster, 2048, framework=framework)
    lay = Layout(tp=1, pp=8, dp=w.gpus // 8, expert_parallel=ep, micro_batch=1, recompute="full",
                 zero_stage=3 if framework == "torchtitan" else 1)
    sh = shape_of(lay, w)
    picked = dispatcher_for(w.model, w.cluster, sh, framework)
    assert (picked, flex_backend(w.cluster, sh) if picked == "flex" else None) == want
    default, plain = predict(lay, w), predict(lay, w, TokenExchange(dispatcher="alltoall"))
    assert default.time_breakdown["all_to_all"] <= plain.time_breakdown["all_to_all"]
    assert (default.time_breakdown["all_to_all"] < plain.time_breakdown["all_to_all"]) == (picked == "flex")
    if framework == "megatron-core":
        args = mcore.pretrain_args(lay, w)
        v = {a: args[i + 1] for i, a in enumerate(args[:-1])}
        assert v["--moe-token-dispatcher-type"] == picked
        assert v.get("--moe-flex-dispatcher-backend") == want[1]
        assert (v.get("--moe-router-dtype") == "fp32") == (picked == "flex")
        assert _flags(args) <= set(MCORE_FLAGS) | set(MOE_FLAGS)


def test_megatron_core_combine_keeps_no_input_torchtitan_does():
    """Megatron-Core >= 0.13 scales the experts' activation by the routing probabilities, so its combine keeps
    nothing for their gradient; torchtitan scales the experts' outputs and keeps them (2h per routed copy)."""
    from tuner.perfmodel.moe import moe_activation_bytes, rank_tokens
    lay = Layout(tp=1, pp=1, dp=8, micro_batch=1, expert_parallel=8)
    got = {}
    for fw in ("megatron-core", "torchtitan"):
        w = make_workload("qwen3-30b-a3b", 1, "h100", global_batch=64, framework=fw)
        sh = shape_of(lay, w)
        assert sh.probs_in_experts is (fw == "megatron-core")
        got[fw] = (moe_activation_bytes(w.model, sh, True),
                   moe_activation_bytes(w.model, dataclasses.replace(sh, probs_in_experts=not sh.probs_in_experts), True))
    m = load_model("qwen3-30b-a3b")
    combine = rank_tokens(m, shape_of(lay, make_workload("qwen3-30b-a3b", 1, "h100", global_batch=64))) \
        * m.moe_top_k * 2.0 * m.hidden_size
    assert got["torchtitan"][0] - got["torchtitan"][1] == pytest.approx(combine)
    assert got["megatron-core"][1] - got["megatron-core"][0] == pytest.approx(combine)


def test_torchtitan_op_sac_keeps_nothing_of_the_routed_experts():
    """torchtitan's per-op SAC saves no grouped_mm: widening the experts changes nothing it keeps, and another
    routed choice per token costs only topk's value and index (12 bytes per token)."""
    from tuner.perfmodel.moe import moe_activation_bytes, rank_tokens
    lay = Layout(tp=1, pp=1, dp=8, micro_batch=2, recompute="selective", zero_stage=3)
    w = make_workload("qwen3-30b-a3b", 1, "h100", global_batch=16, framework="torchtitan")
    sh = shape_of(lay, w)
    assert sh.op_sac
    base = moe_activation_bytes(w.model, sh, True)
    wide = dataclasses.replace(w.model, moe_ffn_hidden_size=4 * w.model.moe_ffn_hidden_size)
    more = dataclasses.replace(w.model, moe_top_k=w.model.moe_top_k + 1)
    assert moe_activation_bytes(wide, sh, True) == pytest.approx(base)
    assert moe_activation_bytes(more, sh, True) - base == pytest.approx(12.0 * rank_tokens(w.model, sh))
    none = moe_activation_bytes(w.model, shape_of(dataclasses.replace(lay, recompute="none"), w), True)
    assert base < none / 5


# ------------------------------------------------------------------------------ multi-token prediction
def _mtp(w, n: int = 1):
    return dataclasses.replace(w, model=dataclasses.replace(w.model, mtp_num_layers=n))


def test_multi_token_prediction_is_a_model_key_kept_only_when_set():
    m = load_model("deepseek-v3")
    assert m.mtp_num_layers == 0 and "mtp_num_layers" not in m.as_dict()     # the preset leaves MTP out
    d = {**m.as_dict(), "mtp_num_layers": 1}
    assert ModelSpec.from_dict(d).mtp_num_layers == 1 and ModelSpec.from_dict(d).as_dict()["mtp_num_layers"] == 1
    with pytest.raises(SpecError, match="mtp_num_layers"):
        ModelSpec.from_dict({**d, "mtp_num_layers": -1})


def test_multi_token_prediction_runs_on_the_last_stage():
    """DeepSeek-V3 as Megatron-Bridge's H100 recipe runs it (pp 8 x vp 4, 'Et|(tt|)*30mL'): the MTP module, one
    more MoE layer, eh_proj and the LM head again, lands on the last rank, which then holds 6 layers, two heads and
    the module, and becomes the slowest; parameters and experts there grow by one MoE layer, eh_proj and the
    embedding the stage builds (gpt_model.py line 173)."""
    from tuner.perfmodel import stage_times, stage_total
    from tuner.perfmodel.memory import mtp_params, stage_expert_params, stage_params
    w = h100("deepseek-v3", 128, precision="fp8")
    lay = Layout(tp=2, sequence_parallel=True, pp=8, virtual_pipeline=4, pipeline_split="balanced-ends", dp=64,
                 expert_parallel=64, micro_batch=1, recompute="mla_up_mlp")
    plain, mtp = stage_times(lay, w), stage_times(lay, _mtp(w))
    assert [stage_total(s) for s in plain[:-1]] == [stage_total(s) for s in mtp[:-1]]     # other ranks unchanged
    assert stage_total(mtp[-1]) > max(stage_total(s) for s in mtp[:-1]) > stage_total(plain[-1])
    assert mtp[-1]["all_to_all"] > plain[-1]["all_to_all"] and mtp[-1]["moe_overhead"] > plain[-1]["moe_overhead"]
    assert predict(lay, _mtp(w)).step_time_s > predict(lay, w).step_time_s
    m = _mtp(w).model
    last = lay.pp - 1
    assert stage_params(m, lay, last) - stage_params(w.model, lay, last) == pytest.approx(mtp_params(m, lay, lay.pp))
    assert mtp_params(m, lay, lay.pp) > memory.embedding_params(m, lay.tp)
    assert stage_expert_params(m, lay, last) > stage_expert_params(w.model, lay, last)
    assert stage_params(m, lay, 0) == stage_params(w.model, lay, 0)


def test_multi_token_prediction_is_launched_by_megatron_core_only():
    w = _mtp(h100("deepseek-v3", 128))
    lay = Layout(tp=2, sequence_parallel=True, pp=8, virtual_pipeline=4, pipeline_split="balanced-ends", dp=64,
                 expert_parallel=64, micro_batch=1, recompute="mla_up_mlp")
    args = mcore.pretrain_args(lay, w)
    v = {a: args[i + 1] for i, a in enumerate(args[:-1])}
    assert v["--mtp-num-layers"] == "1" and "--mtp-num-layers" in MCORE_FLAGS
    assert v["--pipeline-model-parallel-layout"] == "Et|(t*2|)*30mL"        # Megatron-Bridge's, with its m
    assert "--mtp-num-layers" not in mcore.pretrain_args(lay, h100("deepseek-v3", 128))
    assert "--overlap-moe-expert-parallel-comm" in args              # one module: the overlap runs
    two = mcore.pretrain_args(lay, _mtp(w, 2))                       # two: transformer_config.py refuses the overlap
    assert "--overlap-moe-expert-parallel-comm" not in two and "--delay-wgrad-compute" not in two
    tt = dataclasses.replace(w, framework="torchtitan")
    assert "no multi-token prediction" in FRAMEWORKS["torchtitan"].refusal(dataclasses.replace(lay, zero_stage=3), tt)
    assert FRAMEWORKS["megatron-core"].refusal(lay, w) is None


def test_the_shared_experts_hide_the_exchange_they_run_beside():
    """Megatron-Core's --moe-shared-expert-overlap (NeMo's DeepSeek and Llama 4 configs) runs the shared experts on a
    side stream: fc1 beside the dispatch, fc2 beside the combine, forward and backward; each exchange shows only
    where it outlasts its shared GEMM. Off by default (launch does not write it); no effect without shared experts
    or with the flex dispatcher; never slower, and what it hides is compute no other collective may hide under."""
    from tuner.perfmodel import stage_times
    from tuner.perfmodel.moe import shared_gemm_seconds
    from tuner.perfmodel.moe_exchange import shared_overlap_exposed
    w = h100("deepseek-v3", 32)
    lay = Layout(tp=8, sequence_parallel=True, pp=1, dp=32, expert_parallel=64, micro_batch=1, recompute="none")
    sh = shape_of(lay, w)
    b = 2.0 * sh.backward_gemm
    assert shared_overlap_exposed(4.0, 0.0, 0.0, sh) == 4.0                       # nothing beside it: all shows
    assert shared_overlap_exposed(4.0, 1.0, 1.0, sh) == 0.0                       # every exchange covered
    assert shared_overlap_exposed(4.0, 0.5, 0.25, sh) == pytest.approx(0.5 + 0.75 + max(0, 1 - 0.5 * b)
                                                                       + max(0, 1 - 0.25 * b))
    fc1, fc2 = shared_gemm_seconds(w.model, w.cluster, sh)
    assert fc2 < fc1 <= 2 * fc2                  # SwiGLU: gate and up, twice fc2's FLOPs (at a larger GEMM's rate)
    plain, shared = (TokenExchange(overlap=False, dispatcher="alltoall", shared_overlap=s) for s in (False, True))
    off, on = stage_times(lay, w, exchange=plain)[0], stage_times(lay, w, exchange=shared)[0]
    assert on["all_to_all"] < off["all_to_all"]
    assert on["all_to_all"] + on["hidden_under_compute"] == pytest.approx(off["all_to_all"])
    assert predict(lay, w, shared).step_time_s < predict(lay, w, plain).step_time_s
    assert predict(lay, w).step_time_s == predict(lay, w, TokenExchange()).step_time_s     # launch: off
    flex = TokenExchange(overlap=False, dispatcher="flex", shared_overlap=True)
    assert predict(lay, w, flex).step_time_s == predict(lay, w, dataclasses.replace(flex, shared_overlap=False)).step_time_s
    q = h100("qwen3-30b-a3b", 2)                                                   # no shared experts
    ql = Layout(tp=1, pp=1, dp=16, expert_parallel=16, micro_batch=1, recompute="none")
    assert (predict(ql, q, dataclasses.replace(shared, overlap=False)).step_time_s
            == predict(ql, q, plain).step_time_s)
