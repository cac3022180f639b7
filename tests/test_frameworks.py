"""The training stack is part of every answer: rules, memory, overlaps, storage and defaults per framework."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
from click.testing import CliRunner

from tuner import frameworks
from tuner.cli import cli
from tuner.errors import UsageError
from tuner.layout import Layout, why_invalid
from tuner.perfmodel import PRUNE_BELOW, RECOMMEND_AT, predict
from tuner.space import load_space, valid_layouts
from tuner.specs import Workload, make_workload, stored_framework


def test_each_cluster_preset_names_its_stack():
    assert make_workload("175b", 16).framework == "megatron-deepspeed"          # the Frontier study's
    assert make_workload("llama3-70b", 8, "h100").framework == "megatron-core"
    assert make_workload("llama3-70b", 8, "h200").framework == "megatron-core"
    assert make_workload("llama3-70b", 8, "h100", framework="torchtitan").framework == "torchtitan"
    with pytest.raises(UsageError, match="--framework must be one of"):
        make_workload("175b", 16, framework="nemo")


def _stored_before_frameworks(workload: Workload) -> dict:
    """A workload as a tuner before frameworks stored it: no framework, the cluster's comm_overlap and
    memory_headroom."""
    old = workload.as_dict()
    del old["framework"]
    cluster = old["cluster"]
    cluster["comm_overlap"] = cluster.pop("framework") == "megatron-core"
    cluster["memory_headroom"] = 0.05
    return old


@pytest.mark.parametrize("cluster, stack", [("h100", "megatron-core"), ("frontier", "megatron-deepspeed")])
def test_a_workload_stored_before_frameworks_reads_as_its_clusters_stack(cluster, stack):
    old = _stored_before_frameworks(make_workload("llama3-8b", 2, cluster))
    assert Workload.from_dict(old).framework == stored_framework(old) == stack


@pytest.mark.parametrize("framework, rule", [
    ("megatron-deepspeed", lambda lay: lay.context_parallel == 1 and lay.virtual_pipeline == 1
     and not (lay.pp > 1 and lay.zero_stage >= 2)),
    ("megatron-core", lambda lay: lay.zero_stage <= 1 or lay.pp == 1),      # 2 / 3: Megatron-FSDP, pp 1
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
    assert "use --framework megatron-core" in why_invalid(lay, ds) and "\n" not in why_invalid(lay, ds)
    tt = make_workload("llama3-70b", 8, "h100", framework="torchtitan")
    assert "zero_stage 3" in why_invalid(lay, tt)
    mc = make_workload("llama3-70b", 8, "h100", framework="megatron-core")
    assert why_invalid(lay, mc) is None
    assert "Megatron-FSDP (zero_stage 3) here without pipelining" in why_invalid(dataclasses.replace(lay, zero_stage=3), mc)


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


@pytest.mark.parametrize("framework", ["megatron-core", "torchtitan"])
def test_one_fit_probability_from_the_frameworks_measured_error(framework):
    """p_fit is P(true <= HBM) under log(true / predicted) ~ N(the framework's bias, its spread): 1/2 exactly
    where the predicted peak times exp(bias) is the HBM (torchtitan's bias is +0.30: its peaks run higher);
    `best` (the memory correction with no data) and guided state the same number as `predict`."""
    from tuner.best import corrected
    from tuner.correction import Observations
    w = make_workload("llama3-70b", 8, "h100", framework=framework)
    fw = frameworks.of(w)
    layouts = valid_layouts(load_space().pinned({"offload_layers": 0}), w)[::7]    # no offloaded twins
    preds = [predict(lay, w) for lay in layouts]
    for p in preds:
        assert (p.p_fit >= 0.5) == (p.memory_gb <= w.cluster.memory_gb)
        assert p.fits == (p.p_fit >= PRUNE_BELOW)
    assert any(p.p_fit >= RECOMMEND_AT for p in preds) and any(p.p_fit < RECOMMEND_AT for p in preds)
    rows = corrected(layouts, w, Observations(), preds)
    assert max(abs(r["p_fit"] - p.p_fit) for r, p in zip(rows, preds)) < 1e-9
    assert max(abs(r["memory_gb"] - p.memory_gb) for r, p in zip(rows, preds)) < 1e-9    # one figure everywhere


def test_a_study_stored_before_frameworks_answers_only_what_its_stack_runs(tmp_path):
    """A Frontier study searched when the default space allowed interleaving is read as Megatron-DeepSpeed:
    `best` and `launch` skip its refused layouts, and `launch NAME --framework` may choose its files."""
    import sqlite3
    db = tmp_path / "s.db"
    r = CliRunner().invoke(cli, ["search", "--model", "22b", "--nodes", "8", "--budget", "8", "--framework",
                                 "megatron-core", "--vp", "4", "--study", "old", "--db", f"sqlite:///{db}"])
    assert r.exit_code == 0, r.output
    con = sqlite3.connect(db)
    (stored,) = con.execute("select workload from studies where name = 'old'").fetchone()
    legacy = _stored_before_frameworks(Workload.from_dict(json.loads(stored)))
    legacy["cluster"]["comm_overlap"] = False          # frontier's: read back as Megatron-DeepSpeed
    con.execute("update studies set workload = ? where name = 'old'", (json.dumps(legacy),))
    con.commit()
    con.close()
    args = ["--db", f"sqlite:///{db}", "--train-iters", "10", "--data-path", "/d/x", "--tokenizer", "gpt2"]
    r = CliRunner().invoke(cli, ["launch", "old", "--out", str(tmp_path / "a"), *args])
    assert isinstance(r.exception, Exception) and "no successful trial that megatron-deepspeed runs" in str(r.exception)
    r = CliRunner().invoke(cli, ["launch", "old", "--out", str(tmp_path / "b"), "--framework", "megatron-core", *args])
    assert r.exit_code == 0, r.output
    assert json.loads((tmp_path / "b" / "layout.json").read_text())["layout"]["virtual_pipeline"] == 4
    r = CliRunner().invoke(cli, ["best", "--model", "22b", "--nodes", "8", "--format", "json", "--db", f"sqlite:///{db}"])
    assert r.exit_code == 0 and json.loads(r.stdout)["predicted"] is True     # no stored answer Megatron-DeepSpeed runs


def test_best_of_one_study_answers_in_that_studys_framework(tmp_path):
    db = f"sqlite:///{tmp_path}/s.db"
    r = CliRunner().invoke(cli, ["search", "--model", "llama3-8b", "--cluster", "h100", "--nodes", "2", "--budget", "3",
                                 "--framework", "torchtitan", "--study", "tt", "--db", db])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(cli, ["best", "--model", "llama3-8b", "--cluster", "h100", "--nodes", "2", "--study", "tt",
                                 "--format", "json", "--db", db])
    assert r.exit_code == 0, r.output
    got = json.loads(r.stdout)
    assert got["framework"] == "torchtitan" and got["study"] == "tt" and got["layout"]["zero_stage"] == 3


def test_slurm_command_template_keeps_the_frameworks_whole_space():
    from tuner import study
    w = make_workload("llama3-70b", 8, "h100", framework="torchtitan")
    rec = study.new_record("s", w, load_space(), runner="slurm", runner_options={"template": "command"})
    kept = study.runnable_layouts(rec, w, load_space())
    assert len(kept) == len(valid_layouts(load_space(), w)) and any(lay.pp > 1 for lay in kept)


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
