"""The training stack is part of every answer: rules, memory, overlaps, storage and defaults per framework."""

from __future__ import annotations

import dataclasses
import json

import pytest
from click.testing import CliRunner

from tuner import frameworks
from tuner.cli import cli
from tuner.errors import UsageError
from tuner.layout import Layout, why_invalid
from tuner.perfmodel import PRUNE_BELOW, RECOMMEND_AT, predict
from tuner.space import load_space, valid_layouts
from tuner.specs import ClusterSpec, Workload, load_cluster, make_workload


def test_each_cluster_preset_names_its_stack():
    assert make_workload("175b", 16).framework == "megatron-deepspeed"          # the Frontier study's
    assert make_workload("llama3-70b", 8, "h100").framework == "megatron-core"
    assert make_workload("llama3-70b", 8, "h200").framework == "megatron-core"
    assert make_workload("llama3-70b", 8, "h100", framework="torchtitan").framework == "torchtitan"
    with pytest.raises(UsageError, match="--framework must be one of"):
        make_workload("175b", 16, framework="nemo")


def test_a_cluster_stored_with_comm_overlap_reads_as_its_stack():
    d = {**load_cluster("h100").as_dict(), "comm_overlap": True, "memory_headroom": 0.05}
    del d["framework"]
    assert ClusterSpec.from_dict(d).framework == "megatron-core"
    old = make_workload("175b", 16).as_dict()
    del old["framework"]
    assert Workload.from_dict(old).framework == "megatron-deepspeed"


@pytest.mark.parametrize("framework, rule", [
    ("megatron-deepspeed", lambda lay: lay.context_parallel == 1 and lay.virtual_pipeline == 1
     and not (lay.pp > 1 and lay.zero_stage >= 2)),
    ("megatron-core", lambda lay: lay.zero_stage <= 1),
    ("torchtitan", lambda lay: lay.zero_stage == 3 and lay.sequence_parallel == (lay.tp > 1)),
])
def test_a_search_space_holds_only_what_the_framework_runs(framework, rule):
    w = make_workload("llama3-70b", 8, "h100", framework=framework)
    layouts = valid_layouts(load_space(), w)
    assert layouts and all(rule(lay) for lay in layouts)
    assert all(frameworks.get(framework).refusal(lay, w) is None for lay in layouts)


def test_refusals_are_one_line_naming_the_fix():
    lay = Layout(tp=4, sequence_parallel=True, context_parallel=2, pp=4, virtual_pipeline=5, dp=2, micro_batch=1,
                 zero_stage=1, recompute="none")
    ds = make_workload("llama3-70b", 8, "h100", framework="megatron-deepspeed")
    assert "use --framework megatron-core" in why_invalid(lay, ds)
    tt = make_workload("llama3-70b", 8, "h100", framework="torchtitan")
    assert "zero_stage 3" in why_invalid(lay, tt)
    mc = make_workload("llama3-70b", 8, "h100", framework="megatron-core")
    assert why_invalid(lay, mc) is None
    assert "distributed optimizer" in why_invalid(dataclasses.replace(lay, zero_stage=3), mc)


def test_memory_follows_the_framework():
    """Megatron-Core keeps fp32 main gradients (6 + 12/d bytes with the distributed optimizer); torchtitan's
    FSDP2 shards everything (16/d) and gathers a layer at a time."""
    lay = Layout(tp=8, sequence_parallel=True, pp=1, dp=8, micro_batch=1, zero_stage=1, recompute="full")
    ds, mc = (predict(lay, make_workload("llama3-70b", 8, "h100", framework=f)) for f in
              ("megatron-deepspeed", "megatron-core"))
    params = ds.memory_breakdown["weights"] / 2.0                      # GB of parameters per GPU
    assert mc.memory_breakdown["gradients"] == pytest.approx(4.0 * params)
    assert ds.memory_breakdown["gradients"] == pytest.approx(2.0 * params)
    tt = predict(dataclasses.replace(lay, zero_stage=3), make_workload("llama3-70b", 8, "h100", framework="torchtitan"))
    assert tt.memory_breakdown["weights"] + tt.memory_breakdown["gradients"] + tt.memory_breakdown["optimizer"] == \
        pytest.approx(16.0 * params / 8)
    assert tt.memory_breakdown["zero3_buffers"] > 0


def test_fsdp_collectives_hide_under_compute_and_show_when_compute_is_short():
    w = make_workload("llama3-8b", 16, "h100", framework="torchtitan")
    big = predict(Layout(tp=1, pp=1, dp=128, micro_batch=2, zero_stage=3, recompute="none"), w)
    slow_net = dataclasses.replace(w, cluster=dataclasses.replace(w.cluster, inter_node_bandwidth_gbps=5.0))
    exposed = predict(Layout(tp=1, pp=1, dp=128, micro_batch=2, zero_stage=3, recompute="none"), slow_net)
    assert exposed.time_breakdown["dp_param_gather"] > big.time_breakdown["dp_param_gather"]
    assert exposed.time_breakdown["dp_grad_reduce"] > 10 * max(big.time_breakdown["dp_grad_reduce"], 1e-6)


def test_fit_probability_is_the_frameworks_measured_error():
    w = make_workload("llama3-70b", 8, "h100")
    preds = [predict(lay, w) for lay in valid_layouts(load_space(), w)]
    fw = frameworks.of(w)
    for p in preds[:500]:
        assert p.fits == (p.p_fit >= PRUNE_BELOW)
        if p.memory_gb <= w.cluster.memory_gb * 0.99 * pow(2.718281828, -fw.memory_bias - 1.645 * fw.memory_sd):
            assert p.p_fit >= RECOMMEND_AT


def test_the_default_search_recommends_what_the_framework_runs_and_launch_writes_its_files(tmp_path):
    db = f"sqlite:///{tmp_path}/s.db"
    r = CliRunner().invoke(cli, ["search", "--model", "175b", "--nodes", "16", "--budget", "6", "--study", "f",
                                 "--db", db])
    assert r.exit_code == 0, r.output
    assert "--train-iters" in r.output
    r = CliRunner().invoke(cli, ["launch", "f", "--out", str(tmp_path / "l"), "--train-iters", "10",
                                 "--data-path", "/d/x", "--tokenizer", "gpt2", "--db", db])
    assert r.exit_code == 0, r.output
    assert (tmp_path / "l" / "ds_config.json").exists()
    summary = json.loads((tmp_path / "l" / "layout.json").read_text())
    assert summary["layout"]["virtual_pipeline"] == 1 and summary["layout"]["context_parallel"] == 1
    r = CliRunner().invoke(cli, ["best", "--model", "175b", "--nodes", "16", "--framework", "megatron-core",
                                 "--format", "json", "--db", db])
    assert r.exit_code == 0 and json.loads(r.stdout)["predicted"] is True    # another stack's trials are not its answer


@pytest.mark.parametrize("framework, files", [("megatron-core", {"megatron_args.txt"}),
                                              ("torchtitan", {"torchtitan.toml"})])
def test_on_h100_each_framework_searches_and_launches_its_own_files(tmp_path, framework, files):
    db = f"sqlite:///{tmp_path}/s.db"
    r = CliRunner().invoke(cli, ["search", "--model", "llama3-8b", "--cluster", "h100", "--nodes", "2", "--budget", "5",
                                 "--framework", framework, "--study", "s", "--db", db])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(cli, ["launch", "s", "--out", str(tmp_path / "l"), "--train-iters", "10", "--mock-data",
                                 "--db", db])
    assert r.exit_code == 0, r.output
    written = {p.name for p in (tmp_path / "l").iterdir()}
    assert files <= written and "ds_config.json" not in written
    lay = json.loads((tmp_path / "l" / "layout.json").read_text())["layout"]
    assert frameworks.get(framework).refusal(Layout.from_dict(lay), make_workload("llama3-8b", 2, "h100")) is None
