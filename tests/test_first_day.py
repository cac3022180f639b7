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
from tuner.presets import MODEL_ALIASES, read_toml, shipped_presets
from tuner.specs import cluster_framework

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
    for command in ("predict", "plan", "search", "launch", "best"):
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
    from tests.docs_pages import page
    readme = page("concepts.md") + page("frameworks.md")          # once the README's, now the site's pages
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
    first = re.sub(r"-\s+", "-", " ".join(out.split("Options:")[0].split()))     # "micro-" may end a line
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


# ---- 7. the report's heatmap and model-error panel -------------------------------------------
def report_trial(number, runner="local", mfu=0.30, **layout):
    from tuner.layout import Layout
    from tuner.store import TrialRecord
    from tuner.trial import Status
    lay = Layout(**{"tp": 4, "pp": 8, "dp": 4, "micro_batch": 1, **layout})
    return TrialRecord(study="st", number=number, layout=lay, status=Status.OK, mfu=mfu, peak_fraction=mfu * 4 / 3,
                       tflops_per_gpu=191.5 * mfu * 4 / 3, samples_per_second=100 * mfu, peak_memory_gb=40.0,
                       predicted_mfu=0.35, predicted_memory_gb=45.0, runner=runner)


def report_of(trials, monkeypatch):
    """build_report's page and the titles and texts of every figure it drew (read before rendering)."""
    import tuner.report as report
    import tuner.report.plots as plots             # where the figures are drawn since report.py was split
    from tuner.specs import make_workload
    from tuner.store import StudyRecord
    drawn, real_png = [], plots._png

    def png(fig):
        drawn.append(" | ".join([a.get_title() for a in fig.axes] + [t.get_text() for a in fig.axes for t in a.texts]))
        return real_png(fig)
    monkeypatch.setattr(plots, "_png", png)
    rec = StudyRecord(name="st", workload=make_workload("175b", 16).as_dict(), space={}, searcher="random",
                      runner=trials[0].runner, state="done")
    return report.build_report(rec, trials), drawn


HEATMAP_TRIALS = [  # one TP x PP cell (4, 8) whose best differs from the plain layout in sp, cp, vp, recompute
    (1, dict()), (2, dict(sequence_parallel=True, context_parallel=2, virtual_pipeline=2, recompute="selective",
                          dp=2, zero_stage=0, mfu=0.41)), (3, dict(recompute="none", mfu=0.36)),
    (4, dict(tp=8, dp=2, mfu=0.33))]


def test_heatmap_says_what_each_cell_collapses_and_names_the_best_layout_in_full(monkeypatch):
    from tuner.report import COLLAPSED
    trials = [report_trial(n, **kw) for n, kw in HEATMAP_TRIALS]
    rep, drawn = report_of(trials, monkeypatch)
    best = trials[1].layout.key()
    assert best == "tp4-sp1-cp2-pp8-vp2-dp2-mb1-z0-rcselective"
    assert set(COLLAPSED) == {"sp", "cp", "vp", "split", "dp", "ep", "etp", "mb", "zero", "recompute", "offload"}
    (heat,) = [d for d in drawn if "TP x PP" in d]
    assert "ckpt" not in heat and "ckpt" not in rep.html
    assert ", ".join(COLLAPSED) in heat and best in heat
    assert "41.0\nn=3" in heat and "33.0\nn=1" in heat                  # best of the cell, how many it holds
    cells = rep.html[rep.html.index("<h2>MFU by TP x PP</h2>"):]
    assert ", ".join(COLLAPSED) in cells and f"<code>{best}</code>" in cells
    assert f"<td>{best}</td>" in cells and f"<td>{trials[3].layout.key()}</td>" in cells   # each cell's best


def test_a_simulated_study_has_no_measured_vs_predicted_panel(monkeypatch):
    rep, drawn = report_of([report_trial(n, runner="sim", **kw) for n, kw in HEATMAP_TRIALS], monkeypatch)
    assert "model_error.png" not in rep.figures and not any("Measured vs predicted" in d for d in drawn)
    assert "measured vs predicted" not in rep.html and "ran in the simulator" in rep.html
    assert "(trial 2, predicted by the simulator)" in rep.html and "Top ten layouts (simulated" in rep.html
    assert any(d.startswith("Best so far (simulated)") for d in drawn)


def test_measured_vs_predicted_leaves_simulated_trials_out(monkeypatch):
    trials = [report_trial(1, runner="sim"), report_trial(2, mfu=0.40), report_trial(3, mfu=0.30, tp=8, dp=2)]
    rep, drawn = report_of(trials, monkeypatch)
    (err,) = [d for d in drawn if "Measured vs predicted" in d]
    assert "n=2 " in err                                                  # the two measured trials only
    assert "model_error.png" in rep.figures and "1 simulated trial(s) are left out" in rep.html
    assert "(trial 2, measured)" in rep.html and "Top ten layouts</h2>" in rep.html


# ---- 8. docs/report.png: referenced, and made by a script that runs the README's example ----------
def test_readme_report_picture_exists_and_its_script_runs_the_readme_example():
    from tests.docs_pages import page
    readme = page("commands/report.md")                             # the page beside docs/report.png
    (png,) = ["docs/" + p for p in re.findall(r"!\[[^\]]*\]\(\.\./(report\.png)\)", readme)]
    assert (ROOT / png).read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    assert "bash docs/report-png.sh" in readme
    script = " ".join((ROOT / "docs/report-png.sh").read_text().replace("\\\n", " ").split())
    example = re.search(r"tuner search --model 175b --nodes 64 [^\n#]*--study frontier-175b-64n", readme).group(0)
    assert " ".join(example.split()) in script and "tuner report frontier-175b-64n" in script


def test_a_missing_required_layout_option_is_named_not_a_traceback(tuner):
    """click >= 8.3 reads an explicit default=None as given: required options must not pass one."""
    code, _, err = tuner("predict", "--model", "175b", "--nodes", "16", "--tp", "4")
    assert code == 2 and "Missing option '--pp'" in err and "internal error" not in err
    code, _, err = tuner("predict", "--model", "175b", "--nodes", "16", "--tp", "4", "--pp", "8")
    assert code == 2 and "Missing option '--micro-batch'" in err
