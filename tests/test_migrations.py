"""The store's Alembic history (tuner/store/migrations/): the revisions build exactly the models, old
stores (with or without a revision) upgrade with their data migrated, no DROP COLUMN reaches SQLite,
and versions this tuner does not know are refused. SQLite, and PostgreSQL when TUNER_TEST_PG_URL is set.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory

from tuner import metrics
from tuner.errors import NoStore, StoreError
from tuner.layout import Layout
from tuner.space import SearchSpace
from tuner.specs import make_workload
from tuner.store import SCHEMA_VERSION, StudyRecord, current, open_store, upgrade
from tuner.store import migrations
from tuner.store.engine import _engine_for
from tuner.store.models import Base, StudyRow
from tuner.trial import Status, TrialResult

REPO = Path(__file__).resolve().parents[1]
VT = migrations.VERSION_TABLE


def _wipe(url: str) -> None:
    engine = _engine_for(url)[0]
    with engine.begin() as conn:
        found = sa.MetaData()
        found.reflect(conn)
        found.drop_all(conn)
    engine.dispose()


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def url(request, tmp_path) -> str:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path}/tuner.db"
        return
    pg = request.getfixturevalue("pg_url")
    _wipe(pg)
    yield pg
    _wipe(pg)


def run_sql(url: str, fn):
    """fn(connection) in one transaction on tuner's own engine for `url` (its pragmas, its BEGIN)."""
    engine = _engine_for(url)[0]
    try:
        with engine.begin() as conn:
            return fn(conn)
    finally:
        engine.dispose()


def old_store(url: str, version: int, alembic: bool = False) -> None:
    """A store at schema `version` as an older tuner left it: built by the revisions up to it, then (unless
    `alembic`) without its revision, as tuners before Alembic wrote it: meta.schema_version only."""
    def build(conn):
        migrations.migrate(conn, migrations.revision_of(version))
        if not alembic:
            conn.execute(sa.text(f"DROP TABLE {VT}"))
    run_sql(url, build)


def add_study(conn, name: str, model: str, nodes: int) -> int:
    rec = StudyRecord(name=name, workload=make_workload(model, nodes).as_dict(), space={}, searcher="random",
                      runner="sim")
    row = rec.to_row()
    studies = sa.Table("studies", sa.MetaData(), autoload_with=conn)
    values = {c.name: getattr(row, c.name) for c in StudyRow.__table__.columns if c.name != "id"}
    return conn.execute(studies.insert().values(**values).returning(studies.c.id)).scalar_one()


def add_trial(conn, study_id: int, number: int, key: str, **columns) -> None:
    trials = sa.Table("trials", sa.MetaData(), autoload_with=conn)
    conn.execute(trials.insert().values(study_id=study_id, number=number, layout_key=key, tp=1, pp=8, dp=8,
                                        micro_batch=1, zero_stage=1, status="ok", message="", runner="sim",
                                        attempts=1, extra={}, **columns))


def stored_revision(url: str) -> list[str]:
    return run_sql(url, lambda c: list(c.execute(sa.text(f"SELECT version_num FROM {VT}")).scalars()))


def schema_differences(url: str) -> list:
    """What autogenerate would change to make the store at `url` match the models (nothing, if equal)."""
    def compare(conn):
        ctx = MigrationContext.configure(conn, opts={"version_table": VT, "compare_type": True,
                                                     "compare_server_default": True})
        return compare_metadata(ctx, Base.metadata)
    return run_sql(url, compare)


# ---- the history itself ----------------------------------------------------------------------
def test_revisions_are_one_numbered_line_ending_at_schema_version():
    scripts = ScriptDirectory(str(migrations.HERE))
    assert scripts.get_heads() == [migrations.HEAD] == [f"{SCHEMA_VERSION:04d}"], "one head, = SCHEMA_VERSION"
    chain = [s for s in reversed(list(scripts.walk_revisions()))]
    assert [s.revision for s in chain] == [f"{v:04d}" for v in range(1, SCHEMA_VERSION + 1)]
    assert [s.down_revision for s in chain] == [None, *(s.revision for s in chain[:-1])]
    for s in chain:
        assert Path(s.path).name.startswith(s.revision + "_")
        tree = ast.parse(Path(s.path).read_text())
        sql = [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
               and n.value != ast.get_docstring(tree, clean=False)]
        assert not [q for q in sql if "DROP COLUMN" in q.upper()], "drop columns through op.batch_alter_table"


def test_every_revision_from_empty_builds_exactly_the_models(url):
    run_sql(url, migrations.migrate)
    assert schema_differences(url) == []
    assert stored_revision(url) == [migrations.HEAD]
    assert run_sql(url, lambda c: c.execute(sa.text("SELECT value FROM meta WHERE key = 'schema_version'"))
                   .scalar()) == str(SCHEMA_VERSION)


def test_a_fresh_store_is_the_models_stamped_at_the_head(url):
    open_store(url).close()
    assert schema_differences(url) == []
    assert stored_revision(url) == [migrations.HEAD]
    assert current(url).endswith(f"schema version {SCHEMA_VERSION}, revision {migrations.HEAD}; up to date")


# ---- data migrations -------------------------------------------------------------------------
def test_upgrade_from_schema_1_recomputes_mfu_from_samples_per_second(url):
    """A store written before MFU existed: upgrade adds it from each trial's samples/s and model; a
    predicted step time gives predicted_mfu; the speed index replaces the peak_fraction one."""
    old_store(url, 1)
    lay = Layout(tp=1, pp=8, dp=8, micro_batch=1)
    def fill(conn):
        sid = add_study(conn, "old", "22b", 8)
        add_trial(conn, sid, 1, lay.key().replace("-rcfull", "-ac1"), activation_checkpointing=True,
                  tflops_per_gpu=80.0, peak_fraction=0.42, samples_per_second=12.5, predicted_step_time_s=40.0)
    run_sql(url, fill)
    with pytest.raises(StoreError, match=r"schema version 1, this tuner needs \d+: run `tuner db upgrade --db "):
        open_store(url)
    said = upgrade(url)
    assert f"from schema version 1 to {SCHEMA_VERSION} (revision 0001 -> {migrations.HEAD})" in said
    assert "written before tuner used Alembic: stamped at revision 0001 first" in said
    with open_store(url) as again:
        t = again.best("gpt-22b", "frontier", 8)[0]
    w = make_workload("22b", 8)
    assert t.mfu == pytest.approx(metrics.mfu(12.5, w)) and t.peak_fraction == 0.42
    assert t.predicted_mfu == pytest.approx(metrics.mfu(w.global_batch / 40.0, w)) and t.layout == lay
    indexes = run_sql(url, lambda c: {i["name"] for i in sa.inspect(c).get_indexes("trials")})
    assert "ix_trials_speed" in indexes and "ix_trials_best" not in indexes
    assert schema_differences(url) == []


def test_upgrade_from_schema_2_reads_activation_checkpointing_as_recompute(url):
    """A store written when a layout had activation_checkpointing (true/false): upgrade gives every trial
    recompute full/none, sp off, cp 1, vp 1 and the new layout key; a study's stored space with the old
    dimension still loads."""
    old_store(url, 2)
    on, off = Layout(tp=1, pp=8, dp=8, micro_batch=1), Layout(tp=1, pp=8, dp=8, micro_batch=1, recompute="none")
    def fill(conn):
        sid = add_study(conn, "old2", "22b", 8)
        for n, (lay, ac) in enumerate(((on, True), (off, False)), 1):
            add_trial(conn, sid, n, lay.key().replace("-rcfull", "-ac1").replace("-rcnone", "-ac0"),
                      activation_checkpointing=ac, samples_per_second=10.0, mfu=0.3)
    run_sql(url, fill)
    assert f"from schema version 2 to {SCHEMA_VERSION}" in upgrade(url)
    with open_store(url) as again:
        got = {t.layout: t for t in again.trials("old2")}
        assert again.claim_trial("old2", on, None, "sim") is None       # the rewritten key is the same layout
    assert set(got) == {on, off} and {t.mfu for t in got.values()} == {0.3}
    assert {(t.layout.sequence_parallel, t.layout.context_parallel, t.layout.virtual_pipeline)
            for t in got.values()} == {(False, 1, 1)}
    assert "activation_checkpointing" not in run_sql(url, lambda c: {x["name"] for x in
                                                                     sa.inspect(c).get_columns("trials")})
    assert schema_differences(url) == []
    assert SearchSpace.from_record({"name": "old", "dimensions": {"activation_checkpointing": [True, False]}}) \
        .dimensions["recompute"] == ["full", "none"]      # a stored study's old space still loads


def test_no_drop_column_reaches_sqlite(tmp_path):
    """Dropping activation_checkpointing recreates the table on SQLite (any version, not only >= 3.35):
    every statement of the upgrade is recorded and none is a DROP COLUMN; the data comes across."""
    url = f"sqlite:///{tmp_path}/old.db"
    old_store(url, 2)
    run_sql(url, lambda c: add_trial(c, add_study(c, "s", "22b", 8), 1, "tp1-pp8-dp8-mb1-z1-ac0",
                                     activation_checkpointing=False, samples_per_second=3.0, mfu=0.25))
    seen: list[str] = []
    record = lambda conn, cursor, statement, *rest: seen.append(statement)   # noqa: E731
    sa.event.listen(sa.Engine, "before_cursor_execute", record)
    try:
        upgrade(url)
    finally:
        sa.event.remove(sa.Engine, "before_cursor_execute", record)
    assert any("_alembic_tmp_trials" in s for s in seen), "the batch recreate ran"
    assert not [s for s in seen if "DROP COLUMN" in s.upper()]
    with open_store(url) as again:
        (t,) = again.trials("s")
    assert (t.layout.recompute, t.layout.key(), t.mfu, t.samples_per_second) == (
        "none", "tp1-pp8-dp8-mb1-z1-rcnone", 0.25, 3.0)


# ---- versions: older, newer, pre-Alembic, foreign ----------------------------------------------
def test_older_revision_names_the_upgrade_and_newer_names_upgrading_tuner(url):
    old_store(url, SCHEMA_VERSION - 1, alembic=True)
    with pytest.raises(StoreError, match=r"run `tuner db upgrade --db .*`") as err:
        open_store(url)
    assert "\n" not in str(err.value)
    assert "older than this tuner's" in current(url)
    assert f"(revision {migrations.revision_of(SCHEMA_VERSION - 1)} -> {migrations.HEAD})" in upgrade(url)
    assert "is up to date" in upgrade(url)
    open_store(url).close()
    run_sql(url, lambda c: c.execute(sa.text(f"UPDATE {VT} SET version_num = '0099'")))
    for act in (open_store, upgrade):
        with pytest.raises(StoreError, match=r"schema version 99, newer than this tuner understands .*"
                                             r"upgrade tuner \(`pip install -U tuner`\)"):
            act(url)
    assert "newer than this tuner understands" in current(url)


def test_a_pre_alembic_store_is_recognised(url):
    """meta.schema_version only: today's version is stamped on open; a newer one is refused."""
    old_store(url, SCHEMA_VERSION)
    assert "written before tuner used Alembic" in current(url)
    with open_store(url) as store:
        store.create_study(StudyRecord(name="s", workload=make_workload("22b", 8).as_dict(), space={},
                                       searcher="random", runner="sim"))
    assert stored_revision(url) == [migrations.HEAD]
    def newer(conn):
        conn.execute(sa.text(f"DROP TABLE {VT}"))
        conn.execute(sa.text("UPDATE meta SET value = :v WHERE key = 'schema_version'"), {"v": SCHEMA_VERSION + 1})
    run_sql(url, newer)
    with pytest.raises(StoreError, match=f"schema version {SCHEMA_VERSION + 1}, newer .* upgrade tuner"):
        open_store(url)


def test_an_optuna_storage_is_not_a_tuner_store(tmp_path):
    optuna = pytest.importorskip("optuna")
    url = f"sqlite:///{tmp_path}/optuna.db"
    optuna.create_study(storage=url, study_name="x")
    for act in (open_store, upgrade, current):
        with pytest.raises(StoreError, match="holds an optuna storage .*: not a tuner results store; use another"):
            act(url)
    optuna.load_study(study_name="x", storage=url)      # untouched


def test_current_never_creates_a_store(tmp_path):
    with pytest.raises(NoStore):
        current(f"sqlite:///{tmp_path}/none.db")
    assert not (tmp_path / "none.db").exists()


# ---- concurrency -----------------------------------------------------------------------------
OPENER = """
import sys
from tuner.store import open_store
print("ready", flush=True)
sys.stdin.readline()
with open_store(sys.argv[1]) as s:
    print(len(s.study_names()))
"""


def test_many_processes_open_a_new_store_at_once(url):
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    procs = [subprocess.Popen([sys.executable, "-c", OPENER, url], env=env, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(4)]
    assert [p.stdout.readline().strip() for p in procs] == ["ready"] * 4
    for p in procs:
        p.stdin.write("go\n")
        p.stdin.flush()
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0] * 4, [err for _, err in outs]
    assert [out.strip() for out, _ in outs] == ["0"] * 4
    assert stored_revision(url) == [migrations.HEAD]


def test_opening_waits_out_another_writer_of_a_file_not_yet_in_wal_mode(tmp_path):
    # SQLite answers a journal-mode change while another connection holds the write lock of a file
    # still in rollback mode with 'database is locked' at once, skipping its busy handler: the race
    # four drivers opening one new store hit on a busy machine. Opening must wait, as every write does.
    import sqlite3
    import threading
    path = tmp_path / "tuner.db"
    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    holder.execute("CREATE TABLE other (i INTEGER)")
    holder.execute("BEGIN IMMEDIATE")
    threading.Timer(0.5, holder.execute, ("COMMIT",)).start()
    with open_store(f"sqlite:///{path}") as store:
        assert store.study_names() == []
    holder.close()
    assert stored_revision(f"sqlite:///{path}") == [migrations.HEAD]


# ---- the CLI -----------------------------------------------------------------------------------
def test_db_commands(tuner, tmp_path):
    old = f"sqlite:///{tmp_path}/old.db"
    old_store(old, 1)
    code, out, _ = tuner("db", "current", "--db", old)
    assert code == 0 and "schema version 1" in out and "run `tuner db upgrade --db " in out
    code, out, _ = tuner("db", "upgrade", "--db", old)
    assert code == 0 and f"from schema version 1 to {SCHEMA_VERSION}" in out
    code, out, _ = tuner("db", "current", "--db", old)
    assert code == 0 and out.strip().endswith("up to date")
    code, _, err = tuner("db", "current", "--db", f"sqlite:///{tmp_path}/missing.db")
    assert code == 2 and "no results store at" in err
    run_sql(old, lambda c: c.execute(sa.text(f"UPDATE {VT} SET version_num = '0099'")))
    code, _, err = tuner("db", "upgrade", "--db", old)
    assert code == 1 and "upgrade tuner" in err and "Traceback" not in err
