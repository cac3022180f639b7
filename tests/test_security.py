"""Security (issue 8, item 5): no shell unless asked for, study names that cannot escape results/,
database passwords kept out of output, logs and the store, and quoting in sbatch scripts."""

from __future__ import annotations

import dataclasses
import os
import shlex
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from sqlalchemy import create_engine, inspect, text

from conftest import service_unavailable
from tuner.layout import Layout
from tuner.render.sbatch import render_sbatch
from tuner.runners.command import CommandRunner
from tuner.specs import ModelSpec, load_cluster, make_workload
from tuner.store import open_store
from tuner.trial import Status, TrialSpec

PY = sys.executable
TINY = ("--model", "tiny", "--nodes", "1", "--cluster", "local", "--searcher", "grid")
HOSTILE = ("x\"; touch PWNED; echo '$(touch PWNED2)' `touch PWNED3` && rm -rf \"$HOME/nothing\" "
           "\n#SBATCH --wrap=touch PWNED4\n; touch PWNED5 #")




def pwned(root: Path) -> list[Path]:
    return [p for p in root.rglob("PWNED*")]


# ---- commands run as argv lists -----------------------------------------------------------------
def test_command_is_not_run_through_a_shell(tuner, tmp_path):
    code, _, err = tuner("search", *TINY, "--budget", "1", "--runner", "command", "--study", "noshell",
                         "--command", "echo hi; touch PWNED && touch PWNED2 | touch PWNED3 $(touch PWNED4)")
    assert code == 0, err
    assert pwned(tmp_path) == [] and pwned(Path("/tmp")) == []
    with open_store(tuner.db) as s:
        [t] = s.trials("noshell")
    assert t.status == Status.FAILED       # echo wrote no result: the argv ran, literally
    out = (tmp_path / "results/trials/noshell/1/stdout.log").read_text()
    assert out.strip() == "hi; touch PWNED && touch PWNED2 | touch PWNED3 $(touch PWNED4)"


def test_a_shell_only_when_asked_for(tuner, tmp_path):
    code, _, err = tuner("search", *TINY, "--budget", "1", "--runner", "command", "--study", "shell",
                         "--command", "bash -c 'touch ASKED; echo $TUNER_TP'")
    assert code == 0, err
    d = tmp_path / "results/trials/shell/1"
    assert (d / "ASKED").exists() and (d / "stdout.log").read_text().strip().isdigit()


# ---- study names --------------------------------------------------------------------------------
BAD_NAMES = ["../escape", "../../etc/passwd", "/tmp/abs", "a/../../b", "a/b", "..", ".", ".hidden", "-rf",
             "a\x00b", "x" * 300, "semi;colon", "sp ace", "new\nline", "ünïcødé", "$(touch PWNED)", "`id`"]


@pytest.mark.parametrize("name", BAD_NAMES)
def test_study_names_cannot_escape_results(tuner, tmp_path, name):
    code, out, err = tuner("search", "--model", "22b", "--nodes", "2", "--budget", "1", "--runner", "command",
                           "--command", f"{PY} -c pass", "--study", name)
    assert code == 2 and "not allowed" in err and "Traceback" not in err, err
    assert len(err.strip().splitlines()) == 1
    assert not (tmp_path / "results" / "trials").exists() and pwned(tmp_path) == []
    with open_store(tuner.db) as s:
        assert s.study_names() == []


@pytest.mark.parametrize("name", ["../escape", "/tmp/abs", "a/../../b", ".."])
def test_runners_refuse_escaping_study_names_themselves(tmp_path, name):
    """Defence in depth: the command runner refuses a trial directory outside results/trials."""
    w = make_workload("tiny", 1, "local")
    trial = TrialSpec(name, 1, Layout(tp=1, pp=1, dp=2, micro_batch=1), w)
    r = CommandRunner(f"{PY} -c pass", results_dir=tmp_path / "results").run(trial)
    assert r.status == Status.FAILED and "outside" in r.message
    assert not any(p for p in tmp_path.parent.glob("escape*")) and not Path("/tmp/abs").exists()


# ---- passwords ----------------------------------------------------------------------------------
def _grep_tree(root: Path, secret: str) -> list[str]:
    hits = []
    for p in root.rglob("*"):
        if p.is_file() and secret.encode() in p.read_bytes():
            hits.append(str(p))
    return hits


def _grep_store(url: str, secret: str) -> list[str]:
    """Every text (and JSON) value of every table, searched for `secret`."""
    engine = create_engine(url)
    hits = []
    try:
        with engine.connect() as conn:
            for table in inspect(conn).get_table_names():
                for row in conn.execute(text(f'SELECT * FROM "{table}"')):
                    if secret in repr(tuple(row)):
                        hits.append(f"{table}: {row}")
    finally:
        engine.dispose()
    return hits


@pytest.mark.parametrize("url", ["postgresql+psycopg://bob:Hunter2-{s}@127.0.0.1:1/x",
                                 "postgresql://bob:Hunter2-{s}@127.0.0.1:1/x?connect_timeout=1",
                                 "postgresql+psycopg://bob@127.0.0.1:1/x?password=Hunter2-{s}",
                                 "postgresql+psycopg://bob:Hunter2-{s}:with@colon@127.0.0.1:1/x"])
def test_password_not_shown_for_an_unreachable_database(tuner, tmp_path, url):
    secret = f"Hunter2-{uuid.uuid4().hex[:8]}"
    url = url.format(s=secret.split("-", 1)[1])
    for args in (("studies", "--db", url), ("search", *TINY, "--budget", "1", "--db", url, "--study", "p"),
                 ("resume", "p", "--db", url), ("best", "--model", "tiny", "--nodes", "1", "--db", url)):
        code, out, err = tuner(*args)
        assert code != 0 and "Traceback" not in err
        assert secret not in out + err, f"tuner {args[0]} showed the password: {err}"
        assert "127.0.0.1" in err
    assert _grep_tree(tmp_path, secret) == []


@pytest.fixture(scope="module")
def pg_secret_url(pg_server_url):
    """A PostgreSQL role and database with a password found nowhere else (needs root and psql)."""
    if os.geteuid() != 0 or shutil.which("psql") is None:
        service_unavailable("psql", "creating a PostgreSQL role needs root and psql")   # CI: fails
    tag = uuid.uuid4().hex[:8]
    role, db, secret = f"chaos_{tag}", f"chaos_{tag}", f"Pw-{uuid.uuid4().hex}"

    def psql(sql):
        return subprocess.run(["su", "postgres", "-c", f"psql -v ON_ERROR_STOP=1 -q -c {shlex.quote(sql)}"],
                              capture_output=True, text=True, timeout=60)

    r = psql(f"CREATE ROLE {role} LOGIN PASSWORD '{secret}'")
    if r.returncode != 0:
        service_unavailable("PostgreSQL", f"cannot create a PostgreSQL role: {r.stderr.strip()}")
    psql(f"CREATE DATABASE {db} OWNER {role}")
    yield f"postgresql+psycopg://{role}:{secret}@127.0.0.1:5432/{db}", secret
    psql(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")
    psql(f"DROP ROLE IF EXISTS {role}")


@pytest.mark.postgres
def test_password_not_in_output_logs_trials_or_store(tmp_path, pg_secret_url):
    """A real search on PostgreSQL, the URL (with its password) in TUNER_DB: the password appears in
    no output, no trial file (the trial command dumps its whole environment) and no column."""
    url, secret = pg_secret_url
    env = {**os.environ, "TUNER_DB": url}
    runs = [["search", *TINY, "--budget", "2", "--runner", "command", "--study", "pw",
             "--command", f"{PY} -c \"import os; print(dict(os.environ))\""],
            ["search", *TINY, "--budget", "2", "--study", "pw-sim"],
            ["resume", "pw"], ["studies"], ["trials", "pw", "--format", "json"],
            ["best", "--model", "tiny", "--nodes", "1", "--cluster", "local"],
            ["search", *TINY, "--budget", "2", "--study", "pw"]]          # an error that names the store
    for args in runs:
        p = subprocess.run([PY, "-m", "tuner", *args], cwd=tmp_path, env=env, capture_output=True, text=True,
                           timeout=120)
        assert secret not in p.stdout + p.stderr, f"tuner {' '.join(args)} showed the password"
        assert "Traceback" not in p.stderr
    assert (tmp_path / "results/trials/pw/1/stdout.log").exists()
    assert _grep_tree(tmp_path, secret) == [], "the password reached a file under the working directory"
    assert _grep_store(url, secret) == []


def test_trial_commands_do_not_inherit_the_store_url(tuner, tmp_path, monkeypatch):
    """TUNER_DB (it may hold a password) is tuner's own setting: trial commands do not receive it."""
    secret = f"Pw-{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv("TUNER_DB", tuner.db + f"?secret_marker={secret}")   # still a valid SQLite URL
    code, _, err = tuner("search", *TINY, "--budget", "1", "--runner", "command", "--study", "env",
                         "--command", f"{PY} -c \"import os; print(dict(os.environ))\"")
    assert code == 0, err
    out = (tmp_path / "results/trials/env/1/stdout.log").read_text()
    assert "TUNER_TRIAL_DIR" in out and secret not in out


def test_no_variable_holding_the_db_options_password_reaches_a_trial(tuner, tmp_path, monkeypatch):
    """--db's password (not in TUNER_DB here) withholds every variable that contains it, and the
    store's usual variables (PGPASSWORD, PGPASSFILE, DATABASE_URL) are withheld whatever they hold."""
    secret = f"Pw-{uuid.uuid4().hex[:12]}"
    monkeypatch.setenv("MY_DB_URL", f"postgresql://bob:{secret}@db/x")
    for name in ("PGPASSWORD", "PGPASSFILE", "DATABASE_URL"):
        monkeypatch.setenv(name, f"value-of-{name}")
    db = f"sqlite:///{tmp_path / 'other.db'}?password={secret}"
    code, _, err = tuner("search", *TINY, "--budget", "1", "--runner", "command", "--study", "envdb", "--db", db,
                         "--command", f"{PY} -c \"import os; print(sorted(os.environ.items()))\"")
    assert code == 0, err
    out = (tmp_path / "results/trials/envdb/1/stdout.log").read_text()
    assert "TUNER_TRIAL_DIR" in out and secret not in out and "MY_DB_URL" not in out
    assert "value-of-" not in out


def test_sbatch_scripts_never_export_the_stores_secrets(tmp_path, monkeypatch):
    secret = f"Pw-{uuid.uuid4().hex[:12]}"
    monkeypatch.setenv("TUNER_DB", f"postgresql://bob:{secret}@db/x")
    trial, slurm = _hostile_trial(tmp_path)
    slurm = {**slurm, "env": {**slurm.get("env", {}), "DB_COPY": f"x{secret}x", "PGPASSWORD": "pg",
                              "KEEP_ME": "1"}}
    script = render_sbatch(trial, slurm, template="harness", python="python3", trial_dir=tmp_path / "job")
    assert secret not in script and "PGPASSWORD" not in script and "DB_COPY" not in script
    assert "export KEEP_ME=1" in script


# ---- sbatch scripts -----------------------------------------------------------------------------
def _hostile_trial(tmp_path: Path) -> tuple[TrialSpec, dict]:
    cluster = load_cluster("local-slurm")
    model = dataclasses.replace(ModelSpec("tiny", 4, 64, 4, 64, 512, global_batch=16), name=HOSTILE)
    w = make_workload(model, 1, cluster)
    return TrialSpec("study-ok", 3, Layout(tp=1, pp=1, dp=2, micro_batch=1), w, tmp_path / "job"), cluster.slurm


@pytest.mark.parametrize("template", ["harness", "command"])
def test_sbatch_quotes_a_hostile_model_name(tmp_path, template):
    trial, slurm = _hostile_trial(tmp_path)
    script = render_sbatch(trial, slurm, template=template, python="python3", trial_dir=tmp_path / "job",
                           command=["python3", "train.py", HOSTILE] if template == "command" else None)
    path = tmp_path / "job.sbatch"
    path.write_text(script)
    assert subprocess.run(["bash", "-n", str(path)], capture_output=True).returncode == 0
    # sbatch reads #SBATCH directives only up to the first command: none may come from the name
    head = script.split("\nset -uo pipefail")[0]
    assert "PWNED" not in "\n".join(l for l in head.splitlines() if l.startswith("#SBATCH"))
    # every other mention is inside a quoted shell word: the model name only in the header comment
    # (JSON-escaped, one line) and in the quoted TUNER_MODEL export
    assert script.count(shlex.quote(HOSTILE)) == (2 if template == "command" else 1)
    assert script.replace(shlex.quote(HOSTILE), "").count("PWNED") == HOSTILE.count("PWNED")  # the comment
    # and running the script (srun and scontrol stubbed) executes none of it
    (tmp_path / "job").mkdir()
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    (bin_ / "srun").write_text("#!/bin/bash\nprintf '%s\\n' \"$TUNER_MODEL\" > srun_model\n"
                               "printf '%s\\n' \"$@\" > srun_argv\n")
    (bin_ / "scontrol").write_text("#!/bin/bash\necho localhost\n")
    for f in bin_.iterdir():
        f.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_}:{os.environ['PATH']}", "SLURM_JOB_ID": "1", "SLURM_JOB_NODELIST": "x", "SLURM_NTASKS": "2",
           "HOME": str(tmp_path)}
    r = subprocess.run(["bash", str(path)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert pwned(tmp_path) == []
    job = tmp_path / "job"
    assert (job / "srun_model").read_text()[:-1] == HOSTILE
    if template == "command":
        assert (job / "srun_argv").read_text().splitlines()[-len(HOSTILE.splitlines()):] == HOSTILE.splitlines()


def test_spec_names_with_control_characters_are_refused(tuner, tmp_path):
    m = tmp_path / "m.toml"
    m.write_text('name = "x\\n#SBATCH --wrap=evil"\nnum_layers = 4\nhidden_size = 64\nnum_attention_heads = 4\n'
                 'seq_length = 64\nvocab_size = 512\nglobal_batch = 16\n')
    code, _, err = tuner("plan", "--model", str(m), "--nodes", "1", "--cluster", "local")
    assert code == 2 and "printable" in err and len(err.strip().splitlines()) == 1
