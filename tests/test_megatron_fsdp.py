"""Megatron-FSDP in Megatron-Core (issue 25, item 2): zero_stage 2 (--data-parallel-sharding-strategy
optim_grads) and 3 (optim_grads_params), with expert parallelism, without pipelining; its memory (sharded
gradients and optimizer states, and parameters at 3), its collectives (FSDP's, layer by layer under compute)
and its launch flags (checked in tests/test_launch_frameworks.py MCORE_FLAGS against Megatron-LM)."""

from __future__ import annotations

import dataclasses
import json

import pytest
from click.testing import CliRunner

from tuner.cli import cli
from tuner.layout import Layout, why_invalid
from tuner.perfmodel import predict
from tuner.render.launch import launch_files
from tuner.specs import load_cluster, make_workload


def llama8b(nodes: int = 2, **kw):
    return make_workload("llama3-8b", nodes, load_cluster("h100"), framework="megatron-core", grad_reduce="bf16", **kw)


def flat(zero: int, dp: int = 16, **kw) -> Layout:
    return Layout(tp=1, pp=1, dp=dp, micro_batch=1, zero_stage=zero, recompute="full", **kw)


def test_zero_2_and_3_run_without_pipelining_only():
    w = llama8b()
    assert all(why_invalid(flat(z), w) is None for z in (0, 1, 2, 3))
    piped = Layout(tp=1, pp=2, dp=8, micro_batch=1, zero_stage=3, recompute="full")
    assert "Megatron-FSDP (zero_stage 3) here without pipelining" in why_invalid(piped, w)
    assert why_invalid(dataclasses.replace(piped, zero_stage=1), w) is None


def test_memory_shards_what_each_strategy_shards():
    """ZeRO-1 (the distributed optimizer): optimizer states / d; optim_grads: the gradients too;
    optim_grads_params: the bf16 parameters too, plus the gathered layers' buffers."""
    w = llama8b()
    one, two, three = (predict(flat(z), w).memory_breakdown for z in (1, 2, 3))
    d = 16
    assert two["weights"] == pytest.approx(one["weights"]) and two["gradients"] == pytest.approx(one["gradients"] / d)
    assert two["optimizer"] == pytest.approx(one["optimizer"])
    assert three["weights"] == pytest.approx(one["weights"] / d) and three["gradients"] == pytest.approx(two["gradients"])
    assert three["zero3_buffers"] > 0 == two["zero3_buffers"] == one["zero3_buffers"]


def test_expert_states_shard_over_the_expert_data_parallel_group():
    w = make_workload("qwen3-30b-a3b", 2, load_cluster("h100"), framework="megatron-core", grad_reduce="bf16")
    lays = {ep: Layout(tp=1, pp=1, dp=16, expert_parallel=ep, micro_batch=1, zero_stage=3, recompute="full")
            for ep in (2, 8)}
    assert all(why_invalid(lay, w) is None for lay in lays.values())
    mem = {ep: predict(lay, w).memory_breakdown for ep, lay in lays.items()}
    # each GPU holds num_experts / ep of the experts, sharded over 16 / ep expert-dp replicas: the same bytes
    assert mem[2]["weights"] == pytest.approx(mem[8]["weights"], rel=1e-6)
    z1 = predict(dataclasses.replace(lays[8], zero_stage=1), w).memory_breakdown
    assert mem[8]["weights"] < z1["weights"] / 2      # experts over expert-dp 2, the rest over dp 16


def test_collectives_hide_under_compute_and_show_on_a_slow_network():
    w = llama8b(4)
    slow = dataclasses.replace(w, cluster=dataclasses.replace(w.cluster, inter_node_bandwidth_gbps=5.0))
    lay = flat(3, dp=32)
    fast_t, slow_t = predict(lay, w).time_breakdown, predict(lay, slow).time_breakdown
    assert slow_t["dp_param_gather"] > fast_t["dp_param_gather"] and slow_t["dp_grad_reduce"] > fast_t["dp_grad_reduce"]
    two = predict(flat(2, dp=32), slow).time_breakdown      # optim_grads: no per-layer gathers
    assert two["dp_param_gather"] < slow_t["dp_param_gather"]


def test_launch_writes_megatron_fsdp_and_leaves_cuda_device_max_connections_unset(tmp_path):
    w = llama8b()
    files = launch_files(flat(3), w, "/scratch/l", framework="megatron-core", train_iters=10, mock_data=True)
    args = files["megatron_args.txt"].split("\n")
    assert args[args.index("--data-parallel-sharding-strategy") + 1] == "optim_grads_params"
    assert "--use-megatron-fsdp" in args and args[args.index("--ckpt-format") + 1] == "fsdp_dtensor"
    assert "unset CUDA_DEVICE_MAX_CONNECTIONS\n" in files["launch.sbatch"]     # also against the submitting shell
    assert "export CUDA_DEVICE_MAX_CONNECTIONS" not in files["launch.sbatch"]
    two = launch_files(flat(2), w, "/scratch/l", framework="megatron-core", train_iters=10, mock_data=True)
    assert "optim_grads\n" in two["megatron_args.txt"]


def test_the_published_megatron_fsdp_run_predicts():
    """Megatron-Bridge's performance summary: Llama 3 8B, 8 H100, FP8, FSDP 1 (benchmarks/data/
    llama_published.toml): refused before Megatron-FSDP had a name, predicted now."""
    r = CliRunner().invoke(cli, ["predict", "--model", "llama3-8b", "--cluster", "h100", "--nodes", "1",
                                 "--framework", "megatron-core", "--grad-reduce", "bf16", "--precision", "fp8",
                                 "--tp", "1", "--pp", "1", "--micro-batch", "1", "--zero-stage", "3",
                                 "--recompute", "none", "--format", "json"])
    assert r.exit_code == 0, r.output
    got = json.loads(r.output)
    assert got["layout"]["zero_stage"] == 3 and got["samples_per_second"] > 0
