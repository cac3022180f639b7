"""The store's schema history: Alembic revisions, run on the store's own connection and transaction
(no alembic.ini; users run `tuner db upgrade`, `tuner db current`).

versions/NNNN_slug.py is revision "NNNN", schema version NNNN: 0001 baseline (2023's six layout
fields), 0002 mfu, 0003 sp/cp/vp/recompute. The store records its revision in `tuner_alembic_version`
(not `alembic_version`: optuna's storage has that one) and still writes `meta.schema_version` (the
number) so that tuners older than Alembic refuse a newer store. A store written before Alembic has only
`meta.schema_version` 1, 2 or 3: it is stamped at that revision, then upgraded. A fresh store is
create_all + stamp head (tests/test_migrations.py proves that equals running every revision).

Adding a revision (e.g. a new layout dimension, which adds a column to `trials`):
 1. change the model (a `Dimension` in tuner/layout.py, or tuner/store/models.py);
 2. add versions/0004_<slug>.py: copy the newest file, set `revision = "0004"`, `down_revision = "0003"`,
    and write upgrade() with `op.*`: a new NOT NULL column with a `server_default` for existing rows
    (then drop the default, as 0003 does: the models have none); drop or alter columns only inside
    `with op.batch_alter_table("trials") as batch:` (SQLite recreates the table, PostgreSQL alters it:
    never a hand-written DROP COLUMN); data through `sa.table()`/`sa.column()`, never the live models;
 3. bump SCHEMA_VERSION in tuner/store/models.py to 4;
 4. run tests/test_migrations.py (SQLite; PostgreSQL too with TUNER_TEST_PG_URL): it checks that the
    head is SCHEMA_VERSION, that the revisions build exactly the models, and upgrades old stores.
Two branches that each add a revision after 0003: the one merged second renumbers its file to 0005 with
down_revision "0004" (the test refuses two heads). Revisions only go up: tuner never downgrades.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from sqlalchemy import inspect, text

from tuner.errors import NoStore, StoreError
from tuner.store.models import SCHEMA_VERSION, Base

VERSION_TABLE = "tuner_alembic_version"
HERE = Path(__file__).resolve().parent


def revision_of(version: int) -> str:
    return f"{version:04d}"


HEAD = revision_of(SCHEMA_VERSION)


def version_of(revision: str) -> str:
    """A revision as the schema version users see ("0002" is 2); any other revision as it is."""
    return str(int(revision)) if revision.isdigit() else revision


@dataclass(frozen=True)
class State:
    """What a database holds: a tuner store at `revision`, or nothing of tuner's, or something else."""
    revision: str | None = None
    legacy: bool = False          # only meta.schema_version: written before tuner used Alembic
    foreign: str | None = None    # why its tables are not a tuner store

    @property
    def empty(self) -> bool:
        return self.revision is None and self.foreign is None


def read_state(conn) -> State:
    names = set(inspect(conn).get_table_names())
    if VERSION_TABLE in names:
        revs = sorted(conn.execute(text(f"SELECT version_num FROM {VERSION_TABLE}")).scalars())
        if revs:
            return State("+".join(revs))      # several heads: never one of ours, so "newer"
    if "meta" in names:
        value = conn.execute(text("SELECT value FROM meta WHERE key = 'schema_version'")).scalar()
        if value is not None:
            return State(revision_of(int(value)) if value.isdigit() else value, legacy=True)
    if names & {"studies", "trials"}:
        what = ("an optuna storage (it has alembic_version, studies, trials)" if "alembic_version" in names
                else "tables studies/trials without a tuner schema version")
        return State(foreign=f"{what}: not a tuner results store; use another --db (a database of its own)")
    return State()


@lru_cache(maxsize=1)
def revisions() -> frozenset[str]:
    """Every revision this tuner knows (imports Alembic: only when a store is not at the head)."""
    return frozenset(s.revision for s in _scripts().walk_revisions())


@lru_cache(maxsize=1)
def _scripts():
    from alembic.script import ScriptDirectory
    return ScriptDirectory(str(HERE))


def _at(revision: str) -> str:
    return f"schema version {version_of(revision)}, revision {revision}"


def _foreign(state: State, shown: str) -> StoreError:
    return StoreError(f"the database at {shown} holds {state.foreign}")


def newer_error(shown: str, revision: str) -> StoreError:
    return StoreError(f"the results store at {shown} has schema version {version_of(revision)}, newer than this "
                      f"tuner understands ({SCHEMA_VERSION}): upgrade tuner (`pip install -U tuner`)")


def require_head(state: State, shown: str) -> None:
    """Refuse a store that is not at this tuner's revision (a fresh one is created by the caller)."""
    if state.foreign:
        raise _foreign(state, shown)
    if state.revision == HEAD:
        return
    if state.revision not in revisions():
        raise newer_error(shown, state.revision)
    raise StoreError(f"the results store at {shown} has schema version {version_of(state.revision)}, this tuner "
                     f"needs {SCHEMA_VERSION}: run `tuner db upgrade --db {shown}`")


def _write_meta(conn, revision: str) -> None:
    value = version_of(revision)
    if not conn.execute(text("UPDATE meta SET value = :v WHERE key = 'schema_version'"), {"v": value}).rowcount:
        conn.execute(text("INSERT INTO meta (key, value) VALUES ('schema_version', :v)"), {"v": value})


def stamp(conn, revision: str) -> None:
    """Record `revision` without running anything (the schema is already that revision's)."""
    from alembic.runtime.migration import MigrationContext
    MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE}).stamp(_scripts(), revision)
    _write_meta(conn, revision)


def create(conn) -> None:
    """A fresh store: today's tables from the models, stamped at the head."""
    Base.metadata.create_all(conn)
    stamp(conn, HEAD)


def migrate(conn, target: str = "head") -> None:
    """Run the revisions from the store's (stamped) one up to `target`, in the caller's transaction."""
    from alembic import command
    from alembic.config import Config

    cfg = Config(attributes={"connection": conn})
    cfg.set_main_option("script_location", str(HERE).replace("%", "%%"))
    command.upgrade(cfg, target)
    _write_meta(conn, HEAD if target == "head" else target)


def verify_schema(conn) -> None:
    insp = inspect(conn)
    for table in Base.metadata.sorted_tables:
        have = {c["name"] for c in insp.get_columns(table.name)}
        missing = sorted({c.name for c in table.columns} - have)
        if missing:
            raise StoreError(f"table {table.name} lacks column(s) {', '.join(missing)}: "
                             "this is not a tuner results store, or it was edited by hand; use another --db")


def upgrade(conn, shown: str) -> str:
    """Bring the store to the head (creating it if empty); say what was done."""
    state = read_state(conn)
    if state.empty:
        create(conn)
        return f"created the results store at {shown} ({_at(HEAD)})"
    if state.foreign:
        raise _foreign(state, shown)
    if state.revision not in revisions():
        raise newer_error(shown, state.revision)
    note = ""
    if state.legacy:
        stamp(conn, state.revision)
        note = f"; it was written before tuner used Alembic: stamped at revision {state.revision} first"
    if state.revision == HEAD:
        verify_schema(conn)
        return f"results store at {shown} is up to date ({_at(HEAD)}){note}"
    migrate(conn)
    verify_schema(conn)
    return (f"upgraded the results store at {shown} from schema version {version_of(state.revision)} to "
            f"{SCHEMA_VERSION} (revision {state.revision} -> {HEAD}){note}")


def current(conn, shown: str) -> str:
    """The store's schema version and revision, and whether this tuner can use it as it is."""
    state = read_state(conn)
    if state.empty:
        raise NoStore(shown)
    if state.foreign:
        raise _foreign(state, shown)
    rev = state.revision
    legacy = (" (written before tuner used Alembic: `tuner db upgrade` stamps it)" if state.legacy else "")
    if rev == HEAD:
        verdict = "up to date"
    elif rev in revisions():
        verdict = f"older than this tuner's {SCHEMA_VERSION}: run `tuner db upgrade --db {shown}`"
    else:
        verdict = f"newer than this tuner understands ({SCHEMA_VERSION}): upgrade tuner (`pip install -U tuner`)"
    return f"results store at {shown}: {_at(rev)}{legacy}; {verdict}"
