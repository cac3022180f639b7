"""`--command ./nosuch.sh` is refused before the study starts (reliability task D, item 3): the command runner started
every trial, each failed "command not found" (and the driver stopped the study after three), leaving a stored study
of failed trials for a typo tuner can see on this machine. Where the trials run here (the command runner on this
machine, a local Ray), a program that is not found, or not executable, is refused: one line naming the fix, exit 2,
nothing stored. Not for Slurm (the program lives on the cluster) nor a study on a Ray cluster (--ray-address: its
workers run it)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import tuner
import tuner as tuner_module
from tuner.errors import UsageError
from tuner.store import open_store

BASE = ("search", "--model", "tiny", "--nodes", "1", "--cluster", "local", "--runner", "command", "--budget", "1")


def test_a_command_whose_program_is_missing_is_refused_before_the_study(tuner, tmp_path):
    code, out, err = tuner(*BASE, "--study", "typo", "--command", "./nosuch.sh --steps 3")
    assert code == 2 and err.strip().splitlines()[-1] == (
        f"error: --command: ./nosuch.sh does not exist ({tmp_path / 'nosuch.sh'}): fix the path, or start tuner from "
        "the directory that has it (a relative path means the directory tuner is started from)"), err
    code, out, err = tuner(*BASE, "--study", "typo2", "--command", "no-such-trainer-xyz --flag")
    assert code == 2 and "'no-such-trainer-xyz' is not found on PATH" in err.strip().splitlines()[-1], err
    with open_store(tuner.db) as store:
        assert "typo" not in store.study_names() and "typo2" not in store.study_names()


def test_a_script_that_is_not_executable_is_refused_naming_chmod(tuner, tmp_path):
    (tmp_path / "train.sh").write_text("#!/bin/sh\nexit 1\n")
    code, out, err = tuner(*BASE, "--study", "nox", "--command", "./train.sh")
    assert code == 2 and "is not executable: chmod +x" in err and "bash ./train.sh" in err, err
    # review (task R) of 730878c: a directory was 'not executable: chmod +x ./scripts', which cannot make it run
    (tmp_path / "scripts").mkdir()
    code, out, err = tuner(*BASE, "--study", "dir", "--command", "./scripts --x")
    assert code == 2 and err.strip().splitlines()[-1] == (
        f"error: --command: ./scripts is a directory ({tmp_path / 'scripts'}), not a program: name the script or "
        "program in it"), err


def test_programs_that_run_are_let_through(tmp_path, monkeypatch):
    from tuner.runners.program import program_refusal
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.sh").write_text("#!/bin/sh\nexit 1\n")
    (tmp_path / "train.sh").chmod(0o755)
    for cmd in ("./train.sh --x 1", f"{sys.executable} -c pass", "bash -c 'exit 0'", "python3 train.py"):
        assert program_refusal(cmd, tmp_path) is None, cmd
    assert program_refusal("./nosuch.sh", tmp_path)


def test_a_shells_words_are_refused_naming_what_runs_without_one(tuner, tmp_path):
    # review (task R) of 730878c: 'FOO=1 ./train.sh' (no shell runs it: Popen looked for a program 'FOO=1') was refused
    # as "'FOO=1' is not found on PATH ... (./FOO=1 for a file in this directory"; '~/x.sh' as a missing ./~/x.sh
    from tuner.runners.program import program_refusal
    (tmp_path / "train.sh").write_text("#!/bin/sh\nexit 1\n")
    (tmp_path / "train.sh").chmod(0o755)
    code, out, err = tuner(*BASE, "--study", "assign", "--command", "FOO=1 ./train.sh --x")
    assert code == 2 and err.strip().splitlines()[-1] == (
        "error: --command: FOO=1 sets a variable, which only a shell does (the command runs without one): write "
        "--command \"env FOO=1 ./train.sh --x\", or export it before tuner starts"), err
    assert program_refusal("env FOO=1 ./train.sh --x", tmp_path) is None          # the fix it names runs
    assert "./nosuch.sh does not exist" in program_refusal("env FOO=1 ./nosuch.sh", tmp_path)   # env's program
    home = program_refusal("~/train.sh", tmp_path)
    assert "'~' means the home directory only to a shell" in home and home.endswith(str(Path.home() / "train.sh"))
    # and an argument's: python opened ./~/train.py in the trial directory, every trial failed
    for cmd, fix in (("python3 ~/train.py --x 1", str(Path.home() / "train.py")),
                     ("python3 train.py --cfg=~/c.yaml", "--cfg=" + str(Path.home() / "c.yaml"))):
        refusal = program_refusal(cmd, tmp_path)
        assert "'~' means the home directory only to a shell" in refusal and refusal.endswith(fix), cmd
    assert program_refusal("bash -c 'python3 ~/train.py'", tmp_path) is None        # a shell expands it there


def test_a_library_study_with_an_argv_list_is_checked_not_crashed(tmp_path, monkeypatch):
    # review (task R) of 730878c: CommandRunner takes an argv list (runner_options={"command": [...]} from Python), and
    # program_refusal shlex.split it: AttributeError ('list' object has no attribute 'read') out of create_study
    monkeypatch.chdir(tmp_path)
    db = f"sqlite:///{tmp_path / 'lib.db'}"
    opts = dict(model="tiny", nodes=1, cluster="local", runner="command", storage=db, budget=1)
    study = tuner.create_study("argv", runner_options={"command": [sys.executable, "-c", "pass"]}, **opts)
    assert study.record.settings["runner_options"]["command"] == [sys.executable, "-c", "pass"]
    with pytest.raises(UsageError, match=r"--command: \./nosuch\.sh does not exist"):
        tuner.create_study("argv2", runner_options={"command": ["./nosuch.sh", "--x"]}, **opts)


def test_a_command_given_as_a_list_in_settings_is_refused_naming_the_string(tuner, tmp_path):
    # review (task R): click cast a study.toml's `command = ["python3", "train.py"]` (or create_study(command=[...])) to
    # the list's repr, "['python3', 'train.py']", split as '[python3,' 'train.py]': program_refusal then said
    # "'[python3,' is not found on PATH ... (./[python3, for a file in this directory"
    (tmp_path / "cmd.toml").write_text('model = "tiny"\nnodes = 1\ncluster = "local"\nrunner = "command"\n'
                                       'command = ["python3", "train.py", "--cfg", "a b.yaml"]\n')
    code, out, err = tuner("search", "--config", str(tmp_path / "cmd.toml"), "--budget", "1")
    assert code == 2 and err.strip().splitlines()[-1] == (
        f"error: --config {tmp_path / 'cmd.toml'}: command = ['python3', 'train.py', '--cfg', 'a b.yaml'] must be a "
        "string (one string: command = \"python3 train.py --cfg 'a b.yaml'\")"), err
    with pytest.raises(UsageError, match=r"create_study: command = \['python3', '-c', 'pass'\] must be a string"):
        tuner_lib_create(tmp_path, command=["python3", "-c", "pass"])


def tuner_lib_create(tmp_path, **kw):
    return tuner.create_study(model="tiny", nodes=1, cluster="local", runner="command",
                              storage=f"sqlite:///{tmp_path / 'lib2.db'}", budget=1, **kw)


def test_a_program_outside_path_or_not_executable_is_named_whatever_the_command_form(tmp_path, monkeypatch):
    # review (task R): the not-executable message read command.strip(), an AttributeError for an argv list (a library's
    # runner_options) and for env's program; a program only in tuner's own, not activated, environment (a venv's
    # python, torchrun) was 'not found on PATH: install it'
    from tuner.runners.program import program_refusal
    (tmp_path / "train.sh").write_text("#!/bin/sh\nexit 1\n")
    for cmd in (["./train.sh", "--x"], "env FOO=1 ./train.sh --x"):
        assert "./train.sh is not executable: chmod +x ./train.sh" in program_refusal(cmd, tmp_path), cmd
    (tmp_path / "empty").mkdir()
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    beside = Path(sys.executable).parent / Path(sys.executable).name
    assert program_refusal(f"{beside.name} -c pass", tmp_path) == (
        f"--command: {beside.name!r} is not found on PATH; {beside} is (tuner's own environment, not activated): give "
        "that path, or activate the environment before tuner starts")
    assert "install it" in program_refusal("no-such-trainer-xyz", tmp_path)


def test_a_study_run_or_resumed_from_another_directory_is_refused_naming_it(tuner, tmp_path, monkeypatch):
    # review (task R) of 730878c: ./train.sh means the directory tuner starts from (each run's CommandRunner reads its
    # own); from another, resume said 'fix the path' (the stored command cannot change) and a library study created
    # here, then optimized there, ran its trials (the fresh optimize() path was not checked): each failed
    (tmp_path / "train.sh").write_text("#!/bin/sh\nexit 1\n")
    (tmp_path / "train.sh").chmod(0o755)
    (tmp_path / "elsewhere").mkdir()
    for name in ("cli", "lib"):
        tuner_lib_create(tmp_path, study=name, command="./train.sh")
    monkeypatch.chdir(tmp_path / "elsewhere")
    code, out, err = tuner("resume", "cli", "--db", f"sqlite:///{tmp_path / 'lib2.db'}")
    assert code == 2 and "or start tuner from the directory that has it" in err.strip().splitlines()[-1], err
    study = tuner_module.load_study("lib", storage=f"sqlite:///{tmp_path / 'lib2.db'}")
    with pytest.raises(UsageError, match=r"\./train\.sh does not exist .*elsewhere/train\.sh"):
        study.optimize()
    assert study.trials == []


def test_a_command_with_an_unbalanced_quote_is_refused_in_one_line(tuner):
    # review (task R): shlex.split's ValueError escaped CommandRunner: 'internal error: ValueError: No closing
    # quotation', exit 1
    code, out, err = tuner(*BASE, "--study", "quote", "--command", "python3 'train.py --x")
    assert code == 2 and err.strip().splitlines()[-1] == (
        "error: --command \"python3 'train.py --x\" does not split as a shell would (No closing quotation): balance its "
        "quotes, or escape the character"), err
