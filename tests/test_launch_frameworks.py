"""`tuner launch --framework megatron-core|torchtitan` (issue 14, item 5): every flag and key checked
against the framework's own source, golden files, refusals, and the CLI option."""

from __future__ import annotations

import dataclasses
import json
import os
import tomllib
from pathlib import Path

import pytest
from click.testing import CliRunner

from tuner.cli import cli
from tuner.errors import UsageError
from tuner.layout import Layout
from tuner.render import mcore, torchtitan
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
# (A:2397); `--recompute-granularity` 'full' (TC:532), `--recompute-method` 'uniform' (TC:543).
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
    "--recompute-num-layers": "TC:551",
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
}

H100_SLURM = {"partition": "batch", "account": "abc123", "tasks_per_node": 8, "gpus_per_node": 8}


def h100_workload(model: str = "llama3-70b", nodes: int = 8):
    """The h100 preset has no [slurm] table: one is given here, as a user's cluster file would."""
    cluster = dataclasses.replace(load_cluster("h100"), slurm=H100_SLURM)
    return make_workload(load_model(model), nodes, cluster)


LLAMA_LAYOUT = Layout(tp=8, pp=4, dp=2, micro_batch=1, zero_stage=1, recompute="full")
GPT_LAYOUT = Layout(tp=4, pp=16, dp=2, micro_batch=1)
LAYOUTS = [LLAMA_LAYOUT, Layout(tp=8, pp=1, dp=8, micro_batch=2, zero_stage=0, recompute="none")]


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
@pytest.mark.parametrize("model", ["175b", "llama3-70b", "llama3-8b"])
@pytest.mark.parametrize("lay", LAYOUTS)
def test_every_megatron_core_flag_is_checked(lay, model, precision):
    args = mcore.pretrain_args(lay, h100_workload(model), precision=precision)
    flags = {a for a in args if a.startswith("--")}
    assert flags <= set(MCORE_FLAGS), f"unchecked flags {flags - set(MCORE_FLAGS)}: check them in Megatron-LM"
    assert ("--use-distributed-optimizer" in flags) == (lay.zero_stage >= 1)
    assert ("--recompute-granularity" in flags) == lay.activation_checkpointing


def test_megatron_core_architecture_flags_follow_the_spec():
    llama = mcore.architecture_args(load_model("llama3-70b"))
    assert llama == ["--group-query-attention", "--num-query-groups", "8", "--swiglu", "--position-embedding-type",
                     "rope", "--untie-embeddings-and-output-weights", "--normalization", "RMSNorm",
                     "--disable-bias-linear"]
    assert mcore.architecture_args(load_model("175b")) == []          # GPT-3: Megatron's defaults


@pytest.mark.parametrize("zero", [2, 3])
def test_megatron_core_refuses_zero_2_and_3(zero):
    with pytest.raises(UsageError, match=f"zero_stage {zero}.*distributed optimizer") as e:
        mcore.pretrain_args(dataclasses.replace(LLAMA_LAYOUT, zero_stage=zero), h100_workload())
    assert e.value.exit_code == 2 and "\n" not in str(e.value)


@pytest.mark.parametrize("lay", LAYOUTS + [Layout(tp=4, pp=2, dp=8, micro_batch=4, zero_stage=3)])
def test_every_torchtitan_key_is_checked_and_the_batch_adds_up(lay):
    w = h100_workload()
    job = tomllib.loads(torchtitan.render_job(lay, w, iterations=7))
    keys = {f"{s}.{k}" for s, table in job.items() for k in table}
    assert keys <= set(TORCHTITAN_KEYS), f"unchecked keys {keys - set(TORCHTITAN_KEYS)}: check them in job_config.py"
    p, t = job["parallelism"], job["training"]
    assert p["data_parallel_shard_degree"] * p["tensor_parallel_degree"] * p["pipeline_parallel_degree"] == w.gpus
    assert t["global_batch_size"] == w.global_batch and t["global_batch_size"] % (t["local_batch_size"] * lay.dp) == 0
    if lay.pp > 1:
        assert t["local_batch_size"] % p["pipeline_parallel_microbatch_size"] == 0
    assert job["activation_checkpoint"]["mode"] == ("full" if lay.activation_checkpointing else "none")
    assert t["steps"] == 7 and job["model"] == {"name": "llama3", "flavor": "70B"}


def test_torchtitan_refuses_fp16_and_a_model_without_a_flavor():
    with pytest.raises(UsageError, match="bf16 only"):
        torchtitan.render_job(LLAMA_LAYOUT, h100_workload(), precision="fp16")
    with pytest.raises(UsageError, match="cannot describe model 'gpt-175b'"):
        torchtitan.render_job(GPT_LAYOUT, make_workload("175b", 16))


CASES = {
    "launch_mcore_175b_16n": ("megatron-core", GPT_LAYOUT, lambda: make_workload("175b", 16),
                              "/lustre/orion/abc123/launch", {"account": "abc123", "time_limit": "02:00:00",
                                                              "megatron_dir": "/lustre/orion/abc123/Megatron-LM"}),
    "launch_mcore_llama3-70b_8n_h100": ("megatron-core", LLAMA_LAYOUT, h100_workload, "/scratch/launch-70b",
                                        {"megatron_dir": "/opt/Megatron-LM"}),
    "launch_torchtitan_llama3-70b_8n_h100": ("torchtitan", LLAMA_LAYOUT, h100_workload, "/scratch/launch-70b", {}),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_framework_launch_files_match_golden(case):
    """Regenerate with TUNER_UPDATE_GOLDEN=1 and review the diff."""
    framework, lay, workload, out, kw = CASES[case]
    files = launch_files(lay, workload(), out, framework=framework, train_iters=5000, **kw)
    assert tuple(files) == FRAMEWORK_FILES[framework]
    for name, text in files.items():
        path = GOLDEN / case / name
        if os.environ.get("TUNER_UPDATE_GOLDEN"):
            path.parent.mkdir(exist_ok=True)
            path.write_text(text)
        assert text == path.read_text(), f"{name} differs from {path} (TUNER_UPDATE_GOLDEN=1 to accept)"


def test_the_sbatch_runs_the_files_it_ships_with():
    files = launch_files(LLAMA_LAYOUT, h100_workload(), "/x", framework="megatron-core", train_iters=10)
    args = files["megatron_args.txt"].split()
    assert "Megatron-LM/pretrain_gpt.py " + " ".join(args) in files["launch.sbatch"]
    assert "ds_config" not in files["launch.sbatch"]
    files = launch_files(LLAMA_LAYOUT, h100_workload(), "/x", framework="torchtitan", train_iters=10,
                         megatron_dir="/opt/torchtitan")
    assert "-m torchtitan.train --job.config_file torchtitan.toml" in files["launch.sbatch"]
    assert "export PYTHONPATH=/opt/torchtitan" in files["launch.sbatch"]
    assert json.loads(files["layout.json"])["framework"] == "torchtitan"


def test_cli_framework_option(tmp_path):
    db = f"sqlite:///{tmp_path}/none.db"
    base = ["launch", "--nodes", "8", "--train-iters", "100", "--db", db]
    r = CliRunner().invoke(cli, [*base, "--model", "llama3-70b", "--framework", "torchtitan", "--out", tmp_path / "tt"])
    assert r.exit_code == 0, r.output
    assert sorted(p.name for p in (tmp_path / "tt").iterdir()) == sorted(FRAMEWORK_FILES["torchtitan"])
    assert tomllib.loads((tmp_path / "tt" / "torchtitan.toml").read_text())["model"]["flavor"] == "70B"
    r = CliRunner().invoke(cli, [*base, "--model", "175b", "--nodes", "16", "--framework", "megatron-core",
                                 "--out", tmp_path / "mc"])
    assert r.exit_code == 0, r.output
    assert sorted(p.name for p in (tmp_path / "mc").iterdir()) == sorted(FRAMEWORK_FILES["megatron-core"])
    r = CliRunner().invoke(cli, [*base, "--model", "175b", "--framework", "torchtitan", "--out", tmp_path / "no"])
    assert isinstance(r.exception, UsageError) and r.exception.exit_code == 2      # `tuner` exits 2 with the line
    assert "cannot describe model 'gpt-175b'" in str(r.exception) and not (tmp_path / "no").exists()
    r = CliRunner().invoke(cli, [*base, "--model", "175b", "--framework", "nope", "--out", tmp_path / "no"])
    assert r.exit_code == 2 and "megatron-core" in r.output
