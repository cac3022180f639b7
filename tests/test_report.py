"""Reports, exports and launch files: the pure functions, then the CLI on a real simulator study."""

from __future__ import annotations

import base64
import dataclasses
import json
import os
import re
import shutil
import subprocess
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner

from conftest import service_unavailable
from tuner.cli import cli
from tuner.errors import InvalidLayout, UsageError
from tuner.launch import Source
from tuner.layout import Layout
from tuner.render.launch import LAUNCH_FILES, batch_arithmetic, launch_files
from tuner.report import (EXPORT_COLUMNS, FIGURES, best_so_far, build_report, export_rows, model_error, pairs,
                          status_counts, top_rows, tp_pp_grid)
from tuner.specs import make_workload
from tuner.store import StudyRecord, TrialRecord
from tuner.trial import Status

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
T0 = datetime(2025, 1, 1, tzinfo=timezone.utc)


def trial(number, status="ok", tp=4, pp=8, dp=4, mb=1, frac=None, mem=None, **kw) -> TrialRecord:
    """A trial whose speed (MFU) is `frac`; Megatron's count, with recompute, is 4/3 of it."""
    ok = status == "ok"
    frac = (0.3 + 0.01 * number) if frac is None and ok else frac
    mem = (40.0 + number) if mem is None and ok else mem
    mgt = None if frac is None else frac * 4 / 3
    return TrialRecord(study="st", number=number, layout=Layout(tp=tp, pp=pp, dp=dp, micro_batch=mb),
                       status=Status(status), mfu=frac, peak_fraction=mgt, tflops_per_gpu=None if mgt is None else 191.5 * mgt,
                       peak_memory_gb=mem, samples_per_second=None if frac is None else 100 * frac,
                       predicted_mfu=0.35, predicted_peak_fraction=0.35 * 4 / 3,
                       predicted_tflops_per_gpu=191.5 * 0.35 * 4 / 3, predicted_memory_gb=45.0,
                       predicted_step_time_s=10.0, runner="sim", started=T0 + timedelta(seconds=number),
                       ended=T0 + timedelta(seconds=number + 1), **kw)


def study_record(name="st") -> StudyRecord:
    w = make_workload("175b", 16)
    return StudyRecord(name=name, workload=w.as_dict(), space={}, searcher="random", runner="sim", state="done")


MIXED = [trial(1, "pruned"), trial(2, frac=0.40), trial(3, "oom", mem=None), trial(4, tp=8, pp=4, frac=0.50),
         trial(5, frac=0.45, mb=2), trial(6, "timeout"), trial(7, "failed", message="boom <b>")]


# ------------------------------------------------------------------------------------------- pure

def test_status_counts_in_status_order_without_zeros():
    assert status_counts(MIXED) == {"ok": 3, "oom": 1, "timeout": 1, "failed": 1, "pruned": 1}
    assert status_counts([]) == {}


def test_best_so_far_skips_pruned_and_never_decreases():
    xs, ys, ok_x, ok_y = best_so_far(MIXED)
    assert ok_x == [2, 4, 5] and ok_y == [0.40, 0.50, 0.45]
    assert xs == [2, 3, 4, 5, 6, 7]                 # from the first success; pruned trial 1 never launched
    assert ys == [0.40, 0.40, 0.50, 0.50, 0.50, 0.50]


def test_tp_pp_grid_takes_the_best_over_the_other_dimensions():
    tps, pps, grid = tp_pp_grid(MIXED)
    assert tps == [4, 8] and pps == [4, 8]
    assert grid == [[None, 0.50], [0.45, None]]    # (tp4, pp8): best of 0.40 (mb 1) and 0.45 (mb 2)


def test_model_error_pairs_and_relative_error():
    pred, meas = pairs(MIXED, "mfu", "predicted_mfu")
    assert len(pred) == 3 and all(p == pytest.approx(0.35) for p in pred) and sorted(meas) == [0.40, 0.45, 0.50]
    err = model_error([110.0, 90.0], [100.0, 100.0])
    assert err == {"n": 2, "mape": pytest.approx(0.10), "bias": pytest.approx(0.0)}
    assert model_error([], []) is None


def test_a_measured_peak_is_set_against_the_prediction_with_the_clusters_reserve(monkeypatch):
    """A runner's peak is the bytes its tensors allocated (max_memory_allocated); the prediction holds the cluster's
    fixed reserve too, so the report's memory error adds it first (tuner.perfmodel.fit.measured_need_gb): a run at
    exactly the predicted allocated bytes shows no error, not reserve / peak too much."""
    import tuner.report.page as page
    from tuner.report import memory_pairs
    at_prediction = [trial(1, mem=45.0 - 3.0), trial(2, mem=45.0 - 3.0)]      # predicted_memory_gb 45 with 3 GB reserve
    pred, need = memory_pairs(at_prediction, 3.0)
    assert pred == [45.0, 45.0] and need == [45.0, 45.0]
    assert model_error(pred, need)["mape"] == 0.0
    assert model_error(*pairs(at_prediction, "peak_memory_gb", "predicted_memory_gb"))["bias"] > 0.07   # unlike
    seen = []
    monkeypatch.setattr(page, "figures", lambda trials, cap, reserve: seen.append((cap, reserve))
                        or dict.fromkeys(FIGURES))
    study = study_record()
    build_report(study, MIXED)
    assert seen == [(study.workload["cluster"]["memory_gb"], study.workload["cluster"]["memory_reserved_gb"])]


def test_top_rows_best_first_and_export_rows_complete():
    rows = top_rows(MIXED, 2, 3.0)
    assert [r["trial"] for r in rows] == [4, 5] and rows[0]["mfu_%"] == pytest.approx(50.0)
    best = next(t for t in MIXED if t.number == 4)
    assert rows[0]["mem_gb"] == pytest.approx(best.peak_memory_gb + 3.0)   # allocated + reserve, as plan states it
    assert rows[0]["mgt_peak_%"] == pytest.approx(50.0 * 4 / 3) and rows[0]["samples_s"] == pytest.approx(50.0)
    ex = export_rows(MIXED)
    assert [r["trial"] for r in ex] == list(range(1, 8))
    assert all(list(r) == EXPORT_COLUMNS for r in ex)
    assert ex[1]["duration_s"] == 1.0 and ex[1]["started"].startswith("2025-01-01T00:00:02")


def _images(page: str) -> list[bytes]:
    return [base64.b64decode(m) for m in re.findall(r"src='data:image/png;base64,([A-Za-z0-9+/=]+)'", page)]


def test_report_embeds_every_figure_as_a_png():
    rep = build_report(study_record(), [dataclasses.replace(t, runner="local") for t in MIXED])   # measured
    imgs = _images(rep.html)
    assert len(imgs) == len(FIGURES) == len(rep.figures)
    assert all(img.startswith(PNG_MAGIC) for img in imgs)
    assert "tp8-pp4-dp4-mb1-z1-rcfull" in rep.html and "Top ten layouts" in rep.html
    assert "<b>" not in rep.html.replace("<b>Best layout</b>", "")     # messages and names are escaped
    assert set(rep.files()) == {"index.html", *FIGURES}


def test_report_without_finished_trials_says_so_instead_of_plotting():
    rep = build_report(study_record(), [trial(1, "running")])
    assert "no finished trials yet" in rep.html and "<img" not in rep.html and rep.figures == {}
    assert "no finished trials yet" in build_report(study_record(), []).html


def test_report_with_only_failures_draws_only_the_status_counts():
    rep = build_report(study_record(), [trial(1, "oom"), trial(2, "timeout"), trial(3, "pruned")])
    assert "None of the 3 finished trial(s) succeeded" in rep.html
    assert list(rep.figures) == ["status_counts.png"] and len(_images(rep.html)) == 1


# ----------------------------------------------------------------------------------------- launch

def _args(text: str) -> dict:
    lines = text.splitlines()
    return {a: (lines[i + 1] if i + 1 < len(lines) and not lines[i + 1].startswith("--") else True)
            for i, a in enumerate(lines) if a.startswith("--")}


@pytest.mark.parametrize("lay", [Layout(tp=4, pp=16, dp=2, micro_batch=2), Layout(tp=8, pp=1, dp=16, micro_batch=1,
                                                                                    zero_stage=3)])
def test_launch_files_agree_on_the_batch(lay, tmp_path):
    w = make_workload("175b", 16)
    files = launch_files(lay, w, tmp_path, **LAUNCH_DATA)
    ds = json.loads(files["ds_config.json"])
    accum = ds["gradient_accumulation_steps"]
    assert ds["train_batch_size"] == ds["train_micro_batch_size_per_gpu"] * accum * lay.dp == w.global_batch
    assert ds["zero_optimization"]["stage"] == lay.zero_stage
    args = _args(files["megatron_args.txt"])
    assert int(args["--micro-batch-size"]) == lay.micro_batch and int(args["--global-batch-size"]) == w.global_batch
    assert int(args["--tensor-model-parallel-size"]) == lay.tp and int(args["--pipeline-model-parallel-size"]) == lay.pp
    assert args["--deepspeed_config"] == "ds_config.json"
    sb = files["launch.sbatch"]
    assert f"#SBATCH --nodes={w.nodes}" in sb and str(tmp_path) not in sb      # runs where it is submitted
    assert "--deepspeed_config ds_config.json" in sb                # the config shipped beside it
    assert "--micro-batch-size " + str(lay.micro_batch) in sb
    summary = json.loads(files["layout.json"])
    assert summary["gradient_accumulation_steps"] == accum and summary["source"]["kind"] == "model"
    assert batch_arithmetic(lay, w)["gradient_accumulation_steps"] == accum


GOLDEN = Path(__file__).parent / "golden"
LAUNCH_DATA = {"data_path": "/lustre/orion/abc123/data/pile_text_document", "tokenizer": "gpt2"}


@pytest.mark.parametrize("name", LAUNCH_FILES)
def test_launch_files_match_golden(name):
    """The four files for the study's 175B layout on 16 Frontier nodes (regenerate: TUNER_UPDATE_GOLDEN=1)."""
    files = launch_files(Layout(tp=4, pp=16, dp=2, micro_batch=1), make_workload("175b", 16),
                         "/lustre/orion/abc123/launch", account="abc123", time_limit="02:00:00", train_iters=5000,
                         **LAUNCH_DATA)
    path = GOLDEN / "launch_175b_16n" / name
    if os.environ.get("TUNER_UPDATE_GOLDEN"):
        path.parent.mkdir(exist_ok=True)
        path.write_text(files[name])
    assert files[name] == path.read_text(), f"{name} differs from {path} (TUNER_UPDATE_GOLDEN=1 to accept)"


def test_launch_files_refuse_an_invalid_layout_and_name_the_rule(tmp_path):
    w = make_workload("175b", 16)
    with pytest.raises(InvalidLayout, match="tp\\*pp\\*dp"):
        launch_files(Layout(tp=4, pp=16, dp=4, micro_batch=1), w, tmp_path, **LAUNCH_DATA)
    with pytest.raises(UsageError, match="unknown slurm key|precision"):
        launch_files(Layout(tp=4, pp=16, dp=2, micro_batch=1), w, tmp_path, precision="fp8", **LAUNCH_DATA)


def test_source_describes_where_the_layout_came_from():
    assert "performance model" in Source("model").describe()
    assert "predicted by the sim runner" in Source("study", "s", 3, "sim", 100.0, 0.5).describe()
    assert Source("store", "s", 3, "slurm").measured and "measured" in Source("store", "s", 3, "slurm").describe()


# -------------------------------------------------------------------------------------------- CLI

@pytest.fixture(scope="module")
def db(tmp_path_factory):
    """A SQLite store with one short simulator study `s1`, made through the CLI."""
    d = tmp_path_factory.mktemp("store")
    url = f"sqlite:///{d}/x.db"
    r = CliRunner().invoke(cli, ["search", "--model", "175b", "--nodes", "16", "--budget", "10", "--db", url,
                                 "--study", "s1", "--searcher", "random"], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    return url


def run(*args, ok=True):
    r = CliRunner().invoke(cli, [str(a) for a in args])
    if ok:
        assert r.exit_code == 0 and r.exception is None, (r.output, r.exception)
    return r


def test_report_cli_writes_the_page_and_refuses_a_non_empty_out(db, tmp_path):
    out = tmp_path / "rep"
    r = run("report", "s1", "--out", out, "--db", db)
    assert "wrote" in r.output and "3 figure(s)" in r.output     # a simulator study: no model-error plot
    page = (out / "index.html").read_text()
    drawn = [f for f in FIGURES if f != "model_error.png"]
    assert len(_images(page)) == 3 and all((out / f).read_bytes().startswith(PNG_MAGIC) for f in drawn)
    r = run("report", "s1", "--out", out, "--db", db, ok=False)
    assert isinstance(r.exception, UsageError) and "--force" in str(r.exception)
    run("report", "s1", "--out", out, "--db", db, "--force")
    r = run("report", "nope", "--out", tmp_path / "x", "--db", db, ok=False)
    assert "no study named 'nope'" in str(r.exception)


def test_report_cli_on_a_study_without_finished_trials(db, tmp_path):
    from tuner.store import open_store
    store = open_store(db)
    if "empty" not in store.study_names():
        store.create_study(study_record("empty"))
    out = tmp_path / "rep"
    run("report", "s1", "--out", out, "--db", db)
    r = run("report", "empty", "--out", out, "--db", db, "--force")
    assert "no finished trials" in r.output and "0 figure(s)" in r.output
    assert "no finished trials yet" in (out / "index.html").read_text()
    assert sorted(p.name for p in out.iterdir()) == ["index.html"]     # no figures, none left from before


@pytest.mark.parametrize("command", ["report", "export", "launch"])
def test_help_has_an_example(command):
    r = run(command, "--help")
    assert "Example: tuner " + command in r.output and "--db" in r.output


@pytest.mark.parametrize("fmt", ["csv", "json", "parquet"])
def test_export_reads_back_with_pandas(db, tmp_path, fmt):
    if fmt == "parquet":
        pytest.importorskip("pyarrow", reason="parquet export needs the 'report' extra (pyarrow)")
    out = tmp_path / f"t.{fmt}"
    run("export", "s1", "--format", fmt, "--out", out, "--db", db)
    df = {"csv": pd.read_csv, "json": pd.read_json, "parquet": pd.read_parquet}[fmt](out)
    assert list(df.columns) == EXPORT_COLUMNS and len(df) >= 10
    ok = df[df.status == "ok"]
    from tuner.store import open_store
    stored_ok = sum(str(t.status) == "ok" for t in open_store(db).trials("s1"))   # the model's simulator decides how many
    assert len(ok) == stored_ok >= 5 and len(df) >= stored_ok + 1      # the pruned and out-of-memory trials come too
    assert ok.mfu.notna().all() and ok.peak_fraction.notna().all() and ok.predicted_mfu.notna().all()
    assert (df.tp * df.pp * df.dp == 128).all()
    r = run("export", "s1", "--format", fmt, "--out", out, "--db", db, ok=False)
    assert isinstance(r.exception, UsageError) and "--force" in str(r.exception)


def test_export_to_stdout_and_parquet_needs_out(db):
    r = run("export", "s1", "--format", "json", "--db", db)
    assert len(json.loads(r.stdout)) >= 10
    r = run("export", "s1", "--format", "parquet", "--db", db, ok=False)
    assert isinstance(r.exception, UsageError) and "--out" in str(r.exception)


def test_launch_from_the_study_the_store_and_the_model(db, tmp_path):
    best = json.loads(run("best", "--model", "175b", "--nodes", "16", "--db", db, "--format", "json").stdout)
    for name, args, kind in (("study", ["s1"], "study"), ("store", ["--model", "175b", "--nodes", "16"], "store"),
                             ("model", ["--model", "175b", "--nodes", "32"], "model")):
        out = tmp_path / name
        r = run("launch", *args, "--out", out, "--db", db, "--train-iters", 250, "--data-path", "/data/pile_text_document",
                "--tokenizer", "gpt2")
        summary = json.loads((out / "layout.json").read_text())
        assert summary["source"]["kind"] == kind and summary["source"]["description"] in r.output
        lay = summary["layout"]        # frontier's framework, Megatron-DeepSpeed, runs every layout it is given
        assert lay["virtual_pipeline"] == 1 and lay["context_parallel"] == 1
        ds = json.loads((out / "ds_config.json").read_text())
        assert ds["train_batch_size"] == lay["micro_batch"] * ds["gradient_accumulation_steps"] * lay["dp"]
        assert ds["train_batch_size"] == summary["global_batch"]
        assert (out / "launch.sbatch").read_text().startswith("#!/bin/bash")
        assert summary["train_iters"] == 250 and "--train-iters\n250\n" in (out / "megatron_args.txt").read_text()
        if kind != "model":
            assert lay == best["layout"]
    r = run("launch", "s1", "--out", tmp_path / "study", "--db", db, "--train-iters", 250, "--mock-data", ok=False)
    assert isinstance(r.exception, UsageError) and "--force" in str(r.exception)
    r = run("launch", "--out", tmp_path / "none", "--db", db, "--train-iters", 250, ok=False)
    assert isinstance(r.exception, UsageError) and "study NAME, or --model and --nodes" in str(r.exception)


# --------------------------------------------------------------------------------------- chromium

CHECK_IMAGES = ("<script>window.addEventListener('load', () => { const imgs = [...document.images]; "
                "document.body.setAttribute('data-images', imgs.length + ':' + "
                "imgs.filter(i => i.complete && i.naturalWidth > 0).length); });</script></body>")


def chromium(*args, cwd) -> subprocess.CompletedProcess:
    exe = shutil.which("chromium")
    cmd = [exe, "--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={cwd}/profile",
           "--virtual-time-budget=10000", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=cwd)


def test_report_renders_in_headless_chromium(db, tmp_path):
    if shutil.which("chromium") is None:          # under CI (TUNER_CI=1): a failure, not a skip
        service_unavailable("chromium", "Debian's chromium is not installed (apt-get install chromium); the test "
                            "installs nothing")
    out = tmp_path / "rep"
    run("report", "s1", "--out", out, "--db", db)
    page = (out / "index.html").read_text()
    probe = tmp_path / "probe.html"                   # the same page with a script that counts loaded images
    probe.write_text(page.replace("</body>", CHECK_IMAGES))
    dom = chromium("--dump-dom", probe.as_uri(), cwd=tmp_path)
    found = re.search(r'data-images="(\d+):(\d+)"', dom.stdout)
    assert found, (dom.stdout[:500], dom.stderr[-2000:])
    assert found.group(1) == found.group(2) == "3"    # every <img> decoded with naturalWidth > 0
    shot = tmp_path / "shot.png"
    chromium("--hide-scrollbars", "--window-size=1200,2400", f"--screenshot={shot}", (out / "index.html").as_uri(),
             cwd=tmp_path)
    import matplotlib.image as mpimg
    px = mpimg.imread(shot)[..., :3]
    assert px.shape[0] == 2400 and px.shape[1] == 1200
    assert (px.min(axis=2) < 0.5).mean() > 0.01       # not blank: text and plots put dark pixels on it
