"""`tuner launch --framework megatron-core|torchtitan` (issue 14, item 5): every flag and key checked
against the framework's own source, golden files, refusals, and the CLI option."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import tomllib
from pathlib import Path

import pytest
from click.testing import CliRunner

from tuner.cli import cli
from tuner.errors import UsageError
from tuner.layout import Layout
from tuner.perfmodel import predict
from tuner.render import mcore, megatron, torchtitan
from tuner.render.launch import FRAMEWORK_FILES, launch_files
from tuner.specs import load_cluster, load_model, make_workload

GOLDEN = Path(__file__).parent / "golden"

# Megatron-LM (NVIDIA/Megatron-LM) at d98e8a64ddf34856e74b24714e3bedb2f5a39553 (2026-08-22). Flags written
# literally are cited at megatron/training/arguments.py (A:line). The rest are generated in arguments.py by
# ArgumentGroupFactory (megatron/training/argument_utils.py line 106: "--" + field name, "_" -> "-"; line
# 194: a bool defaulting to True also gets "--disable-*") from the config dataclass field cited (TC:
# megatron/core/transformer/transformer_config.py, MPC: megatron/core/model_parallel_config.py, TR:
# megatron/training/config/training_config.py). All 34 were also found among the 878 option strings of
# the parser `add_megatron_arguments` builds from that snapshot (imported with its GPU-only dependencies
# stubbed). `--normalization` takes 'LayerNorm' | 'RMSNorm' (TC:256); `--position-embedding-type` 'rope'
# (A:2397); `--recompute-granularity` 'full' | 'selective' (TC:532), `--recompute-method` 'uniform' (TC:543);
# `--fp8-format` 'hybrid' (TC:587, arg_names metadata). `--virtual-pipeline-model-parallel-size` is not among
# them (excluded from the generated flags, A:2308): interleaving is `--num-layers-per-virtual-pipeline-stage`.
MCORE_FLAGS = {
    "--tensor-model-parallel-size": "MPC:55", "--pipeline-model-parallel-size": "MPC:83",
    "--num-layers": "TC:65", "--hidden-size": "TC:145", "--ffn-hidden-size": "TC:180",
    "--num-attention-heads": "TC:148", "--seq-length": "A:3305", "--max-position-embeddings": "A:2394",
    "--group-query-attention": "A:2382", "--num-query-groups": "TC:175", "--swiglu": "A:2450",
    "--position-embedding-type": "A:2397", "--untie-embeddings-and-output-weights": "A:2460",
    "--normalization": "TC:256", "--disable-bias-linear": "TC:212 (add_bias_linear, store_false)",
    "--micro-batch-size": "TR:11", "--global-batch-size": "TR:15", "--train-iters": "TR:64",
    "--log-interval": "TR:247", "--eval-iters": "TR:115", "--lr": "A:2984", "--min-lr": "A:2991",
    "--lr-decay-style": "TR:169", "--weight-decay": "A:2611", "--adam-beta1": "A:2617", "--adam-beta2": "A:2620",
    "--clip-grad": "A:2615", "--init-method-std": "TC:400", "--bf16": "MPC:180", "--fp16": "MPC:177",
    "--use-distributed-optimizer": "A:3156", "--recompute-granularity": "TC:532", "--recompute-method": "TC:543",
    "--recompute-num-layers": "TC:551", "--sequence-parallel": "MPC:94", "--context-parallel-size": "MPC:100",
    "--num-layers-per-virtual-pipeline-stage": "A:3114", "--fp8-format": "TC:587",
    "--fp8-amax-history-len": "TC:621", "--fp8-amax-compute-algo": "TC:624",
    "--fp8-param-gather": "A:2016 (A:1095-1097: only with the distributed optimizer or an FSDP)",
    "--overlap-grad-reduce": "A:3121", "--overlap-param-gather": "A:3148", "--ddp-bucket-size": "A:3125", "--tp-comm-overlap": "MPC:265",
    "--tp-comm-overlap-cfg": "A:2880 (a YAML file: initialize.py line 213 yaml.safe_load, passed as TE's ub_cfgs)",
    "--account-for-embedding-in-pipeline-split": "TC:137", "--account-for-loss-in-pipeline-split": "TC:141",
    # issue "launch files that run as written": the RoPE base, the attention the model assumed, data, checkpoints
    "--rotary-base": "A:2418 (int, default 10000)",
    "--attention-backend": "TC:151 (AttnBackend: 'flash' = core/transformer/enums.py:54)",
    "--data-path": "A:3255", "--split": "A:3266 (A:668 warns without it)", "--mock-data": "A:3302",
    "--tokenizer-type": "TR:698 ('HuggingFaceTokenizer' | 'NullTokenizer')", "--tokenizer-model": "TR:714",
    "--vocab-size": "TR:679 (NullTokenizer keeps it: core/tokenizers/text/libraries/null_tokenizer.py:18)",
    "--save": "TR:395", "--load": "TR:430", "--save-interval": "TR:398",
    # issue 24: bf16 gradient reduce (A:1213 sets accumulate_allreduce_grads_in_fp32 False; else forced True)
    "--grad-reduce-in-bf16": "A:3053",
    "--use-precision-aware-optimizer": "A:3667", "--exp-avg-dtype": "A:3675 ('fp32' | 'fp16' | 'bf16' | 'fp8')",
    "--exp-avg-sq-dtype": "A:3680 ('fp32' | 'fp16' | 'bf16' | 'fp8')",
    # issue 25: pipeline splits (tuner.pipeline_split); the layout string's grammar is
    # megatron/core/transformer/pipeline_parallel_layer_layout.py line 283 (parse_str_to_list)
    "--decoder-first-pipeline-num-layers": "A:3095", "--decoder-last-pipeline-num-layers": "A:3099",
    "--pipeline-model-parallel-layout": "A:3103 (TC:111; A:931 allows no --num-layers-per-virtual-pipeline-stage "
                                        "beside it, A:944 derives vp from it)",
    # issue 25: recompute module sets (transformer_config.py lines 1946-1958 list the allowed names)
    "--recompute-modules": "TC:560 (a list: core_attn, moe_act, layernorm, mla_up_proj, mlp, moe, shared_experts, ...)",
    # issue 25: CPU activation offloading (offload_layers); --cpu-offloading, --cpu-offloading-activations and
    # --cpu-offloading-weights do not exist (A:2320-2323 exclude those fields from the generated flags)
    "--cpu-offloading-num-layers": "MPC:461 (A:1950 turns cpu_offloading on for N > 0)",
    # issue 25: Megatron-FSDP (zero_stage 2 / 3)
    "--use-megatron-fsdp": "DistributedInitConfig (megatron/training/config/common_config.py:92; A:3092 generates it)",
    "--data-parallel-sharding-strategy": "A:3190 ('optim_grads' | 'optim_grads_params')",
    "--ckpt-format": "TR:486 ('fsdp_dtensor': A:1170 asserts it with Megatron-FSDP)",
    # issue 25 round 3: multi-token prediction (ModelSpec.mtp_num_layers; A:882 on reads it)
    "--mtp-num-layers": "TC:68 (Optional[int]; pipeline_parallel_layer_layout.py line 112: a layout places each as m)",
}

# torchtitan (pytorch/torchtitan) at 238fa9953e4aec2a62582121564273d7cbb1e9f1 (2026-02-23), the last commit
# with TOML job files (9810191bbb03, #2386, replaced them with Python configs): torchtitan/config/
# job_config.py, class and line of each field; the section names are JobConfig's fields (line 1000 on)
# and match torchtitan/models/llama3/train_configs/llama3_70b.toml there. Flavors: torchtitan/models/
# llama3/__init__.py lines 51 (8B), 82 (70B), 91 (405B).
TORCHTITAN_KEYS = {
    "job.dump_folder": "Job:22", "job.description": "Job:25", "metrics.log_freq": "Metrics:75",
    "model.name": "Model:101", "model.flavor": "Model:104",
    "optimizer.name": "Optimizer:135", "optimizer.lr": "Optimizer:138", "optimizer.beta1": "Optimizer:141",
    "optimizer.beta2": "Optimizer:142", "optimizer.eps": "Optimizer:145", "optimizer.weight_decay": "Optimizer:148",
    "training.local_batch_size": "Training:253", "training.global_batch_size": "Training:256",
    "training.seq_len": "Training:261", "training.max_norm": "Training:264", "training.steps": "Training:267",
    "training.mixed_precision_param": "Training:282",
    "parallelism.data_parallel_replicate_degree": "Parallelism:313",
    "parallelism.data_parallel_shard_degree": "Parallelism:324",
    "parallelism.tensor_parallel_degree": "Parallelism:351", "parallelism.pipeline_parallel_degree": "Parallelism:360",
    "parallelism.pipeline_parallel_microbatch_size": "Parallelism:412",
    "parallelism.context_parallel_degree": "Parallelism:428",
    "activation_checkpoint.mode": "ActivationCheckpoint:652 ('selective' | 'full' | 'memory_budget' | 'none')",
    "activation_checkpoint.selective_ac_option": "ActivationCheckpoint:655 ('op' or a layer period)",
    "model.converters": "Model:118 (name registered at components/quantization/float8.py:238)",
    "parallelism.pipeline_parallel_schedule": "Parallelism:396 ('Interleaved1F1B': torch's schedule name)",
    "parallelism.pipeline_parallel_layers_per_stage": "Parallelism:389",
    "parallelism.pipeline_parallel_first_stage_less_layers": "Parallelism:377",
    "parallelism.pipeline_parallel_last_stage_less_layers": "Parallelism:383",
    "quantize.linear.float8.enable_fsdp_float8_all_gather": "Float8Linear:732 (JobConfig.quantize:1018)",
    "quantize.linear.float8.precompute_float8_dynamic_scale_for_fsdp": "Float8Linear:735",
    "quantize.linear.float8.filter_fqns": "Float8Linear:741",
    # data, tokenizer, checkpoints, compile (JobConfig.checkpoint:1013, .compile:1017)
    "training.dataset": "Training:244 ('c4' | 'c4_test': hf_datasets/text_datasets.py:37, 42)",
    "training.dataset_path": "Training:247", "model.hf_assets_path": "Model:107 (tokenizer_path:114 is deprecated)",
    "checkpoint.enable": "Checkpoint:488", "checkpoint.folder": "Checkpoint:513", "checkpoint.interval": "Checkpoint:519",
    "compile.enable": "Compile:722", "compile.components": "Compile:725 ('model', 'loss')",
    # issue 25: a named pipeline split as its stages' modules (torchtitan has no split points at 238fa9953e4a)
    "parallelism.module_fqns_per_model_part": "Parallelism:367",
}

H100_SLURM = {"partition": "batch", "account": "abc123", "tasks_per_node": 8, "gpus_per_node": 8}
MOCK = {"mock_data": True}
DATA = {"data_path": "/lustre/data/pile_text_document", "tokenizer": "meta-llama/Meta-Llama-3-70B"}


def h100_workload(model: str = "llama3-70b", nodes: int = 8, precision: str = "bf16"):
    """The h100 preset has no [slurm] table: one is given here, as a user's cluster file would."""
    cluster = dataclasses.replace(load_cluster("h100"), slurm=H100_SLURM)
    return make_workload(load_model(model), nodes, cluster, precision=precision)


def modern_workload(precision: str = "bf16"):
    """llama3-70b on 64 H100 nodes (512 GPUs, global batch 512), the scale of today's published recipes."""
    return h100_workload("llama3-70b", 64, precision)


def toml_keys(table: dict, prefix: str = "") -> set[str]:
    """Every key of a parsed TOML file, dotted through its (nested) tables."""
    keys: set[str] = set()
    for k, v in table.items():
        keys |= toml_keys(v, f"{prefix}{k}.") if isinstance(v, dict) else {prefix + k}
    return keys


LLAMA_LAYOUT = Layout(tp=8, pp=4, dp=2, micro_batch=1, zero_stage=1, recompute="full")
GPT_LAYOUT = Layout(tp=4, pp=16, dp=2, micro_batch=1)
LAYOUTS = [LLAMA_LAYOUT, Layout(tp=8, pp=1, dp=8, micro_batch=2, zero_stage=0, recompute="none")]
# tp4 sp cp2 pp4 vp5 mb1 z1, selective recompute: 4*2*4*16 = 512 GPUs; 80 layers = 4 x 5 x 4 per virtual stage.
MODERN = Layout(tp=4, sequence_parallel=True, context_parallel=2, pp=4, virtual_pipeline=5, dp=16, micro_batch=1,
                zero_stage=1, recompute="selective")


def test_grad_reduce_bf16_is_launched_as_predicted():
    w = dataclasses.replace(h100_workload("llama3-8b", 1), grad_reduce="bf16")
    args = mcore.pretrain_args(LLAMA_LAYOUT, w)
    assert "--grad-reduce-in-bf16" in args and "--grad-reduce-in-bf16" in MCORE_FLAGS
    assert "--grad-reduce-in-bf16" not in mcore.pretrain_args(LLAMA_LAYOUT, h100_workload("llama3-8b", 1))
    from tuner.perfmodel import predict
    lay = Layout(tp=1, pp=1, dp=8, micro_batch=1, zero_stage=1)
    fp32, bf16 = predict(lay, h100_workload("llama3-8b", 1)), predict(lay, w)
    assert fp32.memory_breakdown["gradients"] == pytest.approx(2 * bf16.memory_breakdown["gradients"])
    with pytest.raises(UsageError, match="grad-reduce"):
        make_workload("llama3-8b", 1, "h100", framework="torchtitan", grad_reduce="bf16")


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
@pytest.mark.parametrize("model", ["175b", "llama3-70b", "llama3-8b"])
@pytest.mark.parametrize("lay", LAYOUTS)
def test_every_megatron_core_flag_is_checked(lay, model, precision):
    args = mcore.pretrain_args(lay, h100_workload(model), precision=precision)
    flags = {a for a in args if a.startswith("--")}
    assert flags <= set(MCORE_FLAGS), f"unchecked flags {flags - set(MCORE_FLAGS)}: check them in Megatron-LM"
    assert ("--use-distributed-optimizer" in flags) == (lay.zero_stage >= 1)
    assert ("--recompute-granularity" in flags) == lay.checkpointing
    assert not flags & {"--sequence-parallel", "--context-parallel-size", "--num-layers-per-virtual-pipeline-stage",
                        "--fp8-format"}                      # none of the new dimensions is set in these layouts


def test_megatron_core_architecture_flags_follow_the_spec():
    llama = mcore.architecture_args(load_model("llama3-70b"))
    assert llama == ["--group-query-attention", "--num-query-groups", "8", "--swiglu", "--position-embedding-type",
                     "rope", "--untie-embeddings-and-output-weights", "--normalization", "RMSNorm",
                     "--disable-bias-linear", "--rotary-base", "500000"]
    assert mcore.architecture_args(load_model("175b")) == []          # GPT-3: Megatron's defaults


@pytest.mark.parametrize("zero", [2, 3])
def test_megatron_core_runs_zero_2_and_3_as_megatron_fsdp_without_pipelining(zero):
    """zero_stage 2 / 3 are Megatron-FSDP (issue 25): its flags, checked in MCORE_FLAGS; with pp > 1 refused."""
    with pytest.raises(UsageError, match=f"Megatron-FSDP \\(zero_stage {zero}\\) without pipelining") as e:
        mcore.pretrain_args(dataclasses.replace(LLAMA_LAYOUT, zero_stage=zero), h100_workload())
    assert e.value.exit_code == 2 and "\n" not in str(e.value)
    flat = dataclasses.replace(LLAMA_LAYOUT, pp=1, dp=8, zero_stage=zero)
    args = mcore.pretrain_args(flat, h100_workload())
    strategy = {2: "optim_grads", 3: "optim_grads_params"}[zero]
    assert args[args.index("--data-parallel-sharding-strategy") + 1] == strategy and "--use-megatron-fsdp" in args
    assert args[args.index("--ckpt-format") + 1] == "fsdp_dtensor" and "--use-distributed-optimizer" in args
    assert {a for a in args if a.startswith("--")} <= set(MCORE_FLAGS)
    assert mcore.launch_env(flat) == {"CUDA_DEVICE_MAX_CONNECTIONS": None}      # unset: A:1166, at any tp
    assert mcore.launch_env(LLAMA_LAYOUT) == {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}


@pytest.mark.parametrize("lay", LAYOUTS + [Layout(tp=4, pp=2, dp=8, micro_batch=4, zero_stage=3)])
def test_every_torchtitan_key_is_checked_and_the_batch_adds_up(lay):
    w = h100_workload()
    job = tomllib.loads(torchtitan.render_job(lay, w, iterations=7))
    keys = toml_keys(job)
    assert keys <= set(TORCHTITAN_KEYS), f"unchecked keys {keys - set(TORCHTITAN_KEYS)}: check them in job_config.py"
    p, t = job["parallelism"], job["training"]
    assert p["data_parallel_shard_degree"] * p["tensor_parallel_degree"] * p["pipeline_parallel_degree"] == w.gpus
    assert t["global_batch_size"] == w.global_batch and t["global_batch_size"] % (t["local_batch_size"] * lay.dp) == 0
    if lay.pp > 1:
        assert t["local_batch_size"] % p["pipeline_parallel_microbatch_size"] == 0
    assert job["activation_checkpoint"] == {"mode": "full" if lay.checkpointing else "none"}
    assert t["steps"] == 7 and job["model"] == {"name": "llama3", "flavor": "70B"}


def test_torchtitan_refuses_fp16_and_a_model_without_a_flavor():
    with pytest.raises(UsageError, match="bf16 only"):
        torchtitan.render_job(LLAMA_LAYOUT, h100_workload(), precision="fp16")
    with pytest.raises(UsageError, match="cannot describe model 'gpt-175b'"):
        torchtitan.render_job(GPT_LAYOUT, make_workload("175b", 16))


# ---- today's dimensions: sequence, context and interleaved pipeline parallelism, selective recompute, FP8 ----
def value(args: list[str], flag: str) -> str:
    assert args.count(flag) == 1, f"{flag} written {args.count(flag)} times"
    return args[args.index(flag) + 1]


@pytest.mark.parametrize("precision", ["bf16", "fp8"])
def test_megatron_core_writes_every_modern_dimension(precision):
    args = mcore.pretrain_args(MODERN, modern_workload(precision))
    flags = {a for a in args if a.startswith("--")}
    assert flags <= set(MCORE_FLAGS), f"unchecked flags {flags - set(MCORE_FLAGS)}: check them in Megatron-LM"
    assert "--sequence-parallel" in args and value(args, "--context-parallel-size") == "2"
    assert value(args, "--pipeline-model-parallel-size") == "4"
    assert value(args, "--num-layers-per-virtual-pipeline-stage") == "4"          # 80 / (pp 4 * vp 5)
    assert value(args, "--recompute-granularity") == "selective"
    assert "--recompute-method" not in args and "--recompute-num-layers" not in args   # Megatron: None for selective
    assert "--use-distributed-optimizer" in args and "--bf16" in args
    fp8 = ["--fp8-format", "hybrid", "--fp8-amax-history-len", "1024", "--fp8-amax-compute-algo", "max"]
    joined = " ".join(args)
    assert (" ".join(fp8) in joined) == (precision == "fp8") and ("--fp8-format" in args) == (precision == "fp8")
    assert ("--fp8-param-gather" in args) == (precision == "fp8")      # with the distributed optimizer


@pytest.mark.parametrize("precision", ["bf16", "fp8", "mxfp8", "nvfp4"])
@pytest.mark.parametrize("zero", [0, 1, 2, 3])
def test_megatron_core_fp8_param_gather_where_megatron_allows_it_and_the_memory_model_charges_it(precision, zero):
    """--fp8-param-gather for FP8 and MXFP8 with the distributed optimizer or Megatron-FSDP (Megatron-LM refuses it
    without one), never for bf16 or NVFP4; the memory model holds the layers' weights as launch runs them: the
    quantized bytes alone with the flag, bf16 weights beside TE's cached copy without it."""
    from tuner.perfmodel import memory
    cluster = "b200" if precision in ("mxfp8", "nvfp4") else "h100"
    w = make_workload("llama3-8b", 2, cluster, precision=precision, framework="megatron-core")
    lay = Layout(tp=1, pp=1, dp=16, micro_batch=1, zero_stage=zero)
    flag = "--fp8-param-gather" in mcore.pretrain_args(lay, w)
    assert flag == (precision in ("fp8", "mxfp8") and zero >= 1)
    mem = memory.stage_memory(lay, w, 0, 8)
    per = memory.quantized_weight_bytes(precision, w.cluster) if precision != "bf16" else 0.0
    assert per == {"bf16": 0.0, "fp8": 2.0, "mxfp8": 2.0625, "nvfp4": 1.125}[precision]   # FP8 on Hopper: + transpose
    layers = (mem["params_billion"] * 1e9 - memory.embedding_params(w.model, 1) * 2) / 1e9   # untied: embedding + head
    shards = 16 if zero == 3 else 1
    assert mem.get("fp8_weights", 0.0) == pytest.approx(layers * per / shards)
    assert mem["weights"] == pytest.approx((mem["params_billion"] - (layers if flag else 0)) * 2 / shards)
    gathered = memory.zero3_gather_bytes(w.model, 1, 16, zero) / 1e9          # Megatron-FSDP's two gathered layers
    assert mem["zero3_buffers"] == pytest.approx(gathered * (per / 2 if flag else 1.0))   # gathered quantized too


def test_the_embedding_and_loss_aware_split_and_the_overlaps_the_model_assumed():
    """405B's 126 layers over pp 8 x vp 8: (126 + 2) / 64 = 2 layers per virtual stage, the embedding and
    the loss counted as one layer each; torchtitan the same with its first/last stage "less layers";
    Megatron-DeepSpeed refuses it. On h100 (comm_overlap) Megatron-Core gets the overlaps predicted."""
    w = make_workload("llama3-405b", 128, "h100", precision="fp8")
    lay = Layout(tp=8, sequence_parallel=True, context_parallel=2, pp=8, virtual_pipeline=8, dp=8, micro_batch=1)
    args = mcore.pretrain_args(lay, w)
    assert {"--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split"} <= set(args)
    assert value(args, "--num-layers-per-virtual-pipeline-stage") == "2"
    assert {"--overlap-grad-reduce", "--overlap-param-gather", "--tp-comm-overlap"} <= set(args)
    table = torchtitan.parallelism(lay, w.model)
    assert (table["pipeline_parallel_layers_per_stage"], table["pipeline_parallel_first_stage_less_layers"],
            table["pipeline_parallel_last_stage_less_layers"]) == (2, 1, 1)
    assert "embedding- and loss-aware split" in megatron.refusal(dataclasses.replace(lay, virtual_pipeline=1,
                                                                                     context_parallel=1, dp=16), w)
    even = mcore.pretrain_args(dataclasses.replace(lay, pp=9, virtual_pipeline=7, dp=8),     # 8*2*9*8 = 1152 GPUs
                               make_workload("llama3-405b", 144, "h100"))
    assert "--account-for-embedding-in-pipeline-split" not in even
    frontier = mcore.pretrain_args(GPT_LAYOUT, make_workload("175b", 16))
    assert not {"--overlap-grad-reduce", "--tp-comm-overlap"} & set(frontier)     # no comm_overlap on frontier
    assert "--ddp-bucket-size" not in args                                # Megatron-Core's default, as predicted


def test_a_stated_gradient_bucket_size_is_launched_as_the_model_charged_it():
    """Workload.ddp_bucket_size (a run's --ddp-bucket-size, elements) is predicted (tuner.perfmodel.buckets) and
    written by launch, so the launched run has the buckets the model counted."""
    lay = Layout(tp=8, sequence_parallel=True, pp=1, dp=16, micro_batch=1)
    w = make_workload("llama3-70b", 16, "h100", ddp_bucket_size=134_217_728)
    args = mcore.pretrain_args(lay, w)
    assert value(args, "--ddp-bucket-size") == "134217728" and "--ddp-bucket-size" in MCORE_FLAGS
    assert predict(lay, w).step_time_s != predict(lay, make_workload("llama3-70b", 16, "h100")).step_time_s


@pytest.mark.parametrize("lay, want", [
    (MODERN, ["--recompute-granularity", "selective"]),
    (dataclasses.replace(MODERN, recompute="full"), list(mcore.RECOMPUTE_FULL)),
    (dataclasses.replace(MODERN, recompute="none"), []),
])
def test_megatron_core_recompute_modes(lay, want):
    args = mcore.pretrain_args(lay, modern_workload())
    got = args[args.index("--recompute-granularity"):][:len(want)] if want else []
    assert got == want and ("--recompute-granularity" in args) == bool(want)


def test_megatron_core_leaves_unset_dimensions_out():
    plain = dataclasses.replace(MODERN, sequence_parallel=False, context_parallel=1, virtual_pipeline=1, dp=32)
    args = mcore.pretrain_args(plain, modern_workload())
    assert not {"--sequence-parallel", "--context-parallel-size", "--num-layers-per-virtual-pipeline-stage"} & set(args)


def test_megatron_core_sbatch_sets_cuda_device_max_connections():
    """Megatron-LM asserts CUDA_DEVICE_MAX_CONNECTIONS=1 with tp or cp > 1 (arguments.py line 1477)."""
    files = launch_files(MODERN, modern_workload(), "/x", framework="megatron-core", train_iters=10, **MOCK)
    assert "export CUDA_DEVICE_MAX_CONNECTIONS=1\n" in files["launch.sbatch"]
    dp_only = Layout(tp=1, pp=1, dp=512, micro_batch=1, zero_stage=1)
    files = launch_files(dp_only, modern_workload(), "/x", framework="megatron-core", train_iters=10, **MOCK)
    assert "CUDA_DEVICE_MAX_CONNECTIONS" not in files["launch.sbatch"]


@pytest.mark.parametrize("precision", ["bf16", "fp8"])
def test_torchtitan_writes_every_modern_dimension(precision):
    w = modern_workload(precision)
    text = torchtitan.render_job(MODERN, w)
    job = tomllib.loads(text)
    assert toml_keys(job) <= set(TORCHTITAN_KEYS), f"unchecked keys {toml_keys(job) - set(TORCHTITAN_KEYS)}"
    p = job["parallelism"]
    assert (p["tensor_parallel_degree"], p["context_parallel_degree"], p["pipeline_parallel_degree"],
            p["data_parallel_shard_degree"], p["data_parallel_replicate_degree"]) == (4, 2, 4, 16, 1)
    assert p["pipeline_parallel_schedule"] == "Interleaved1F1B" and p["pipeline_parallel_layers_per_stage"] == 4
    # torchtitan's own arithmetic (distributed/pipeline_parallel.py lines 66-94): stages per rank must be vp
    stages = math.ceil((80 + p["pipeline_parallel_first_stage_less_layers"] +
                        p["pipeline_parallel_last_stage_less_layers"]) / p["pipeline_parallel_layers_per_stage"])
    assert stages % 4 == 0 and stages // 4 == MODERN.virtual_pipeline
    assert job["activation_checkpoint"] == {"mode": "selective", "selective_ac_option": "op"}
    assert "Sequence parallelism: on" in text
    if precision == "fp8":
        assert job["model"]["converters"] == ["quantize.linear.float8"]
        assert job["quantize"]["linear"]["float8"] == {"enable_fsdp_float8_all_gather": True, "filter_fqns": ["output"],
                                                       "precompute_float8_dynamic_scale_for_fsdp": True}
    else:
        assert "converters" not in job["model"] and "quantize" not in job


def test_torchtitan_pipeline_without_interleaving_keeps_torchtitans_schedule():
    job = tomllib.loads(torchtitan.render_job(LLAMA_LAYOUT, h100_workload()))
    assert "pipeline_parallel_schedule" not in job["parallelism"]
    assert "pipeline_parallel_layers_per_stage" not in job["parallelism"]


def z3(lay: Layout) -> Layout:
    """torchtitan's layouts: FSDP2, zero_stage 3 (tuner.frameworks)."""
    return dataclasses.replace(lay, zero_stage=3, sequence_parallel=lay.tp > 1)


MDS = Layout(tp=4, sequence_parallel=True, pp=4, dp=32, micro_batch=1, zero_stage=1, recompute="selective")


@pytest.mark.parametrize("lay, words", [
    (MODERN, "context_parallel 2"),
    (dataclasses.replace(MODERN, context_parallel=1, dp=32), "virtual_pipeline 5"),
])
def test_megatron_deepspeed_refuses_cp_and_vp(lay, words):
    with pytest.raises(UsageError) as e:
        launch_files(lay, modern_workload(), "/x", framework="megatron-deepspeed", train_iters=10, **DATA)
    msg = str(e.value)
    assert e.value.exit_code == 2 and "\n" not in msg
    assert f"megatron-deepspeed cannot run {words}" in msg and "--framework megatron-core" in msg
    assert "--ds-sequence-parallel-size" not in " ".join(megatron.pretrain_args(
        dataclasses.replace(lay, context_parallel=1, virtual_pipeline=1, dp=32), modern_workload()))


def test_megatron_deepspeed_fp8_only_where_transformer_engine_runs():
    with pytest.raises(UsageError, match="cannot run fp8 with pp 4.*use --framework megatron-core"):
        megatron.pretrain_args(MDS, modern_workload("fp8"))
    gqa_pp1 = Layout(tp=8, pp=1, dp=64, micro_batch=1, zero_stage=1)
    with pytest.raises(UsageError, match="cannot run fp8 for 'llama3-70b'.*grouped-query"):
        megatron.pretrain_args(gqa_pp1, modern_workload("fp8"))
    args = megatron.pretrain_args(Layout(tp=8, pp=1, dp=8, micro_batch=1), h100_workload("175b", 8, "fp8"))
    assert " ".join(megatron.FP8) in " ".join(args) and "--no-pipeline-parallel" in args
    assert "--fp8-hybrid" not in megatron.pretrain_args(Layout(tp=8, pp=1, dp=8, micro_batch=1), h100_workload("175b", 8))


def test_megatron_deepspeed_writes_sp_and_selective_recompute():
    files = launch_files(MDS, modern_workload(), "/x", framework="megatron-deepspeed", train_iters=10, **DATA)
    args = files["megatron_args.txt"].split()
    assert "--sequence-parallel" in args and value(args, "--recompute-granularity") == "selective"
    assert "--checkpoint-activations" not in args and "--deepspeed-activation-checkpointing" not in args
    assert "activation_checkpointing" not in json.loads(files["ds_config.json"])   # DeepSpeed's is full only
    assert "export CUDA_DEVICE_MAX_CONNECTIONS=1\n" in files["launch.sbatch"]     # Megatron-DeepSpeed raises without


def test_cli_launches_the_framework_asked_for_and_never_switches(tmp_path):
    """--framework megatron-deepspeed on h100 launches the best layout Megatron-DeepSpeed runs (its DeepSpeed
    config, no cp/vp); a study searched for Megatron-Core is launched with Megatron-Core, and asking for another
    framework is refused naming the study's."""
    db = f"sqlite:///{tmp_path}/s.db"
    args = ["--model", "llama3-70b", "--nodes", "8", "--cluster", "h100", "--train-iters", "10",
            "--data-path", "/data/x", "--tokenizer", "meta-llama/Meta-Llama-3-70B", "--db", db]
    r = CliRunner().invoke(cli, ["launch", *args, "--out", tmp_path / "ds", "--framework", "megatron-deepspeed"])
    assert r.exit_code == 0, r.output
    lay = json.loads((tmp_path / "ds" / "layout.json").read_text())["layout"]
    assert (tmp_path / "ds" / "ds_config.json").exists() and lay["context_parallel"] == lay["virtual_pipeline"] == 1
    r = CliRunner().invoke(cli, ["search", "--model", "llama3-70b", "--nodes", "8", "--cluster", "h100", "--budget", "3",
                                 "--study", "mc", "--db", db])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(cli, ["launch", "mc", *args[6:], "--out", tmp_path / "no", "--framework", "torchtitan"])
    assert isinstance(r.exception, UsageError) and r.exception.exit_code == 2
    assert "searched for megatron-core" in str(r.exception) and not (tmp_path / "no").exists()
    r = CliRunner().invoke(cli, ["launch", "mc", *args[6:], "--out", tmp_path / "mc"])
    assert r.exit_code == 0 and (tmp_path / "mc" / "megatron_args.txt").exists(), r.output
    assert not (tmp_path / "mc" / "ds_config.json").exists()


GPT_DATA = {"data_path": "/lustre/orion/abc123/data/pile_text_document", "tokenizer": "gpt2"}
TT_DATA = {"data_path": "/lustre/data/c4", "tokenizer": "/lustre/assets/hf/Llama-3.1-70B"}
# name: (framework, layout, workload, launch_files keyword arguments)
CASES = {
    "launch_mcore_175b_16n": ("megatron-core", GPT_LAYOUT, lambda: make_workload("175b", 16),
                              {"account": "abc123", "time_limit": "02:00:00",
                               "megatron_dir": "/lustre/orion/abc123/Megatron-LM", **GPT_DATA}),
    "launch_mcore_llama3-70b_8n_h100": ("megatron-core", LLAMA_LAYOUT, h100_workload,
                                        {"megatron_dir": "/opt/Megatron-LM", **MOCK}),
    "launch_torchtitan_llama3-70b_8n_h100": ("torchtitan", z3(LLAMA_LAYOUT), h100_workload, MOCK),
    "launch_mcore_llama3-70b_64n_h100_modern_bf16": ("megatron-core", MODERN, modern_workload,
                                                     {"megatron_dir": "/opt/Megatron-LM", **DATA}),
    "launch_mcore_llama3-70b_64n_h100_modern_fp8": ("megatron-core", MODERN, lambda: modern_workload("fp8"),
                                                    {"megatron_dir": "/opt/Megatron-LM", **MOCK}),
    "launch_torchtitan_llama3-70b_64n_h100_modern_bf16": ("torchtitan", z3(MODERN), modern_workload,
                                                          {**TT_DATA, "save_dir": "/lustre/ckpt/70b"}),
    "launch_torchtitan_llama3-70b_64n_h100_modern_fp8": ("torchtitan", z3(MODERN), lambda: modern_workload("fp8"),
                                                         {"megatron_dir": "/opt/torchtitan", **MOCK}),
    "launch_mds_llama3-70b_64n_h100_sp_selective": ("megatron-deepspeed", MDS, modern_workload,
                                                    {"megatron_dir": "/opt/Megatron-DeepSpeed", **DATA}),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_framework_launch_files_match_golden(case):
    """Regenerate with TUNER_UPDATE_GOLDEN=1 and review the diff."""
    framework, lay, workload, kw = CASES[case]
    files = launch_files(lay, workload(), "/scratch/launch-70b", framework=framework, train_iters=5000, **kw)
    assert tuple(files) == FRAMEWORK_FILES[framework]
    for name, text in files.items():
        path = GOLDEN / case / name
        if os.environ.get("TUNER_UPDATE_GOLDEN"):
            path.parent.mkdir(exist_ok=True)
            path.write_text(text)
        assert text == path.read_text(), f"{name} differs from {path} (TUNER_UPDATE_GOLDEN=1 to accept)"


def test_the_sbatch_runs_the_files_it_ships_with():
    files = launch_files(LLAMA_LAYOUT, h100_workload(), "/x", framework="megatron-core", train_iters=10, **MOCK)
    args = files["megatron_args.txt"].split()
    assert "Megatron-LM/pretrain_gpt.py " + " ".join(args) in files["launch.sbatch"]
    assert "ds_config" not in files["launch.sbatch"]
    files = launch_files(z3(LLAMA_LAYOUT), h100_workload(), "/x", framework="torchtitan", train_iters=10,
                         megatron_dir="/opt/torchtitan", **MOCK)
    assert "-m torchtitan.train --job.config_file torchtitan.toml" in files["launch.sbatch"]
    assert "export PYTHONPATH=/opt/torchtitan" in files["launch.sbatch"]
    assert json.loads(files["layout.json"])["framework"] == "torchtitan"


def test_cli_framework_option(tmp_path):
    db = f"sqlite:///{tmp_path}/none.db"
    base = ["launch", "--nodes", "8", "--train-iters", "100", "--mock-data", "--db", db]
    r = CliRunner().invoke(cli, [*base, "--model", "llama3-70b", "--framework", "torchtitan", "--out", tmp_path / "tt"])
    assert r.exit_code == 0, r.output
    assert sorted(p.name for p in (tmp_path / "tt").iterdir()) == sorted(FRAMEWORK_FILES["torchtitan"])
    assert tomllib.loads((tmp_path / "tt" / "torchtitan.toml").read_text())["model"]["flavor"] == "70B"
    r = CliRunner().invoke(cli, [*base, "--model", "175b", "--nodes", "16", "--framework", "megatron-core",
                                 "--out", tmp_path / "mc"])
    assert r.exit_code == 0, r.output
    assert sorted(p.name for p in (tmp_path / "mc").iterdir()) == sorted(FRAMEWORK_FILES["megatron-core"])
    r = CliRunner().invoke(cli, [*base, "--model", "175b", "--nodes", "64", "--framework", "torchtitan",
                                 "--out", tmp_path / "no"])
    assert isinstance(r.exception, UsageError) and r.exception.exit_code == 2      # `tuner` exits 2 with the line
    assert "cannot describe model 'gpt-175b'" in str(r.exception) and not (tmp_path / "no").exists()
    r = CliRunner().invoke(cli, [*base, "--model", "175b", "--framework", "nope", "--out", tmp_path / "no"])
    assert r.exit_code == 2 and "megatron-core" in r.output


# ---- launch files that run as written: data, checkpoints, RoPE base, flash attention, compile, any cluster ----
def flags(args: list[str]) -> set[str]:
    return {a for a in args if a.startswith("--")}


@pytest.mark.parametrize("data", [MOCK, DATA, {**DATA, "tokenizer": "gpt2"}])
@pytest.mark.parametrize("framework", ["megatron-core", "megatron-deepspeed", "torchtitan"])
def test_every_launch_flag_and_key_is_checked(framework, data):
    lay = Layout(tp=8, pp=1, dp=8, micro_batch=1, zero_stage=1)
    lay = z3(lay) if framework == "torchtitan" else lay
    if framework == "megatron-deepspeed" and data is MOCK:
        with pytest.raises(UsageError) as e:
            launch_files(lay, h100_workload(), framework=framework, train_iters=10, **data)
        msg = str(e.value)
        assert e.value.exit_code == 2 and "\n" not in msg
        assert "no mock data" in msg and "--data-path PATH" in msg and "--tokenizer" in msg
        return
    files = launch_files(lay, h100_workload(), framework=framework, train_iters=10, **data)
    if framework == "torchtitan":
        keys = toml_keys(tomllib.loads(files["torchtitan.toml"]))
        assert keys <= set(TORCHTITAN_KEYS), f"unchecked keys {keys - set(TORCHTITAN_KEYS)}"
        return
    from test_sbatch import MEGATRON_FLAGS
    known = set(MCORE_FLAGS) if framework == "megatron-core" else set(MEGATRON_FLAGS)
    got = flags(files["megatron_args.txt"].split("\n"))
    assert got <= known, f"unchecked flags {got - known}"


def test_megatron_core_data_tokenizer_and_checkpoints():
    mock = mcore.pretrain_args(LLAMA_LAYOUT, h100_workload(), extra=mcore.data_args(load_model("llama3-70b"),
                                                                                     data_path=None, tokenizer=None,
                                                                                     mock_data=True))
    assert "--mock-data" in mock and value(mock, "--tokenizer-type") == "NullTokenizer"
    assert value(mock, "--vocab-size") == "128256" and "--data-path" not in mock
    files = launch_files(LLAMA_LAYOUT, h100_workload(), framework="megatron-core", train_iters=10, **DATA)
    args = files["megatron_args.txt"].splitlines()
    assert value(args, "--data-path") == DATA["data_path"] and value(args, "--split") == "99,1,0"
    assert value(args, "--tokenizer-type") == "HuggingFaceTokenizer"
    assert value(args, "--tokenizer-model") == DATA["tokenizer"] and "--mock-data" not in args
    assert value(args, "--save") == value(args, "--load") == "checkpoints" and value(args, "--save-interval") == "1000"
    files = launch_files(LLAMA_LAYOUT, h100_workload(), framework="megatron-core", train_iters=10, save_dir="/ck", **MOCK)
    args = files["megatron_args.txt"].splitlines()
    assert value(args, "--save") == value(args, "--load") == "/ck"
    assert json.loads(files["layout.json"])["save_dir"] == "/ck"


def test_megatron_deepspeed_data_tokenizer_and_checkpoints():
    files = launch_files(MDS, modern_workload(), framework="megatron-deepspeed", train_iters=10, **DATA)
    args = files["megatron_args.txt"].splitlines()
    assert value(args, "--data-path") == DATA["data_path"] and value(args, "--tokenizer-type") == "HFTokenizer"
    assert value(args, "--tokenizer-model") == DATA["tokenizer"]
    assert value(args, "--save") == value(args, "--load") == "checkpoints" and value(args, "--save-interval") == "1000"


@pytest.mark.parametrize("kw, words", [
    ({}, ["--data-path PATH", "--mock-data"]),
    ({**DATA, "mock_data": True}, ["exclude each other"]),
    ({"data_path": "/d"}, ["--tokenizer NAME_OR_PATH"]),
    ({"data_path": "/d\nrm -rf /", "tokenizer": "t"}, ["--data-path must be one non-empty line"]),
])
@pytest.mark.parametrize("framework", ["megatron-core", "megatron-deepspeed"])
def test_launch_needs_the_training_data(framework, kw, words):
    with pytest.raises(UsageError) as e:
        launch_files(LLAMA_LAYOUT, h100_workload(), framework=framework, train_iters=10, **kw)
    assert e.value.exit_code == 2 and "\n" not in str(e.value).replace("\\n", "")
    assert all(w in str(e.value) for w in words), str(e.value)


def test_torchtitan_data_tokenizer_checkpoints_and_mock_data():
    job = tomllib.loads(launch_files(z3(LLAMA_LAYOUT), h100_workload(), framework="torchtitan", train_iters=10,
                                     **TT_DATA)["torchtitan.toml"])
    assert job["training"]["dataset"] == "c4" and job["training"]["dataset_path"] == TT_DATA["data_path"]
    assert job["model"]["hf_assets_path"] == TT_DATA["tokenizer"]
    assert job["checkpoint"] == {"enable": True, "folder": "checkpoints", "interval": 1000}
    mock = tomllib.loads(launch_files(z3(LLAMA_LAYOUT), h100_workload(), framework="torchtitan", train_iters=10,
                                      megatron_dir="/opt/torchtitan", **MOCK)["torchtitan.toml"])
    assert mock["training"]["dataset"] == "c4_test"
    assert mock["training"]["dataset_path"] == "/opt/torchtitan/tests/assets/c4_test"
    assert mock["model"]["hf_assets_path"] == "/opt/torchtitan/tests/assets/tokenizer"
    with pytest.raises(UsageError, match="--tokenizer DIR"):
        launch_files(z3(LLAMA_LAYOUT), h100_workload(), framework="torchtitan", train_iters=10, data_path="/d")


@pytest.mark.parametrize("precision", ["bf16", "fp8"])
def test_torchtitan_compiles_float8(precision):
    job = tomllib.loads(torchtitan.render_job(MODERN, modern_workload(precision)))
    if precision == "fp8":
        assert job["compile"] == {"enable": True, "components": ["model", "loss"]}
    else:
        assert "compile" not in job


def test_rotary_base_from_the_models_rope_theta():
    llama3, llama2 = load_model("llama3-70b"), load_model("llama2-70b")
    assert getattr(llama3, "rope_theta", None) == 500000
    assert value(mcore.architecture_args(llama3), "--rotary-base") == "500000"
    assert value(megatron.architecture_args(llama3), "--rotary-position-embeddings-theta") == "500000"
    for m in (llama2, dataclasses.replace(llama3, rope_theta=10000.0), dataclasses.replace(llama3, rope_theta=None),
              load_model("175b")):
        assert "--rotary-base" not in mcore.architecture_args(m)            # Megatron's default 10000, or no RoPE
        assert "--rotary-position-embeddings-theta" not in megatron.architecture_args(m)
    with pytest.raises(UsageError, match="cannot describe model"):            # no llama3 flavor has another base
        torchtitan.flavor(dataclasses.replace(llama3, rope_theta=1e6))


def test_flash_attention_where_the_model_assumed_it():
    lay = Layout(tp=8, pp=1, dp=8, micro_batch=1, zero_stage=1)
    w = h100_workload()
    no_flash = dataclasses.replace(w, cluster=dataclasses.replace(w.cluster, flash_attention=False))
    assert value(mcore.pretrain_args(lay, w), "--attention-backend") == "flash"
    assert "--attention-backend" not in mcore.pretrain_args(lay, no_flash)
    gpt = h100_workload("175b")
    assert "--use-flash-attn-v2" in megatron.pretrain_args(lay, gpt)
    assert "--use-flash-attn-v2" not in megatron.pretrain_args(lay, dataclasses.replace(gpt, cluster=no_flash.cluster))


CLUSTERS = sorted(p.stem for p in (Path(__file__).parent.parent / "workloads" / "clusters").glob("*.toml"))


@pytest.mark.parametrize("framework", ["megatron-deepspeed", "megatron-core"])
@pytest.mark.parametrize("cluster", CLUSTERS)
def test_every_cluster_preset_launches(cluster, framework, tmp_path):
    """Every preset gets a launch script, a generic one where the cluster has no [slurm] table; and no file
    holds a path of the machine that wrote it or a TUNER_* trial variable."""
    c = load_cluster(cluster)
    w = make_workload("tiny", 1, c)
    lay = Layout(tp=1, pp=1, dp=c.gpus_per_node, micro_batch=w.global_batch // c.gpus_per_node)
    files = launch_files(lay, w, tmp_path, framework=framework, train_iters=10, **GPT_DATA)
    sb = files["launch.sbatch"]
    subprocess.run(["bash", "-n"], input=sb, text=True, check=True)
    assert f"#SBATCH --ntasks-per-node={(c.slurm or {}).get('tasks_per_node') or c.gpus_per_node}" in sb
    assert f"#SBATCH --job-name=tiny-tp1-pp1-dp{c.gpus_per_node}\n" in sb
    assert ("no [slurm] table" in sb) == (c.slurm is None)
    if c.slurm is None:
        assert f"#SBATCH --gpus-per-node={c.gpus_per_node}" in sb and "#SBATCH --account" in sb.split("\n")[2]
    for name, text in files.items():
        for where in (str(tmp_path), os.getcwd(), str(Path.home())):
            assert where not in text, f"{name} holds {where}, a path of the machine that wrote it"
        assert "TUNER_" not in text, f"{name} holds a tuner trial variable"
    assert json.loads(files["layout.json"])["submit"] == "sbatch launch.sbatch"


@pytest.mark.parametrize("case", sorted(CASES))
def test_golden_launch_files_hold_no_writer_paths_or_trial_variables(case):
    framework, lay, workload, kw = CASES[case]
    for out in ("/scratch/launch-70b", "/some/where/else"):
        files = launch_files(lay, workload(), out, framework=framework, train_iters=5000, **kw)
        assert not any(out in text or "TUNER_" in text for text in files.values())


def test_a_launch_script_runs_in_its_submit_directory(tmp_path):
    files = launch_files(LLAMA_LAYOUT, h100_workload(), framework="megatron-core", train_iters=10, **MOCK)
    sb = files["launch.sbatch"]
    assert 'cd "${SLURM_SUBMIT_DIR:-.}" || exit 1' in sb and "exit_status" not in sb
    prologue = sb.split("export MASTER_ADDR=")[0]
    env = {**os.environ, "SLURM_SUBMIT_DIR": str(tmp_path)}
    r = subprocess.run(["bash", "-c", prologue + "pwd"], env=env, capture_output=True, text=True)
    assert r.returncode == 1 and "no layout.json" in r.stderr and "sbatch launch.sbatch" in r.stderr
    (tmp_path / "layout.json").write_text(files["layout.json"])
    r = subprocess.run(["bash", "-c", prologue + "pwd"], env=env, capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.strip() == str(tmp_path)
