"""A new user's first day (issue 19): what --help says, the preset lists, the top-level description."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

import click
import pytest

from tuner.cli import cli
from tuner.frameworks import FRAMEWORKS, NAMES
from tuner.layout import DIMENSIONS, SEARCHED
from tuner.specs import MODEL_ALIASES, cluster_framework, read_toml, shipped_presets

ROOT = Path(__file__).resolve().parents[1]


def option_help(command: str, dest: str) -> str:
    """The help line `tuner COMMAND --help` prints for the option whose parameter is `dest`, one line."""
    cmd = cli.commands[command]
    ctx = click.Context(cmd, info_name=command, parent=click.Context(cli, info_name="tuner"))
    (param,) = [p for p in cmd.params if p.name == dest]
    return " ".join(param.get_help_record(ctx)[1].split())


# ---- 1. defaults in --help say what happens --------------------------------------------------
@pytest.mark.parametrize("command", ["plan", "search"])
def test_pinnable_dimensions_say_they_are_searched_when_omitted(command):
    for name in SEARCHED:
        text = option_help(command, name)
        assert "[default:" not in text, f"{command} --{name}: {text}"
        assert "searched over the --space when omitted" in text, f"{command} --{name}: {text}"


def predict_json(tuner, *args) -> dict:
    code, out, err = tuner("predict", *args, "--format", "json")
    assert code == 0, err
    return json.loads(out)["layout"]


def test_predict_help_states_the_defaults_predict_uses(tuner):
    """Each `[default: V]` of predict's help is the value predict fills in (megatron-core on h100)."""
    lay = predict_json(tuner, "--model", "llama3-8b", "--cluster", "h100", "--nodes", "1", "--tp", "2", "--pp", "1",
                       "--micro-batch", "1")
    for d in DIMENSIONS:
        shown = re.search(r"\[default: ([^\]]+)\]", option_help("predict", d.name))
        if d.name in ("zero_stage", "sequence_parallel"):
            continue                                       # per framework: the next test
        if shown:
            assert str(lay[d.name]).lower() == shown.group(1), (d.name, shown.group(1), lay)
    assert option_help("predict", "recompute").endswith("[default: full]")


@pytest.mark.parametrize("framework", NAMES)
def test_predict_help_names_each_frameworks_zero_stage_and_sp(tuner, framework):
    fw = FRAMEWORKS[framework]
    zero = option_help("predict", "zero_stage")
    assert f"{framework} {fw.zero_stages[0]}" in zero
    assert "[default: 1]" not in zero                      # torchtitan's is 3
    lay = predict_json(tuner, "--model", "llama3-8b", "--cluster", "h100", "--nodes", "1", "--tp", "2", "--pp",
                       "1", "--micro-batch", "1", "--framework", framework)
    assert lay["zero_stage"] == fw.zero_stages[0]
    sp = option_help("predict", "sequence_parallel")
    assert lay["sequence_parallel"] is fw.sp_with_tp
    assert (f"for {framework}" in sp) is fw.sp_with_tp, sp


# ---- 2. preset lists come from the shipped presets -------------------------------------------
def test_model_and_cluster_help_list_every_shipped_preset():
    models, clusters = shipped_presets("models"), shipped_presets("clusters")
    assert len(models) >= 18 and len(clusters) >= 8
    alias = {v: k for k, v in MODEL_ALIASES.items()}
    for command, prefix in (("predict", ""), ("plan", ""), ("search", ""), ("launch", "")):
        m, c = option_help(command, "model"), option_help(command, "cluster")
        for name in models:
            assert re.search(rf"[ (]{re.escape(name)}[,) ]", m), (command, name, m)
            if name in alias:
                assert f"{name} ({alias[name]})" in m
        for name in clusters:
            assert re.search(rf"[ (]{re.escape(name)}[,) ]", c), (command, name, c)


def shipped_cluster_frameworks() -> dict[str, str]:
    return {n: cluster_framework(read_toml(t)) for n, t in shipped_presets("clusters").items()}


def test_framework_help_names_every_clusters_default_framework():
    text = option_help("search", "framework")
    said = dict(re.findall(r"([\w-]+) on ([\w, -]+?)[;)]", text))
    assert set(said) <= set(NAMES)
    per_cluster = {c.strip(): fw for fw, cs in said.items() for c in cs.split(",")}
    assert per_cluster == shipped_cluster_frameworks(), text


def test_readme_lists_every_shipped_preset_and_the_clusters_frameworks():
    readme = (ROOT / "README.md").read_text()
    para = readme[readme.index("Models and clusters are TOML files"):]
    para = para[:para.index("A name is")]
    for kind in ("models", "clusters"):
        for name in shipped_presets(kind):
            assert f"`{name}`" in para, f"README's preset list lacks {kind[:-1]} {name}"
    sentence = " ".join(readme[readme.index("(default: the cluster's `framework`"):].split("A study stores")[0].split())
    said = dict(re.findall(r"([\w-]+) on ((?:`[\w-]+`(?: \([^)]*\))?,? ?)+)", sentence))
    per_cluster = {c: fw for fw, cs in said.items() for c in re.findall(r"`([\w-]+)`", cs)}
    assert per_cluster == shipped_cluster_frameworks(), sentence


# ---- 3. the top-level description is today's -------------------------------------------------
def test_top_level_help_names_todays_dimensions(tuner):
    code, out, _ = tuner("--help")
    assert code == 0
    first = " ".join(out.split("Options:")[0].split())
    assert "checkpointing" not in first
    for label in ("TP", "SP", "CP", "PP", "VP", "DP", "micro-batch", "ZeRO", "recompute", "bf16", "fp8", *NAMES):
        assert label in first, (label, first)
    assert first.count(",") >= len(DIMENSIONS) - 1


def test_pyproject_description_names_todays_dimensions():
    desc = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["description"]
    for label in ("TP", "SP", "CP", "PP", "VP", "DP", "micro-batch", "ZeRO", "recompute", "precision"):
        assert label in desc, label


# ---- 6. studies shows precision and global batch ---------------------------------------------
def test_studies_shows_precision_and_global_batch(tuner):
    for args in (("--model", "tiny", "--cluster", "local", "--study", "plain"),
                 ("--model", "llama3-8b", "--cluster", "h100", "--precision", "fp8", "--global-batch", "256",
                  "--study", "fp8-run")):
        code, _, err = tuner("search", *args, "--nodes", "1", "--budget", "2")
        assert code == 0, err
    code, out, _ = tuner("studies", "--format", "json")
    rows = {r["study"]: r for r in json.loads(out)}
    assert (rows["plain"]["precision"], rows["plain"]["global_batch"]) == ("bf16", 16)      # tiny's recipe
    assert (rows["fp8-run"]["precision"], rows["fp8-run"]["global_batch"]) == ("fp8", 256)
    code, out, _ = tuner("studies", "--format", "csv")
    head, *lines = out.strip().splitlines()
    cols = head.split(",")
    fp8 = dict(zip(cols, next(line for line in lines if line.startswith("fp8-run")).split(",")))
    assert (fp8["precision"], fp8["global_batch"], fp8["framework"]) == ("fp8", "256", "megatron-core")
    code, out, _ = tuner("studies")
    header, _, *table = out.strip().splitlines()
    assert "global_batch" in header.split() and "precision" in header.split()
    assert any(line.split()[0] == "fp8-run" and "fp8" in line.split() and "256" in line.split() for line in table)
