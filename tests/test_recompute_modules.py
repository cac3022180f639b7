"""Megatron-Core's --recompute-modules as the recompute dimension's named sets (issue 25, item 2): the module
names Megatron-Core accepts, what each set frees and re-runs in the model, the refusals, the launch flags."""

from __future__ import annotations

import dataclasses

import pytest
from tuner.layout import RECOMPUTE, RECOMPUTE_MODULES, Layout, recomputes_at_least, stage_layers, stage_moe_layers, why_invalid
from tuner.perfmodel import compute, memory, predict, recompute
from tuner.render import mcore
from tuner.specs import load_cluster, make_workload

# megatron/core/transformer/transformer_config.py lines 1946-1956 at d98e8a64ddf3 (allowed_modules)
MEGATRON_MODULES = {"core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe", "shared_experts", "gdn_norm_out",
                    "gdp_in_proj", "gdp_qkv", "mhc"}


def deepseek(precision: str = "bf16"):
    return make_workload("deepseek-v3", 128, load_cluster("h100"), framework="megatron-core", grad_reduce="bf16",
                         global_batch=8192, precision=precision)


def ds_layout(rc: str) -> Layout:
    return Layout(tp=2, sequence_parallel=True, pp=8, virtual_pipeline=4, pipeline_split="balanced-ends", dp=64,
                  expert_parallel=64, micro_batch=1, recompute=rc)


def test_every_named_set_is_megatron_cores_modules_and_the_order_is_by_inclusion():
    assert set(RECOMPUTE[:1] + RECOMPUTE[-1:]) == {"none", "full"}
    for mode, mods in RECOMPUTE_MODULES.items():
        assert set(mods) <= MEGATRON_MODULES, mode
        assert recomputes_at_least("full", mode) and recomputes_at_least(mode, "none")
    assert recomputes_at_least("norm_act", "moe_act") and recomputes_at_least("mla_up_mlp", "mla_up")
    assert not recomputes_at_least("selective", "moe_act") and not recomputes_at_least("moe_act", "selective")
    assert not recomputes_at_least("mla_up_mlp", "full")


def test_refused_where_megatron_core_refuses_them_and_elsewhere():
    assert "has no experts" in why_invalid(Layout(tp=1, pp=1, dp=16, micro_batch=1, recompute="moe_act"),
                                           make_workload("llama3-8b", 2, load_cluster("h100"), framework="megatron-core"))
    qwen = make_workload("qwen3-30b-a3b", 2, load_cluster("h100"), framework="megatron-core")
    assert "no multi-latent attention" in why_invalid(Layout(tp=1, pp=1, dp=16, expert_parallel=8, micro_batch=1,
                                                             recompute="mla_up"), qwen)
    assert why_invalid(Layout(tp=1, pp=1, dp=16, expert_parallel=8, micro_batch=1, recompute="norm_act"), qwen) is None
    assert "delayed scaling" in why_invalid(ds_layout("norm_act"), deepseek("fp8"))
    assert why_invalid(ds_layout("mla_up"), deepseek("fp8")) is None
    tt = make_workload("qwen3-30b-a3b", 2, load_cluster("h100"), framework="torchtitan")
    lay = Layout(tp=1, pp=1, dp=16, expert_parallel=8, micro_batch=1, zero_stage=3, recompute="moe_act")
    assert "--framework megatron-core" in why_invalid(lay, tt) and "\n" not in why_invalid(lay, tt)


def test_each_set_frees_what_it_names_on_every_layer():
    """The stage's activations drop by in-flight passes x (its dense layers x the dense layer's freed bytes +
    its MoE layers x the MoE layer's) / vp: exactly what tuner.perfmodel.recompute frees."""
    w = deepseek()
    base = predict(ds_layout("none"), w)
    s = base.memory_stage
    for rc in ("moe_act", "norm_act", "mla_up", "mla_up_mlp", "mla_up_mlp_moe", "norm_moe"):
        lay = ds_layout(rc)
        sh = compute.shape_of(lay, w)
        n_moe = stage_moe_layers(lay, w.model, s)
        n_dense = stage_layers(lay, w.model.num_layers, s) - n_moe
        passes = memory.in_flight(s, lay.pp, 8192 // 64, lay.virtual_pipeline)
        freed = passes * (n_dense * recompute.freed_bytes(w.model, sh, False) + n_moe * recompute.freed_bytes(w.model, sh, True))
        got = memory.stage_memory(lay, w, s, 8192 // 64)["activations"]
        want = memory.stage_memory(ds_layout("none"), w, s, 8192 // 64)["activations"] - freed / 1 / lay.virtual_pipeline / 1e9
        assert got == pytest.approx(want, rel=1e-9), rc
        assert freed > 0, rc
    mem = {rc: predict(ds_layout(rc), w).memory_gb for rc in ("none", "moe_act", "norm_act", "mla_up", "full")}
    assert mem["none"] > mem["moe_act"] > mem["norm_act"] and mem["none"] > mem["mla_up"] > mem["full"]


def test_each_set_runs_its_modules_again_and_is_never_faster_than_what_it_includes():
    w = deepseek()
    step = {rc: predict(ds_layout(rc), w).step_time_s for rc in RECOMPUTE}
    for a in RECOMPUTE:
        for b in RECOMPUTE:
            if a != b and recomputes_at_least(a, b):
                assert step[a] >= step[b] * (1 - 1e-12), (a, b)
    # re-run work may only hide more of an overlapped all-to-all: never faster, not always slower
    assert step["moe_act"] >= step["none"] and step["mla_up_mlp"] >= step["mla_up"] and step["full"] > step["mla_up_mlp"]


def test_launch_writes_the_modules():
    args = mcore.recompute_args(ds_layout("mla_up_mlp"))
    assert args == ["--recompute-granularity", "selective", "--recompute-modules", "mla_up_proj", "mlp"]
    from test_launch_frameworks import MCORE_FLAGS
    full = mcore.pretrain_args(ds_layout("norm_act"), deepseek())
    assert full[full.index("--recompute-modules") + 1:full.index("--recompute-modules") + 3] == ["layernorm", "moe_act"]
    assert {"--recompute-granularity", "--recompute-modules"} <= set(MCORE_FLAGS)
    assert mcore.recompute_args(ds_layout("selective")) == ["--recompute-granularity", "selective"]
    moe = mcore.pretrain_args(ds_layout("mla_up_mlp_moe"), deepseek())      # NeMo 25.07's DeepSeek-V3 H100 recipe
    assert moe[moe.index("--recompute-modules") + 1:moe.index("--recompute-modules") + 4] == ["mla_up_proj", "mlp", "moe"]
    assert "--overlap-moe-expert-parallel-comm" not in moe         # transformer_config.py line 3032 refuses it with moe
    nm = mcore.pretrain_args(ds_layout("norm_moe"), deepseek())      # the ModelZoo's Qwen3-235B long-context H100 runs
    assert nm[nm.index("--recompute-modules") + 1:nm.index("--recompute-modules") + 3] == ["layernorm", "moe"]
    assert "--overlap-moe-expert-parallel-comm" not in nm


def test_the_moe_module_runs_the_whole_moe_block_and_its_exchange_again():
    """Megatron-Core's `moe` module checkpoints the whole MoE layer: the router, both experts' GEMMs, their
    element-wise kernels and the dispatch and combine run again in the backward (two more all-to-alls), and
    what the block kept is freed but its input."""
    from tuner.perfmodel.moe import experts_gemm_seconds, moe_block_activation_bytes
    from tuner.perfmodel.moe_exchange import alltoall_seconds
    w = deepseek()
    sh, shm = compute.shape_of(ds_layout("mla_up_mlp"), w), compute.shape_of(ds_layout("mla_up_mlp_moe"), w)
    m, c = w.model, w.cluster
    assert alltoall_seconds(m, c, shm) == pytest.approx(alltoall_seconds(m, c, sh) * 6 / 4)
    extra = recompute.extra_seconds(m, c, shm, True)["gemm"] - recompute.extra_seconds(m, c, sh, True)["gemm"]
    assert extra > experts_gemm_seconds(m, c, shm) > 0
    assert recompute.freed_bytes(m, shm, True) - recompute.freed_bytes(m, sh, True) == pytest.approx(
        moe_block_activation_bytes(m, shm))
    assert recompute.freed_bytes(m, shm, False) == recompute.freed_bytes(m, sh, False)      # dense layers: as mlp


def test_norm_moe_frees_both_norms_and_the_whole_moe_block():
    """norm_moe (layernorm + moe: the ModelZoo's Qwen3-235B-A22B long-context H100 runs): the two norms' outputs are
    discarded (the MoE checkpoint's saved input is the pre-MLP norm's output, freed with it and recomputed before the
    block's backward, transformer_layer.py at d98e8a64dd), the MoE block keeps nothing else, and the backward re-runs
    both norms, the router, the experts and the two exchanges."""
    from tuner.perfmodel.moe import experts_gemm_seconds, moe_block_activation_bytes, router_gemm_seconds
    from tuner.perfmodel.moe_exchange import alltoall_seconds
    w = deepseek()
    m, c = w.model, w.cluster
    sh = {rc: compute.shape_of(ds_layout(rc), w) for rc in ("none", "moe_act", "norm_act", "norm_moe")}
    norms = recompute.freed_bytes(m, sh["norm_act"], True) - recompute.freed_bytes(m, sh["moe_act"], True)
    assert norms > 0
    assert recompute.freed_bytes(m, sh["norm_moe"], True) == pytest.approx(norms + moe_block_activation_bytes(m, sh["norm_moe"]))
    assert recompute.freed_bytes(m, sh["norm_moe"], False) == pytest.approx(norms)        # a dense layer: the norms only
    extra = recompute.extra_seconds(m, c, sh["norm_moe"], True)
    assert extra["gemm"] == pytest.approx(experts_gemm_seconds(m, c, sh["norm_moe"]) + router_gemm_seconds(m, c, sh["norm_moe"]))
    assert alltoall_seconds(m, c, sh["norm_moe"]) == pytest.approx(alltoall_seconds(m, c, sh["none"]) * 6 / 4)
    assert not recomputes_at_least("norm_moe", "norm_act") and recomputes_at_least("full", "norm_moe")


def test_the_cli_takes_a_set_and_refuses_one_the_model_cannot_run(tuner):
    base = ["predict", "--model", "deepseek-v3", "--cluster", "h100", "--nodes", "128", "--tp", "2", "--sequence-parallel",
            "--pp", "8", "--vp", "4", "--pipeline-split", "balanced-ends", "--ep", "64", "--micro-batch", "1",
            "--global-batch", "8192", "--grad-reduce", "bf16"]
    code, out, err = tuner(*base, "--recompute", "mla_up_mlp")
    assert code == 0 and "rcmla_up_mlp" in out, err
    code, out, err = tuner(*base, "--recompute", "mlp")
    assert code == 0 and "rcmlp" in out, err
    code, out, err = tuner("predict", "--model", "llama3-8b", "--cluster", "h100", "--nodes", "1", "--tp", "1", "--pp", "1",
                           "--micro-batch", "1", "--recompute", "moe_act")
    assert code == 2 and "has no experts" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_a_set_round_trips_through_the_store(tmp_path):
    from tuner.store import open_store
    from tuner.study import StudyRecord
    from tuner.trial import Status, TrialResult
    url = f"sqlite:///{tmp_path}/t.db"
    lay = ds_layout("mla_up_mlp")
    with open_store(url) as store:
        store.create_study(StudyRecord(name="s", workload=deepseek().as_dict(), space={}, searcher="random", runner="sim"))
        store.record_trial("s", lay, None, TrialResult(Status.OK, samples_per_second=1.0), "sim")
    with open_store(url) as again:
        (t,) = again.trials("s")
    assert t.layout == lay and dataclasses.replace(t.layout, recompute="none") != lay


def test_mlp_checkpoints_the_dense_layers_mlp_only(tuner):
    """mlp (MLPerf Training v6.0's DeepSeek-V3 GB200 configs, RECOMPUTE_MODULES="mlp"): Megatron-Core checkpoints the
    MLP only where the layer is not an MoE layer (transformer_layer.py line 537 at d98e8a64dd), so a dense layer frees
    and re-runs what mla_up_mlp's mlp does and an MoE layer nothing; launch writes --recompute-modules mlp and keeps
    the EP overlap (only moe turns it off); predict and plan take it."""
    w = deepseek()
    m, c = w.model, w.cluster
    sh = {rc: compute.shape_of(ds_layout(rc), w) for rc in ("mlp", "mla_up", "mla_up_mlp")}
    dense = recompute.freed_bytes(m, sh["mla_up_mlp"], False) - recompute.freed_bytes(m, sh["mla_up"], False)
    assert dense > 0 and recompute.freed_bytes(m, sh["mlp"], False) == pytest.approx(dense)
    assert recompute.freed_bytes(m, sh["mlp"], True) == 0.0
    assert recompute.extra_seconds(m, c, sh["mlp"], True) == {"gemm": 0.0, "elementwise": 0.0}
    assert recompute.extra_seconds(m, c, sh["mlp"], False)["gemm"] > 0
    assert recomputes_at_least("mla_up_mlp", "mlp") and not recomputes_at_least("mlp", "mla_up")
    args, mla = mcore.pretrain_args(ds_layout("mlp"), w), mcore.pretrain_args(ds_layout("mla_up"), w)
    i = args.index("--recompute-modules")
    assert args[i + 1] == "mlp" and (i + 2 == len(args) or args[i + 2].startswith("--"))     # that one module
    assert ("--overlap-moe-expert-parallel-comm" in args) == ("--overlap-moe-expert-parallel-comm" in mla)
    dense_w = make_workload("llama3-8b", 1, load_cluster("h100"), framework="megatron-core")
    lay = Layout(tp=1, pp=1, dp=8, micro_batch=1, recompute="none")
    none, mlp = predict(lay, dense_w), predict(dataclasses.replace(lay, recompute="mlp"), dense_w)
    assert mlp.memory_gb < none.memory_gb and mlp.step_time_s > none.step_time_s
    code, out, err = tuner("plan", "--model", "llama3-8b", "--cluster", "h100", "--nodes", "1", "--framework",
                           "megatron-core", "--recompute", "mlp", "--top", "2")
    assert code == 0 and " mlp " in out, err
