"""`tuner export NAME --format optuna --storage URL`: a real simulator study written as an optuna study,
read back with optuna (trials, best trial, importances, plots) and, where installed, optuna-dashboard."""

from __future__ import annotations

import io
import json
import os
import sqlite3

import optuna
import pytest
from click.testing import CliRunner
from optuna.trial import TrialState

from tuner.cli import cli
from tuner.layout import Layout, SEARCHED
from tuner.optuna_export import state_of
from tuner.report import ok_trials
from tuner.space import SearchSpace
from tuner.specs import Workload, make_workload
from tuner.store import StudyRecord, TrialRecord, open_store
from tuner.trial import Status

STATES = {Status.OK: TrialState.COMPLETE, Status.OOM: TrialState.FAIL, Status.TIMEOUT: TrialState.FAIL,
          Status.FAILED: TrialState.FAIL, Status.PRUNED: TrialState.PRUNED, Status.STOPPED: TrialState.PRUNED}


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    """A SQLite store with one simulator study `s1` made through the CLI, plus one trial still running and
    one interrupted (claimed through the store, as a driver does)."""
    d = tmp_path_factory.mktemp("store")
    url = f"sqlite:///{d}/tuner.db"
    r = CliRunner().invoke(cli, ["search", "--model", "175b", "--nodes", "16", "--budget", "12", "--db", url,
                                 "--study", "s1", "--searcher", "random", "--seed", "3"], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    store = open_store(url)
    rec = store.get_study("s1")
    used = {t.layout for t in store.trials("s1")}
    unused = [lay for lay in SearchSpace.from_record(rec.space).enumerate_layouts(Workload.from_dict(rec.workload))
              if lay not in used][:2]
    numbers = [store.claim_trial("s1", lay, None, "sim") for lay in unused]
    store.mark_interrupted("s1", numbers[1:])
    return url


@pytest.fixture(scope="module")
def exported(db, tmp_path_factory):
    """(optuna study, tuner trials by number, the CLI's stdout, storage URL) after one export to a fresh
    storage. Read only: a test that writes works on a copy of the storage."""
    storage = f"sqlite:///{tmp_path_factory.mktemp('optuna') / 'optuna.db'}"
    r = CliRunner().invoke(cli, ["export", "s1", "--format", "optuna", "--storage", storage, "--db", db])
    assert r.exit_code == 0 and r.exception is None, (r.output, r.exception)
    trials = {t.number: t for t in open_store(db).trials("s1")}
    return optuna.load_study(study_name="s1", storage=storage), trials, r.stdout, storage


def error_lines(err: str) -> list[str]:
    return [ln for ln in err.splitlines() if not ln.startswith("store: ")]


def test_every_finished_trial_is_one_optuna_trial_in_order(exported):
    study, trials, out, storage = exported
    statuses = {str(t.status) for t in trials.values()}
    assert {"ok", "pruned", "running", "interrupted"} <= statuses     # the fixture has them all
    finished = sorted(n for n, t in trials.items() if t.status not in (Status.RUNNING, Status.INTERRUPTED))
    got = study.get_trials(deepcopy=False)
    assert [ot.user_attrs["tuner_trial"] for ot in got] == finished
    for ot in got:
        t = trials[ot.user_attrs["tuner_trial"]]
        assert ot.state == STATES[t.status] and ot.user_attrs["status"] == str(t.status)
        assert ot.params == {d: getattr(t.layout, d) for d in SEARCHED}
        assert ot.user_attrs["layout_key"] == t.layout.key() and ot.user_attrs["dp"] == t.layout.dp
        assert ot.user_attrs["source"] == "simulated" and ot.user_attrs["runner"] == "sim"
        assert ot.datetime_start == t.started.astimezone().replace(tzinfo=None)
        if t.status == Status.OK:
            assert ot.value == t.mfu and ot.user_attrs["samples_per_second"] == t.samples_per_second
            assert ot.user_attrs["tflops_per_gpu"] == t.tflops_per_gpu
            assert ot.user_attrs["predicted_mfu"] == t.predicted_mfu
            assert ot.user_attrs["peak_memory_gb"] == t.peak_memory_gb
        else:
            assert ot.value is None
    counts = {s: sum(ot.state.name.lower() == s for ot in got) for s in ("complete", "fail", "pruned")}
    assert f"{len(got)} trial(s)" in out and "2 running/interrupted left out" in out
    assert all(f"{s} {n}" in out for s, n in counts.items() if n)
    assert out.strip().endswith(f"view it: optuna-dashboard {storage}") and len(out.strip().splitlines()) == 1


def test_the_study_says_what_it_is(exported, db):
    study, _, _, _ = exported
    rec = open_store(db).get_study("s1")
    assert study.direction == optuna.study.StudyDirection.MAXIMIZE and study.metric_names == ["mfu"]
    attrs = study.user_attrs
    assert {k: attrs[k] for k in ("model", "cluster", "nodes", "framework", "precision", "global_batch",
                                  "tuner_study", "tuner_version", "direction")} == {
        "model": rec.model, "cluster": rec.cluster, "nodes": rec.nodes, "framework": rec.workload["framework"],
        "precision": rec.workload["precision"], "global_batch": rec.global_batch, "tuner_study": "s1",
        "tuner_version": rec.tuner_version, "direction": "maximize"}
    assert "MFU" in attrs["objective"]


def test_distributions_cover_the_studys_space(exported, db):
    study, trials, _, _ = exported
    rec = open_store(db).get_study("s1")
    valid = SearchSpace.from_record(rec.space).enumerate_layouts(Workload.from_dict(rec.workload))
    dists = study.get_trials(deepcopy=False)[0].distributions
    assert set(dists) == set(SEARCHED)
    for d in SEARCHED:
        values = sorted({getattr(lay, d) for lay in valid} | {getattr(t.layout, d) for t in trials.values()},
                        key=str)
        dist = dists[d]
        if isinstance(dist, optuna.distributions.IntDistribution):
            assert (dist.low, dist.high) == (min(values), max(values))
            assert dist.log == (d not in ("zero_stage", "offload_layers"))   # degrees and micro-batch: log scale
        else:
            assert sorted(dist.choices, key=str) == values


def test_best_trial_is_tuners_fastest_and_importances_name_the_layout(exported):
    study, trials, _, _ = exported
    fastest = ok_trials(list(trials.values()))[0]
    assert study.best_trial.user_attrs["layout_key"] == fastest.layout.key()
    assert study.best_value == fastest.mfu
    imp = optuna.importance.get_param_importances(study)
    assert set(imp) == set(SEARCHED) and sum(imp.values()) == pytest.approx(1.0)
    # a 2048-token sequence allows no context parallelism: one value in the space, no importance
    assert study.best_trial.distributions["context_parallel"].single() and imp["context_parallel"] == 0.0
    assert max(imp, key=imp.get) in ("tp", "pp", "micro_batch", "zero_stage", "recompute", "sequence_parallel")


@pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")
def test_matplotlib_plots_build(exported):
    import matplotlib
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt
    study, _, _, _ = exported
    ax = optuna.visualization.matplotlib.plot_param_importances(study)
    labels = {t.get_text() for t in ax.get_yticklabels()}
    assert labels and labels <= set(SEARCHED)
    axes = optuna.visualization.matplotlib.plot_slice(study, params=["tp", "pp"])
    assert sorted(a.get_xlabel() for a in axes) == ["pp", "tp"] and {a.get_xscale() for a in axes} == {"log"}
    plt.close("all")


@pytest.mark.parametrize("status", list(STATES))     # running, interrupted: left out (checked above)
def test_each_finished_status_maps_to_one_optuna_state(status):
    t = TrialRecord(study="s", number=1, layout=Layout(tp=1, pp=1, dp=1, micro_batch=1), status=status, mfu=0.3)
    state, value = state_of(t)
    assert state == STATES[status] and (value == 0.3) == (status == Status.OK)
    no_mfu = TrialRecord(study="s", number=1, layout=t.layout, status=status)
    assert state_of(no_mfu)[1] is None and state_of(no_mfu)[0] != TrialState.COMPLETE


def test_an_existing_study_needs_force_and_force_replaces_it(exported, tuner, db, tmp_path):
    study, _, _, first = exported
    n = len(study.trials)
    _copy(first.removeprefix("sqlite:///"), tmp_path / "optuna.db")
    storage = f"sqlite:///{tmp_path / 'optuna.db'}"
    code, out, err = tuner("export", "s1", "--format", "optuna", "--storage", storage, "--db", db)
    lines = error_lines(err)
    assert code == 2 and len(lines) == 1 and "already has an optuna study named 's1'" in lines[0] \
        and "--force" in lines[0]
    code, out, err = tuner("export", "s1", "--format", "optuna", "--storage", storage, "--db", db, "--force")
    assert code == 0, err
    assert optuna.get_all_study_names(storage) == ["s1"]
    assert len(optuna.load_study(study_name="s1", storage=storage).trials) == n


def test_a_study_without_trials_is_an_empty_optuna_study(tuner, tmp_path):
    db = f"sqlite:///{tmp_path / 'tuner.db'}"
    w = make_workload("175b", 16)
    open_store(db).create_study(StudyRecord(name="empty", workload=w.as_dict(), space={}, searcher="random",
                                            runner="sim"))
    storage = f"sqlite:///{tmp_path / 'optuna.db'}"
    code, out, err = tuner("export", "empty", "--format", "optuna", "--storage", storage, "--db", db)
    assert code == 0 and "0 trial(s) (none)" in out, err
    study = optuna.load_study(study_name="empty", storage=storage)
    assert study.trials == [] and study.user_attrs["model"] == w.model.name


@pytest.mark.parametrize("args, words", [
    ([], "pass --storage URL"),
    (["--out", "x.db", "--storage", "sqlite:///o.db"], "drop --out"),
    (["--storage", "optuna.db"], "not a database URL"),
    (["--storage", "sqlite://"], "in memory"),
    (["--storage", "sqlite:///no/such/dir/o.db"], "does not exist"),
])
def test_bad_storage_is_one_line(tuner, db, args, words):
    code, out, err = tuner("export", "s1", "--format", "optuna", *args, "--db", db)
    lines = error_lines(err)
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: ") and words in lines[0], err


def test_storage_is_only_for_optuna(tuner, db):
    code, out, err = tuner("export", "s1", "--format", "csv", "--storage", "sqlite:///o.db", "--db", db)
    lines = error_lines(err)
    assert code == 2 and len(lines) == 1 and "--storage is for --format optuna" in lines[0] and out == ""


def test_tuners_own_store_is_refused_and_left_untouched(tuner, db, tmp_path):
    path = db.removeprefix("sqlite:///")
    before = _tables(path)
    relative = f"sqlite:///{os.path.relpath(path, tmp_path)}"     # the same file, spelled differently
    for storage in (db, relative):
        code, out, err = tuner("export", "s1", "--format", "optuna", "--storage", storage, "--db", db)
        lines = error_lines(err)
        assert code == 2 and len(lines) == 1 and "tuner's own store (--db)" in lines[0], err
    copy = tmp_path / "copy.db"                   # another tuner store: its tables are not optuna's
    _copy(path, copy)
    code, out, err = tuner("export", "s1", "--format", "optuna", "--storage", f"sqlite:///{copy}", "--db", db)
    assert code == 2 and "not optuna's" in error_lines(err)[0]
    assert _tables(path) == before and _tables(str(copy)) == before       # optuna added no table to either


def _copy(src, dst) -> None:
    """A consistent copy of a SQLite database (the tuner store's recent pages may be in its WAL file)."""
    with sqlite3.connect(src) as a, sqlite3.connect(dst) as b:
        a.backup(b)


def _tables(path: str) -> set[str]:
    with sqlite3.connect(path) as conn:
        return {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}


def test_optuna_dashboard_reads_the_export(exported):
    """optuna-dashboard's own server (its WSGI app) lists the study, its trials and importances."""
    dashboard = pytest.importorskip("optuna_dashboard", reason="optional: pip install optuna-dashboard")
    study, trials, _, storage = exported
    app = dashboard.wsgi(storage)

    def get(path: str) -> dict:
        status = []
        env = {"REQUEST_METHOD": "GET", "PATH_INFO": path, "QUERY_STRING": "", "SERVER_NAME": "localhost",
               "SERVER_PORT": "8080", "wsgi.url_scheme": "http", "wsgi.input": io.BytesIO()}
        body = b"".join(app(env, lambda s, headers, exc=None: status.append(s)))
        assert status == ["200 OK"], (path, status, body[:300])
        return json.loads(body)

    summaries = get("/api/studies")["study_summaries"]
    assert [s["study_name"] for s in summaries] == ["s1"] and summaries[0]["directions"] == ["maximize"]
    detail = get(f"/api/studies/{summaries[0]['study_id']}")
    assert len(detail["trials"]) == len(study.trials) and detail["objective_names"] == ["mfu"]
    best = {a["key"]: a["value"] for a in detail["best_trials"][0]["user_attrs"]}
    assert best["layout_key"] == ok_trials(list(trials.values()))[0].layout.key()
    imp = get(f"/api/studies/{summaries[0]['study_id']}/param_importances")["param_importances"][0]
    assert {p["name"] for p in imp} == set(SEARCHED)
