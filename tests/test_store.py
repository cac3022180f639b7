"""The store contract: one test class run against SQLite file, SQLite memory and PostgreSQL.

PostgreSQL runs when TUNER_TEST_PG_URL is set (`.ci/start-postgres.sh` prints it); it is reset before
every test, so point it at a database used only for tests.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from sqlalchemy import MetaData, create_engine, text

from tuner.errors import StoreError, StudyExists, UnknownStudy
from tuner.layout import Layout
from tuner.perfmodel.prediction import Prediction
from tuner.specs import make_workload
from tuner.store import StudyRecord, open_store, redact
from tuner.store.store import upgrade
from tuner.trial import Status, TrialResult

REPO = Path(__file__).resolve().parents[1]
LAYOUTS = [Layout(tp=tp, pp=pp, dp=dp, micro_batch=mb)
           for tp in (1, 2, 4, 8) for pp in (1, 2, 4) for dp in (1, 2) for mb in (1, 2)]   # 48 distinct


def study(name: str, model: str = "175b", nodes: int = 128, **kw) -> StudyRecord:
    w = make_workload(model, nodes).as_dict()
    return StudyRecord(name=name, workload=w, space={"tp": [1, 2, 4, 8]}, searcher="random", runner="sim", **kw)


def ok(mfu: float, **kw) -> TrialResult:
    """A success whose speed is `mfu`; Megatron's count is set apart (recompute makes it larger)."""
    kw = {"peak_fraction": mfu * 4 / 3, **kw}
    return TrialResult(Status.OK, tflops_per_gpu=kw["peak_fraction"] * 191.5, mfu=mfu, samples_per_second=mfu * 100,
                       peak_memory_gb=50.0, **kw)


def _reset_pg(url: str) -> None:
    """Drop every table (the store's and its tuner_alembic_version)."""
    engine = create_engine(url.replace("postgresql://", "postgresql+psycopg://", 1))
    with engine.begin() as conn:
        found = MetaData()
        found.reflect(conn)
        found.drop_all(conn)
    engine.dispose()


@pytest.fixture(params=["sqlite-file", "sqlite-memory", pytest.param("postgres", marks=pytest.mark.postgres)])
def url(request, tmp_path) -> str:
    if request.param == "sqlite-file":
        return f"sqlite:///{tmp_path}/tuner.db"
    if request.param == "sqlite-memory":
        return "sqlite://"
    pg = request.getfixturevalue("pg_url")
    _reset_pg(pg)
    return pg


@pytest.fixture
def store(url):
    s = open_store(url)
    yield s
    s.close()


@pytest.fixture
def shared_url(url) -> str:
    """The URL again, for tests that open it twice or from other processes (not a memory store)."""
    if url == "sqlite://":
        pytest.skip("a SQLite memory store lives in one Store of one process")
    return url


class TestStoreContract:
    # ---- studies ----------------------------------------------------------------------------
    def test_create_get_list(self, store):
        store.create_study(study("b", settings={"seed": 3, "budget": 50}))
        store.create_study(study("a", nodes=64))
        rec = store.get_study("b")
        assert (rec.model, rec.cluster, rec.nodes, rec.global_batch) == ("gpt-175b", "frontier", 128, 640)
        assert rec.settings == {"seed": 3, "budget": 50} and rec.state == "running" and rec.searcher == "random"
        assert rec.space == {"tp": [1, 2, 4, 8]} and rec.created.tzinfo is not None
        assert store.study_names() == ["a", "b"]
        assert [s.name for s in store.list_studies()] == ["b", "a"]

    def test_exists_and_unknown(self, store):
        store.create_study(study("s1"))
        with pytest.raises(StudyExists, match="tuner resume s1"):
            store.create_study(study("s1"))
        with pytest.raises(UnknownStudy, match="known studies: s1"):
            store.get_study("nope")
        with pytest.raises(UnknownStudy):
            store.claim_trial("nope", LAYOUTS[0], None, "sim")
        with pytest.raises(UnknownStudy):
            store.trials("nope")

    def test_state_and_settings_merge(self, store):
        store.create_study(study("s", settings={"seed": 1, "budget": 10}))
        store.set_study_state("s", "interrupted")
        store.update_study_settings("s", {"budget": 20, "command": "tuner search --db postgresql://u:pw@h/d"})
        rec = store.get_study("s")
        assert rec.state == "interrupted"
        assert rec.settings == {"seed": 1, "budget": 20, "command": "tuner search --db postgresql://u:***@h/d"}
        with pytest.raises(ValueError):
            store.set_study_state("s", "weird")

    # ---- claims -----------------------------------------------------------------------------
    def test_claim_is_unique_and_numbered(self, store):
        store.create_study(study("s"))
        store.create_study(study("t"))
        assert store.claim_trial("s", LAYOUTS[0], None, "sim") == 1
        assert store.claim_trial("s", LAYOUTS[0], None, "sim") is None
        assert store.claim_trial("s", LAYOUTS[1], None, "sim") == 2
        assert store.claim_trial("t", LAYOUTS[0], None, "sim") == 1     # numbering is per study
        store.finish_trial("s", 1, ok(0.4))
        assert store.claim_trial("s", LAYOUTS[0], None, "sim") is None  # finished: never again
        assert [(t.number, t.status) for t in store.trials("s")] == [(1, Status.OK), (2, Status.RUNNING)]

    def test_claim_stores_prediction(self, store):
        store.create_study(study("s"))
        p = Prediction(layout=LAYOUTS[3], tflops_per_gpu=90.0, peak_fraction=0.47, mfu=0.4, step_time_s=12.5,
                       samples_per_second=100.0, memory_gb=55.5, fits=True)
        n = store.claim_trial("s", LAYOUTS[3], p, "local")
        t = store.trials("s")[0]
        assert (t.number, t.layout, t.runner, t.status, t.attempts) == (n, LAYOUTS[3], "local", Status.RUNNING, 1)
        assert (t.predicted_tflops_per_gpu, t.predicted_peak_fraction, t.predicted_memory_gb,
                t.predicted_step_time_s) == (90.0, 0.47, 55.5, 12.5)
        assert t.started is not None and t.ended is None and t.tflops_per_gpu is None

    def test_reclaim_interrupted(self, store):
        store.create_study(study("s"))
        a, b, c = LAYOUTS[:3]
        assert [store.claim_trial("s", x, None, "sim") for x in (a, b, c)] == [1, 2, 3]
        store.finish_trial("s", 3, ok(0.3))
        assert store.mark_interrupted("s", [1]) == 1
        assert store.mark_interrupted("s") == 1          # trial 2; trial 3 is finished
        assert store.mark_interrupted("s", []) == 0
        assert store.counts("s") == {"interrupted": 2, "ok": 1}
        assert store.claim_trial("s", b, None, "sim2") == 2
        assert store.claim_trial("s", b, None, "sim2") is None     # running again: taken
        t = store.trials("s", [Status.RUNNING])[0]
        assert (t.number, t.attempts, t.runner, t.ended) == (2, 2, "sim2", None)
        assert store.claim_trial("s", LAYOUTS[4], None, "sim") == 4

    def test_claim_from_four_threads(self, store):
        store.create_study(study("s"))
        got, errors = [], []

        def work(seed: int) -> None:
            order = LAYOUTS[:]
            random.Random(seed).shuffle(order)
            try:
                for layout in order:
                    n = store.claim_trial("s", layout, None, f"t{seed}")
                    if n is not None:
                        got.append((layout.key(), n))
                        store.finish_trial("s", n, ok(random.Random(n).random()))
            except Exception as exc:   # surfaced by the assert below
                errors.append(exc)

        threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        assert errors == []
        assert sorted(k for k, _ in got) == sorted(x.key() for x in LAYOUTS)
        assert sorted(n for _, n in got) == list(range(1, len(LAYOUTS) + 1))
        assert store.counts("s") == {"ok": len(LAYOUTS)}

    def test_claim_from_two_processes(self, store, shared_url):
        store.create_study(study("s"))
        env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
        procs = [subprocess.Popen([sys.executable, "-c", CLAIMER, shared_url, str(seed)], env=env,
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for seed in (1, 2)]
        assert [p.stdout.readline().strip() for p in procs] == ["ready", "ready"]   # both opened the store
        for p in procs:
            p.stdin.write("go\n")
            p.stdin.flush()
        outs = [p.communicate(timeout=120) for p in procs]
        assert all(p.returncode == 0 for p in procs), [e for _, e in outs]
        claims = [pair for out, _ in outs for pair in json.loads(out)]
        assert all(json.loads(out) for out, _ in outs), "both processes should win some layouts"
        assert sorted(k for k, _ in claims) == sorted(x.key() for x in LAYOUTS)
        assert sorted(n for _, n in claims) == list(range(1, len(LAYOUTS) + 1))
        assert store.counts("s") == {"ok": len(LAYOUTS)}

    # ---- finishing --------------------------------------------------------------------------
    def test_finish(self, store):
        store.create_study(study("s"))
        n = store.claim_trial("s", LAYOUTS[0], None, "sim")
        store.finish_trial("s", n, TrialResult(Status.OOM, message="CUDA OOM talking to postgresql://a:hunter2@db/x",
                                               log_path="results/s/1.log", peak_memory_gb=64.0), extra={"node": "n1"})
        store.finish_trial("s", n, TrialResult(Status.OOM, message="again", peak_memory_gb=64.0), extra={"x": 1})
        t = store.trials("s")[0]
        assert (t.status, t.peak_memory_gb, t.tflops_per_gpu, t.message) == (Status.OOM, 64.0, None, "again")
        assert t.extra == {"node": "n1", "x": 1} and t.ended >= t.started
        store.finish_trial("s", n, TrialResult(Status.FAILED, message="see postgresql://a:hunter2@db/x"))
        assert "hunter2" not in store.trials("s")[0].message
        with pytest.raises(StoreError, match="trial 99"):
            store.finish_trial("s", 99, ok(0.1))

    def test_record_trial(self, store):
        store.create_study(study("s"))
        pruned = TrialResult(Status.PRUNED, message="needs 90 GB > 64 GB")
        assert store.record_trial("s", LAYOUTS[0], None, pruned, "sim") == 1
        assert store.record_trial("s", LAYOUTS[0], None, pruned, "sim") is None
        t = store.trials("s")[0]
        assert (t.status, t.message, t.ended is not None) == (Status.PRUNED, "needs 90 GB > 64 GB", True)
        assert store.trials("s", [Status.OK]) == []

    # ---- queries ----------------------------------------------------------------------------
    def test_best_across_studies(self, store):
        for name, model, nodes in (("a", "175b", 128), ("b", "175b", 128), ("c", "175b", 64), ("d", "22b", 128)):
            store.create_study(study(name, model, nodes))
        busy = ok(0.30, peak_fraction=0.98)      # recompute-heavy: Megatron's count is high, it trains slowly
        for name, results in {"a": [ok(0.40), ok(0.52), TrialResult(Status.OOM, mfu=0.99), busy],
                              "b": [ok(0.45), ok(0.50), TrialResult(Status.OK)],
                              "c": [ok(0.90)], "d": [ok(0.95)]}.items():
            for layout, result in zip(LAYOUTS, results):
                store.record_trial(name, layout, None, result, "sim")
        best = store.best("gpt-175b", "frontier", 128, k=3)
        assert [(t.study, t.number, t.mfu) for t in best] == [("a", 2, 0.52), ("b", 2, 0.50), ("b", 1, 0.45)]
        assert (best[0].model, best[0].cluster, best[0].nodes, best[0].runner) == ("gpt-175b", "frontier", 128, "sim")
        assert best[0].layout == LAYOUTS[1] and best[0].samples_per_second == pytest.approx(52.0)
        assert [t.mfu for t in store.best("gpt-175b", "frontier", 128)] == [0.52]
        assert store.best("gpt-175b", "frontier", 128, global_batch=7) == []       # speeds at another batch
        assert [t.number for t in store.best("gpt-175b", "frontier", 128, k=5, study="b")] == [2, 1]
        assert [t.study for t in store.best("gpt-175b", "frontier", 64, k=5)] == ["c"]
        assert store.best("gpt-175b", "elsewhere", 128) == [] and store.best("gpt-175b", "frontier", 128, k=0) == []

    def test_counts(self, store):
        store.create_study(study("s"))
        assert store.counts("s") == {}
        for layout, st in zip(LAYOUTS, (Status.OK, Status.OK, Status.OOM, Status.PRUNED)):
            store.record_trial("s", layout, None, TrialResult(st), "sim")
        store.claim_trial("s", LAYOUTS[10], None, "sim")
        assert store.counts("s") == {"ok": 2, "oom": 1, "pruned": 1, "running": 1}

    def test_url_is_redacted(self, store):
        assert "tuner:tuner@" not in store.url and (store.url.startswith("sqlite") or ":***@" in store.url)


CLAIMER = """
import json, random, sys, time
from tuner.store import open_store
from tuner.trial import Status, TrialResult
from tests.test_store import LAYOUTS
store = open_store(sys.argv[1])
order = LAYOUTS[:]
random.Random(int(sys.argv[2])).shuffle(order)
won = []
print("ready", flush=True)
sys.stdin.readline()
for layout in order:
    n = store.claim_trial("s", layout, None, "proc" + sys.argv[2])
    if n is not None:
        won.append((layout.key(), n))
        # a race needs both claimers in it: after its first win each waits until the other has claimed one too
        # (it will: 47 layouts are free), so that a busy machine running one claimer late never lets the
        # other take all 48 alone
        while len(won) == 1 and sum(store.counts("s").values()) < 2:
            time.sleep(0.001)
        time.sleep(0.002)   # the trial runs
        store.finish_trial("s", n, TrialResult(Status.OK, peak_fraction=0.5))
store.close()
print(json.dumps(won))
"""


# ---- URLs and errors (independent of the backend) ------------------------------------------
def test_redact():
    assert redact("postgresql+psycopg://tuner:s3cret@db:5432/tuner") == "postgresql+psycopg://tuner:***@db:5432/tuner"
    assert redact("postgresql://db/tuner?user=u&password=s3cret") == "postgresql://db/tuner?user=u&password=***"
    assert redact("sqlite:///results/tuner.db") == "sqlite:///results/tuner.db"


@pytest.mark.parametrize("bad, expect", [
    ("not a url", "malformed database URL 'not a url'"),
    ("mysql://u:s3cret@h/db", "unsupported database URL 'mysql://u:***@h/db'"),
    ("postgresql+psycopg://tuner:s3cret@127.0.0.1:1/tuner", "results store at postgresql+psycopg://tuner:***@127.0.0.1:1/tuner"),
])
def test_bad_url_is_one_line_with_fix(bad, expect):
    with pytest.raises(StoreError) as err:
        open_store(bad)
    msg = str(err.value)
    assert expect in msg and "check --db or TUNER_DB" in msg and "s3cret" not in msg and "\n" not in msg


def test_missing_directory(tmp_path):
    with pytest.raises(StoreError, match=r"directory .*nope does not exist; create it"):
        open_store(f"sqlite:///{tmp_path}/nope/tuner.db")
    assert not (tmp_path / "nope").exists()


def test_read_only_sqlite(tmp_path):
    open_store(f"sqlite:///{tmp_path}/t.db").close()
    if os.geteuid() != 0:   # permissions bind only non-root users
        (tmp_path / "t.db").chmod(0o444)
        with pytest.raises(StoreError, match="read-only"):
            open_store(f"sqlite:///{tmp_path}/t.db")
    with pytest.raises(StoreError, match="read-only"):
        open_store(f"sqlite:///file:{tmp_path}/t.db?mode=ro&uri=true")


def test_default_url_and_env(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("TUNER_DB", raising=False)
    with open_store() as s:
        assert s.url == f"sqlite:///{tmp_path}/results/tuner.db"      # shown absolute: no guessing the cwd
    assert (tmp_path / "results" / "tuner.db").is_file()
    monkeypatch.setenv("TUNER_DB", f"sqlite:///{tmp_path}/other.db")
    with open_store() as s:
        assert s.url.endswith("other.db")
    assert "created" in upgrade(f"sqlite:///{tmp_path}/fresh.db")


@pytest.mark.postgres
def test_postgres_survives_lost_connections(pg_url):
    _reset_pg(pg_url)
    with open_store(pg_url) as store:
        store.create_study(study("s"))
        killer = create_engine(pg_url.replace("postgresql://", "postgresql+psycopg://", 1))
        with killer.connect() as conn:   # kill every other session of this role: the store's pooled one
            killed = conn.execute(text("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                                       "WHERE usename = current_user AND pid <> pg_backend_pid()")).scalar()
        killer.dispose()
        assert killed >= 1
        assert store.claim_trial("s", LAYOUTS[0], None, "sim") == 1
        assert store.counts("s") == {"running": 1}
