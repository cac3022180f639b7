"""Writing a set of files into an --out directory all or nothing (`tuner report`, `tuner launch`).

The files are written into a staging directory first: a sibling of a new --out, which is then renamed
into place (the whole set appears at once), or a hidden folder inside an existing one (same file system
even when --out is a mount point), whose files then replace the old ones, each old one kept aside until
every new one is in. A failure at any step (permission denied, disk full, ...) puts the old files back,
removes the staged ones and raises a PathError naming --out and the fix: never a half-written set.
"""

from __future__ import annotations

import errno
import os
import secrets
import shutil
from pathlib import Path

from tuner.errors import environment_error


def _stage(parent: Path, name: str) -> Path:
    """A new hidden directory in `parent`, made with the usual permissions (umask), unlike mkdtemp's 0700:
    a new --out is this directory, renamed."""
    for _ in range(100):
        d = parent / f".{name}.tuner-{os.getpid()}-{secrets.token_hex(4)}"
        try:
            d.mkdir()
            return d
        except FileExistsError:
            continue
    raise FileExistsError(f"no free staging name in {parent}")


def _swap_in(stage: Path, out: Path, names: list[str], remove: list[str]) -> None:
    """Move the staged `names` into `out`, the old files of those names (and `remove`) aside first; on
    a failure the old files go back and the new ones are taken out again, then the error propagates."""
    aside = _stage(out, "old")
    kept, placed = [], []
    try:
        for name in dict.fromkeys([*names, *remove]):
            if os.path.lexists(out / name):
                os.replace(out / name, aside / name)
                kept.append(name)
        for name in names:
            os.replace(stage / name, out / name)
            placed.append(name)
    except OSError:
        for name in placed:
            os.replace(out / name, stage / name)
        for name in kept:
            os.replace(aside / name, out / name)
        raise
    finally:
        shutil.rmtree(aside, ignore_errors=True)


def _write_all(out: Path, files: dict[str, bytes | str], executable: tuple, remove: tuple) -> None:
    fresh = not out.exists()
    if fresh:
        try:
            out.parent.mkdir(parents=True, exist_ok=True)
        except FileExistsError as exc:      # a file where a folder of the path should be
            raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), exc.filename) from None
    stage = _stage(out.parent if fresh else out, out.name if fresh else "new")
    try:
        for name, data in files.items():
            (stage / name).write_bytes(data.encode() if isinstance(data, str) else data)
            if name in executable:
                (stage / name).chmod(0o755)
        if fresh:
            stage.rename(out)               # the whole set appears at once
        else:
            _swap_in(stage, out, list(files), [n for n in remove if n not in files])
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def _as_given(path, out: Path) -> str:
    """A path of the staging folders as the user knows it: a staged file as its name in `out`, a staging
    folder as the folder it was made in."""
    parts = Path(os.fsdecode(path)).parts
    for i, part in enumerate(parts):
        if part.startswith(".") and ".tuner-" in part:
            rest = parts[i + 1:]
            return str(out.joinpath(*rest) if rest else Path(*parts[:i]))
    return os.fsdecode(path)


def write_files(out: Path, files: dict[str, bytes | str], *, executable: tuple = (), remove: tuple = ()) -> None:
    """Write `files` ({name: text or bytes}, plain names) into the directory `out`, all or nothing; the
    names in `executable` get mode 755, those in `remove` (stale files of an earlier run) go. Other files
    in `out` stay. An OSError of the user's environment becomes a PathError naming --out and the fix."""
    try:
        _write_all(out, files, executable, remove)
    except OSError as exc:
        shown = OSError(exc.errno, exc.strerror, None if exc.filename is None else _as_given(exc.filename, out))
        problem = environment_error(shown, "--out", out)
        if problem is None:
            raise
        raise problem from None
