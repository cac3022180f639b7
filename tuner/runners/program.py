"""Whether a command runner's program can start on this machine, checked before a study is stored or resumed
(tuner.study.check_program): a typo in --command would otherwise fail every trial. The program runs without a shell
(tuner.runners.command), so a shell's words -- FOO=1 before it, '~' -- are refused naming what works without one.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import sys
from pathlib import Path
from typing import Sequence

from tuner.environment import inherited_env
from tuner.runners.command import resolve_relative

ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")     # a shell's NAME=value before a command


def program_refusal(command: str | Sequence[str], start: Path) -> str | None:
    """Why `command`'s program cannot start on this machine, naming the fix; None where it can (or `command` does not
    split: the runner says so). A program with a '/' is a file (relative to `start`, the directory tuner is started
    from: resolve_relative) that must exist and be executable; one without, a name on the trial's PATH; a '~' that
    only a shell expands, in it or an argument, is refused too. `command`: a string, or an argv list as CommandRunner
    takes one (a library's runner_options)."""
    try:
        argv = shlex.split(command) if isinstance(command, str) else [str(a) for a in command]
    except (ValueError, TypeError):
        return None
    if not argv:
        return None
    prog = argv[0]
    if ASSIGNMENT.match(prog):                       # FOO=1 ./train.sh: a shell's words, and no shell runs it
        rest = " ".join(shlex.quote(a) for a in argv[1:]) or "PROGRAM"
        return (f"--command: {prog} sets a variable, which only a shell does (the command runs without one): write "
                f"--command \"env {prog} {rest}\", or export it before tuner starts")
    home = next((a for a in argv if _home(a) != a or a is prog and a.startswith("~")), None)   # ~/train.py too
    if home:
        return (f"--command: {home}: '~' means the home directory only to a shell (the command runs without one): "
                f"write the path, {_home(home) if _home(home) != home else 'in full'}")
    if "/" in prog:
        path = resolve_relative([prog], start)[0]
        if not os.path.exists(path):
            return (f"--command: {prog} does not exist ({path}): fix the path, or start tuner from the directory "
                    "that has it (a relative path means the directory tuner is started from)")
        if os.path.isdir(path):
            return f"--command: {prog} is a directory ({path}), not a program: name the script or program in it"
        if not os.access(path, os.X_OK):
            runner = "python" if prog.endswith(".py") else "bash"
            return (f"--command: {prog} is not executable: chmod +x {prog}, or run it through its interpreter "
                    f"(--command \"{runner} {shlex.join(argv)}\")")
        return None
    missing = _not_on_path(prog)
    if missing:
        return missing
    inner = argv[1:]
    while prog == "env" and inner and ASSIGNMENT.match(inner[0]):
        inner = inner[1:]
    if prog == "env" and inner and not inner[0].startswith("-"):    # env FOO=1 ./train.sh: env runs ./train.sh
        return program_refusal(inner, start)
    return None


def _home(arg: str) -> str:
    """`arg` (or an --opt=value's value) with a leading '~' as a shell expands it (unchanged: no such user)."""
    opt, eq, value = arg.partition("=") if arg.startswith("-") else ("", "", arg)
    return opt + eq + os.path.expanduser(value) if value.startswith("~") else arg


def _not_on_path(prog: str) -> str | None:
    """Why the bare name `prog` is not found on the trials' PATH (tuner's environment less the store's secrets), naming
    where it is where the environment tuner runs in has it (a venv that is not activated: python, torchrun); or None."""
    env = inherited_env()
    if shutil.which(prog, path=os.pathsep.join(os.get_exec_path(env))) is not None:
        return None
    why = " (withheld from the trials: it contains the store's password)" if "PATH" not in env else ""
    beside = Path(sys.executable).parent / prog
    if os.access(beside, os.X_OK) and not beside.is_dir():
        return (f"--command: {prog!r} is not found on PATH{why}; {beside} is (tuner's own environment, not activated): "
                f"give that path, or activate the environment before tuner starts")
    return (f"--command: {prog!r} is not found on PATH{why}: install it, or give its path (./{prog} for a file "
            "in this directory; the command runs without a shell)")
