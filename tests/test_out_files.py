"""The user's file system refuses a path (issue 19): one line naming the path and the fix, exit 2, never
"internal error"; `launch` and `report` write their files all or nothing.

Read-only directories are real (chmod 555). Root ignores them through CAP_DAC_OVERRIDE, so a test run as
root runs `tuner` in a child whose bounding set drops that capability (prctl); where writing still
succeeds the test skips, saying why."""

from __future__ import annotations

import ctypes
import errno
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tuner.errors import PathError, environment_error

ROOT = Path(__file__).resolve().parents[1]
LAUNCH = ("--train-iters", "10", "--data-path", "/data/text", "--tokenizer", "gpt2")
CAPS = (1, 2, 3)          # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH, CAP_FOWNER
PR_CAPBSET_DROP = 24


def _drop_file_caps() -> None:
    """In the child, before exec: without these root obeys file permissions like any user."""
    if os.geteuid() == 0:
        libc = ctypes.CDLL(None, use_errno=True)
        for cap in CAPS:
            libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)


def unprivileged(argv, cwd, env=None) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=300,
                          preexec_fn=_drop_file_caps)


@pytest.fixture
def read_only(tmp_path) -> Path:
    """A directory chmod 555 that the `tuner` children really cannot write into, else skip."""
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    probe = unprivileged([sys.executable, "-c", f"open({str(ro / 'probe')!r}, 'w')"], tmp_path)
    if probe.returncode == 0:
        ro.chmod(0o755)
        pytest.skip("chmod 555 is not enforced here (root whose CAP_DAC_OVERRIDE cannot be dropped)")
    yield ro
    ro.chmod(0o755)


@pytest.fixture
def study(tuner, tmp_path) -> str:
    code, _, err = tuner("search", "--model", "tiny", "--cluster", "local", "--nodes", "1", "--budget", "3",
                         "--study", "s1")
    assert code == 0, err
    return "s1"


def cli(tmp_path, *args, cwd=None) -> subprocess.CompletedProcess:
    """`tuner ARGS` as a child that obeys file permissions, on this checkout and the test's store."""
    env = {**os.environ, "TUNER_DB": f"sqlite:///{tmp_path / 'tuner.db'}", "PYTHONPATH": str(ROOT)}
    return unprivileged([sys.executable, "-m", "tuner", *map(str, args)], cwd or tmp_path, env)


def one_line_error(r: subprocess.CompletedProcess, *parts: str) -> str:
    """The run exited 2 with one `error:` line containing `parts`, and no traceback or internal error."""
    assert r.returncode == 2, (r.returncode, r.stderr)
    errors = [line for line in r.stderr.splitlines() if line.startswith(("error", "internal error", "Traceback"))]
    assert len(errors) == 1 and errors[0].startswith("error: "), r.stderr
    for part in parts:
        assert part in errors[0], (part, errors[0])
    return errors[0]


# ---- 4. permission denied, read-only, not a directory: one line, exit 2 -----------------------
@pytest.mark.parametrize("command", ["report", "launch"])
def test_out_in_a_read_only_directory(tmp_path, study, read_only, command):
    extra = LAUNCH if command == "launch" else ()
    r = cli(tmp_path, command, study, "--out", read_only / "files", *extra)
    one_line_error(r, f"--out {read_only / 'files'}", "permission denied", f"make {read_only} writable",
                   "another --out")
    assert sorted(p.name for p in read_only.iterdir()) == []          # nothing staged was left behind


def test_default_store_in_a_read_only_working_directory(tmp_path, read_only):
    env_db = {"TUNER_DB": ""}
    r = unprivileged([sys.executable, "-m", "tuner", "search", "--model", "tiny", "--cluster", "local", "--nodes",
                      "1", "--budget", "1"], read_only, {**os.environ, **env_db, "PYTHONPATH": str(ROOT)})
    one_line_error(r, str(read_only / "results"), "permission denied", "--db")


def test_export_to_a_read_only_directory(tmp_path, study, read_only):
    r = cli(tmp_path, "export", study, "--out", read_only / "t.csv")
    one_line_error(r, str(read_only / "t.csv"), "permission denied", f"make {read_only} writable")


def test_launch_force_into_a_read_only_out_keeps_the_old_files(tmp_path, study, tuner):
    out = tmp_path / "launch"
    code, _, err = tuner("launch", study, "--out", str(out), *LAUNCH)
    assert code == 0, err
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    out.chmod(0o555)
    try:
        probe = unprivileged([sys.executable, "-c", f"open({str(out / 'probe')!r}, 'w')"], tmp_path)
        if probe.returncode == 0:
            pytest.skip("chmod 555 is not enforced here (root whose CAP_DAC_OVERRIDE cannot be dropped)")
        r = cli(tmp_path, "launch", study, "--out", out, "--force", "--train-iters", "99", *LAUNCH[2:])
        one_line_error(r, f"--out {out}", "permission denied", f"make {out} writable")
    finally:
        out.chmod(0o755)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_out_below_a_file(tuner, study, tmp_path):
    (tmp_path / "afile").write_text("x")
    for command in ("report", "launch"):
        extra = LAUNCH if command == "launch" else ()
        code, _, err = tuner(command, study, "--out", "afile/sub", *extra)
        assert code == 2 and "internal error" not in err, err
        assert f"--out afile/sub: a part of the path is a file, not a directory ({tmp_path / 'afile'})" in err


def test_only_the_environments_errors_are_not_bugs():
    for code in (errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC, errno.EDQUOT, errno.ENOTDIR):
        err = environment_error(OSError(code, os.strerror(code), "/some/dir/file"))
        assert isinstance(err, PathError) and err.exit_code == 2 and "/some/dir/file" in str(err)
    assert "make /some/dir writable" in str(environment_error(PermissionError(errno.EACCES, "x", "/some/dir/f")))
    assert environment_error(OSError(errno.EXDEV, "cross-device link")) is None       # a bug: internal error
    assert environment_error(FileNotFoundError(errno.ENOENT, "x", "/nope")) is None   # tuner checks its paths
    assert environment_error(ValueError("x")) is None


def test_an_os_error_that_is_a_bug_still_says_internal_error(tuner, monkeypatch):
    import tuner.cli.query as query

    def boom(*a, **k):
        raise OSError(errno.EXDEV, "Invalid cross-device link")
    monkeypatch.setattr(query, "read_store", boom)
    code, _, err = tuner("studies")
    assert code == 1 and err.startswith("internal error: OSError")


# ---- 5. all or nothing ------------------------------------------------------------------------
def fail_on(monkeypatch, target, attr: str, call: int, code=errno.ENOSPC):
    """Make target.attr raise OSError(code) on its `call`-th call (1-based); the others run for real."""
    real, calls = getattr(target, attr), []

    def flaky(*args, **kwargs):
        calls.append(args)
        if len(calls) == call:
            raise OSError(code, os.strerror(code), str(args[0]) if args else None)
        return real(*args, **kwargs)
    monkeypatch.setattr(target, attr, flaky)
    return calls


def snapshot(d: Path) -> dict:
    return {p.name: (p.read_bytes(), stat.S_IMODE(p.stat().st_mode)) for p in sorted(d.iterdir())}


@pytest.mark.parametrize("command", ["launch", "report"])
@pytest.mark.parametrize("where", ["writing the 2nd file", "moving the 2nd file in"])
def test_a_failed_force_leaves_the_old_files_untouched(tuner, study, tmp_path, monkeypatch, command, where):
    out = tmp_path / "out"
    extra = LAUNCH if command == "launch" else ()
    code, _, err = tuner(command, study, "--out", str(out), *extra)
    assert code == 0, err
    (out / "notes.txt").write_text("mine")                  # the user's own file beside tuner's
    before = snapshot(out)
    if where == "writing the 2nd file":
        failing = 2
        calls = fail_on(monkeypatch, Path, "write_bytes", failing)
    else:
        failing = len(before) - 1 + 2                        # tuner's old files set aside, then the 2nd new one
        calls = fail_on(monkeypatch, os, "replace", failing)
    again = ("--train-iters", "77", *LAUNCH[2:]) if command == "launch" else ()
    code, _, err = tuner(command, study, "--out", str(out), "--force", *again)
    assert len(calls) >= failing, "the failure was never injected"
    assert code == 2 and "internal error" not in err, err
    assert f"--out {out}: no space left on device" in err and "free space" in err
    assert snapshot(out) == before                           # no half set, no staging folder, modes kept
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


@pytest.mark.parametrize("command", ["launch", "report"])
def test_a_failed_fresh_write_leaves_no_out(tuner, study, tmp_path, monkeypatch, command):
    out = tmp_path / "new" / "out"
    fail_on(monkeypatch, Path, "write_bytes", 2)
    code, _, err = tuner(command, study, "--out", str(out), *(LAUNCH if command == "launch" else ()))
    assert code == 2 and "no space left on device" in err, err
    assert not out.exists() and list((tmp_path / "new").iterdir()) == []


def test_force_replaces_the_set_and_keeps_the_users_files(tuner, study, tmp_path):
    out = tmp_path / "launch"
    code, _, err = tuner("launch", study, "--out", str(out), *LAUNCH)
    assert code == 0, err
    (out / "notes.txt").write_text("mine")
    assert "ds_config.json" in os.listdir(out)                 # megatron-deepspeed, the study's framework
    code, _, err = tuner("launch", "--model", "tiny", "--cluster", "local", "--nodes", "1", "--framework",
                         "megatron-core", "--out", str(out), "--force", "--train-iters", "5", "--mock-data")
    assert code == 0, err
    names = sorted(os.listdir(out))
    assert names == ["launch.sbatch", "layout.json", "megatron_args.txt", "notes.txt"], names   # no stale ds_config
    assert json.loads((out / "layout.json").read_text())["framework"] == "megatron-core"
    assert os.access(out / "launch.sbatch", os.X_OK) and (out / "notes.txt").read_text() == "mine"
