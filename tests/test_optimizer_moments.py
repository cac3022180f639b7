"""Adam's moments in bf16 (issue 25, item 2): Megatron-Core's precision-aware optimizer, as NVIDIA's DeepSeek-V3
H100 recipe runs it (Megatron-Bridge src/megatron/bridge/recipes/deepseek/h100/deepseek_v3.py lines 221-225 @
067f987df): its memory, where Megatron-Core refuses it, and the flags `launch` writes (checked in MCORE_FLAGS)."""

from __future__ import annotations

import dataclasses

import pytest
from click.testing import CliRunner

from tuner.cli import cli
from tuner.errors import UsageError
from tuner.layout import Layout
from tuner.perfmodel import predict
from tuner.render import mcore
from tuner.specs import Workload, make_workload

from tests.test_launch_frameworks import MCORE_FLAGS

LAY = Layout(tp=1, pp=1, dp=8, micro_batch=1, zero_stage=1, recompute="none")


def _w(**kw):
    return make_workload("llama3-8b", 1, "h100", framework="megatron-core", grad_reduce="bf16", **kw)


def test_bf16_moments_save_four_bytes_per_parameter_of_the_sharded_states():
    fp32, bf16 = predict(LAY, _w()), predict(LAY, _w(optimizer_moments="bf16"))
    # the distributed optimizer's fp32 main parameters (4) and two moments (4 + 4 -> 2 + 2), sharded over dp
    assert bf16.memory_breakdown["optimizer"] == pytest.approx(fp32.memory_breakdown["optimizer"] * 8 / 12)
    assert bf16.memory_breakdown["weights"] == fp32.memory_breakdown["weights"]
    assert bf16.step_time_s == fp32.step_time_s
    assert _w(optimizer_moments="fp32") == _w()              # fp32 is the default, one workload


def test_megatron_core_refuses_them_without_the_distributed_optimizer_and_other_stacks_have_none():
    from tuner.layout import why_invalid
    w = _w(optimizer_moments="bf16")
    assert "only supported with distributed optimizer" in why_invalid(dataclasses.replace(LAY, zero_stage=0), w)
    assert why_invalid(LAY, w) is None
    with pytest.raises(UsageError, match="precision-aware optimizer; torchtitan keeps"):
        make_workload("llama3-8b", 1, "h100", framework="torchtitan", optimizer_moments="bf16")
    with pytest.raises(UsageError, match="--optimizer-moments must be one of fp32, bf16"):
        _w(optimizer_moments="fp16")


def test_launch_writes_the_precision_aware_optimizer_as_predicted_and_the_workload_keeps_it():
    w = _w(optimizer_moments="bf16")
    args = mcore.pretrain_args(LAY, w)
    assert args[args.index("--exp-avg-dtype") + 1] == "bf16" and args[args.index("--exp-avg-sq-dtype") + 1] == "bf16"
    assert "--use-precision-aware-optimizer" in args and "--use-distributed-optimizer" in args
    assert {a for a in args if a.startswith("--")} <= set(MCORE_FLAGS)
    assert "--use-precision-aware-optimizer" not in mcore.pretrain_args(LAY, _w())
    assert Workload.from_dict(w.as_dict()) == w
    assert "optimizer_moments" not in _w().as_dict()          # stored workloads of before read back the same


def test_the_commands_take_it_and_refuse_it_in_one_line():
    base = ["predict", "--model", "llama3-8b", "--cluster", "h100", "--nodes", "1", "--tp", "1", "--pp", "1",
            "--micro-batch", "1", "--zero-stage", "1", "--framework", "megatron-core"]
    r = CliRunner().invoke(cli, [*base, "--optimizer-moments", "bf16"])
    assert r.exit_code == 0, r.output
    assert "Adam's moments in bf16" in r.output
    r = CliRunner().invoke(cli, [*base[:-2], "--framework", "torchtitan", "--zero-stage", "3",
                                 "--optimizer-moments", "bf16"])
    assert isinstance(r.exception, UsageError) and r.exception.exit_code == 2      # `tuner` prints it in one line
    assert "precision-aware optimizer" in str(r.exception) and "\n" not in str(r.exception)


WL = ["--model", "llama3-8b", "--cluster", "h100", "--nodes", "1", "--framework", "megatron-core"]


def test_best_answers_only_with_trials_of_the_same_optimizer_moments(tmp_path, monkeypatch):
    import json
    monkeypatch.setenv("TUNER_DB", f"sqlite:///{tmp_path / 'om.db'}")
    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(cli, ["search", *WL, "--optimizer-moments", "bf16", "--study", "om", "--budget", "5"])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(cli, ["best", *WL, "--format", "json"])                 # fp32 moments: nothing stored
    assert r.exit_code == 0, r.output
    assert '"study": "om"' not in r.stdout and '"status": "predicted"' in r.stdout
    r = CliRunner().invoke(cli, ["best", *WL, "--optimizer-moments", "fp32", "--format", "json"])
    assert r.exit_code == 0 and '"study": "om"' not in r.stdout and '"status": "predicted"' in r.stdout
    r = CliRunner().invoke(cli, ["best", *WL, "--optimizer-moments", "bf16", "--format", "json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["study"] == "om"


def test_the_library_takes_them_as_the_commands_do(tmp_path):
    import tuner
    kw = dict(model="llama3-8b", nodes=1, cluster="h100", framework="megatron-core")
    fp32 = tuner.predict(**kw, tp=1, pp=1, micro_batch=1, zero_stage=1)
    bf16 = tuner.predict(**kw, optimizer_moments="bf16", tp=1, pp=1, micro_batch=1, zero_stage=1)
    assert bf16.workload.optimizer_moments == "bf16" and bf16.prediction.memory_gb < fp32.prediction.memory_gb
    assert "Adam's moments in bf16" in tuner.plan(**kw, optimizer_moments="bf16", top=1).attrs["workload"]
    assert tuner.best(**kw, optimizer_moments="bf16", storage=f"sqlite:///{tmp_path / 'none.db'}").layouts
    with pytest.raises(UsageError, match="optimizer_moments"):                       # the workload's names, listed
        tuner.predict(**kw, optimizer_momentz="bf16", tp=1, pp=1, micro_batch=1)


def test_p_fit_says_its_memory_error_was_measured_with_fp32_moments_only():
    from tuner.frameworks import of
    assert "fp32-moment runs, none bf16" in of(bf16 := _w(optimizer_moments="bf16")).memory_note(bf16)
    assert "fp32-moment" not in of(fp32 := _w()).memory_note(fp32)
    r = CliRunner().invoke(cli, ["plan", *WL, "--optimizer-moments", "bf16", "--top", "1"])
    assert r.exit_code == 0, r.output
    assert f"measured on {of(bf16).memory_n} fp32-moment runs, none bf16" in r.output


def test_scale_takes_them_too_and_leaves_out_the_stacks_without_them():
    import tuner
    kw = dict(model="llama3-8b", cluster="h100", nodes="1", tokens=1e10, jobs=1)
    r = tuner.scale(**kw, framework="megatron-core", optimizer_moments="bf16")
    assert [row["framework"] for row in r.rows] == ["megatron-core"] and r.rows[0]["status"] == "ok"
    r = tuner.scale(**kw, framework="all", optimizer_moments="bf16")
    assert {row["framework"] for row in r.rows} == {"megatron-core"}
    assert any("torchtitan left out: Adam's moments in bf16" in n for n in r.notes)
    with pytest.raises(UsageError, match="torchtitan keeps Adam's moments in fp32"):
        tuner.scale(**kw, framework="torchtitan", optimizer_moments="bf16")
    out = CliRunner().invoke(cli, ["scale", "--model", "llama3-8b", "--cluster", "h100", "--nodes", "1",
                                   "--tokens", "1e10", "--optimizer-moments", "bf16", "--jobs", "1"])
    assert out.exit_code == 0, out.output
