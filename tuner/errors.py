"""The few errors tuner raises. Each message says what to do next.

`UsageError` (exit status 2) is bad input from the user; `TunerError` (exit status 1) is a
runtime failure the user can act on. Anything else is a bug and shows a traceback.
"""

from __future__ import annotations

import errno
import importlib.util
import os
import sys


class TunerError(Exception):
    """A runtime error with a message that names the fix. CLI exit status 1."""

    exit_code = 1


class UsageError(TunerError):
    """Bad input: an unknown name, a malformed file, an impossible layout. CLI exit status 2."""

    exit_code = 2


class SpecError(UsageError):
    """A model, cluster or search-space file is malformed or names unknown keys."""


class UnknownName(UsageError):
    """A preset name (model, cluster) that names no preset: the message lists them and the closest."""


class InvalidLayout(UsageError):
    """A layout breaks a rule for the workload; the message is the rule it breaks."""


class StudyExists(UsageError):
    """A study of that name is already in the store."""

    def __init__(self, name: str):
        super().__init__(f"study '{name}' exists: continue it with `tuner resume {name}`, "
                         "or pick another name with --study")
        self.name = name


class UnknownStudy(UsageError):
    """No study of that name is in the store."""

    def __init__(self, name: str, known: list[str]):
        shown = ", ".join(known[:20]) + (" ..." if len(known) > 20 else "")
        hint = f"known studies: {shown}" if known else "the store has no studies yet: start one with `tuner search`"
        super().__init__(f"no study named '{name}'; {hint}")
        self.name = name


class NoStore(UsageError):
    """A command that only reads found no results store where it looked."""

    def __init__(self, shown: str):
        super().__init__(f"no results store at {shown}: nothing has been stored there yet. Run `tuner search` "
                         "first, or choose the store with --db URL or TUNER_DB (e.g. --db sqlite:////path/tuner.db)")


class BudgetSpent(TunerError):
    """A claim found the study's budget spent (by this driver or another one on the same study)."""


class Displaced(TunerError):
    """Another driver took the study over (`tuner resume --force`): this driver's lease is from an old
    epoch, so the store refuses its claims and results (tuner.lease)."""

    def __init__(self, study: str):
        super().__init__(f"study '{study}' was taken over by another driver (`tuner resume {study} --force`): "
                         "this driver stopped and wrote nothing more")


class StoreError(TunerError):
    """The results store cannot be reached or has the wrong schema."""


class StoreNotWritable(UsageError, StoreError):
    """The --db the user gave cannot be written (read-only file or directory, missing directory): bad
    input, exit 2, and still a StoreError for whoever catches those."""


class BadStoreURL(UsageError, StoreError):
    """--db / TUNER_DB is not a database URL tuner can open (a path, a typo, another backend): bad input,
    exit 2, and still a StoreError."""


# The pip extra (pyproject.toml) that installs each optional module; None: a base dependency.
EXTRAS = {"psycopg": "postgres", "ray": "ray", "deepspeed": "deepspeed", "torch": "deepspeed",
          "pyarrow": "report", "matplotlib": None}


class MissingExtra(UsageError):
    """An optional dependency is not installed; the message gives the pip command."""

    def __init__(self, module: str, extra: str | None):
        fix = f"pip install 'tuner[{extra}]'" if extra else f"pip install {module} (tuner needs it; reinstall tuner)"
        super().__init__(f"{module} is not installed: {fix}")
        self.module, self.extra = module, extra


def missing_extra(exc: BaseException) -> MissingExtra | None:
    """The MissingExtra an ImportError of an optional dependency stands for (wherever it was imported:
    tuner itself, or a library such as SQLAlchemy loading psycopg), else None."""
    seen = set()
    while exc is not None and id(exc) not in seen:   # the import error may be the cause of another error
        seen.add(id(exc))
        name = (getattr(exc, "name", None) or "").split(".")[0] if isinstance(exc, ImportError) else ""
        if name in EXTRAS:
            return MissingExtra(name, EXTRAS[name])
        exc = exc.__cause__ or exc.__context__
    return None


def require(module: str) -> None:
    """Raise MissingExtra unless `module` can be imported (checked without importing it)."""
    try:
        found = sys.modules[module] is not None if module in sys.modules else \
            importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        raise MissingExtra(module, EXTRAS.get(module))


#: errno -> (what the file system said, the kind of fix) of the OSErrors the user's environment causes:
#: a path tuner was told to use that it may not write, a full disk, a file where a directory belongs.
#: Not bugs: one line naming the path and the fix, exit 2 (PathError). Any other OSError is a bug.
ENVIRONMENT_ERRNOS = {
    errno.EACCES: ("permission denied", "permission"), errno.EPERM: ("operation not permitted", "permission"),
    errno.EROFS: ("read-only file system", "permission"), errno.ENOSPC: ("no space left on device", "space"),
    errno.EDQUOT: ("disk quota exceeded", "space"), errno.EFBIG: ("file too large", "space"),
    errno.ENOTDIR: ("a part of the path is a file, not a directory", "path"),
    errno.EISDIR: ("is a directory", "path"), errno.ENAMETOOLONG: ("file name too long", "path"),
    errno.ELOOP: ("too many levels of symbolic links", "path"),
}   # not ENOENT: tuner checks the paths it is given, so a missing file it meets is its own bug
#: Where a path comes from when the caller does not say (the options that choose where tuner writes).
ANY_OPTION = "--out, --results-dir, or --db / TUNER_DB for the store"


class PathError(UsageError):
    """The user's file system refused a path tuner was told to use (permission denied, read-only file
    system, disk full, not a directory): one line naming the path and the fix. CLI exit status 2, like
    any other input of the user's that needs changing (the path, its permissions, free space)."""


def environment_error(exc: BaseException, option: str | None = None, path: os.PathLike | str | None = None
                      ) -> PathError | None:
    """The PathError an OSError of the user's environment stands for (ENVIRONMENT_ERRNOS), else None.
    `option` names the command-line option that chose the path (--out) and `path` its value, for a
    message about what the user gave rather than a file tuner made inside it."""
    if not isinstance(exc, OSError) or exc.errno not in ENVIRONMENT_ERRNOS:
        return None
    said, kind = ENVIRONMENT_ERRNOS[exc.errno]
    failed = exc.filename if exc.filename is not None else path
    where = os.path.abspath(os.fsdecode(failed)) if failed is not None else None
    shown = f"{option} {path}" if option and path is not None else (where or "writing the output")
    detail = f" ({where})" if where and option and path is not None and where != os.path.abspath(path) else ""
    other = f"another {option}" if option else f"another location ({ANY_OPTION})"
    folder = where if where and os.path.exists(where) else where and os.path.dirname(where)   # refused in it
    fix = {"permission": f"make {folder} writable, or choose {other}" if folder else f"choose {other}",
           "space": f"free space on that file system, or choose {other}",
           "path": f"choose {other}"}[kind]
    return PathError(f"{shown}: {said}{detail}: {fix}")
