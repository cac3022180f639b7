"""What a failed trial printed says: a log's tail, its first error line behind a launcher's prefix, and an
out-of-memory error anywhere in it with PyTorch's sentence (what the GPUs held: tuner.trial.oom_capacity_gb).
The command runner reads its stderr with these, the Slurm runner its job's log.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from tuner.trial import Status, TrialResult, kept_message, looks_oom, oom_sentence

TAIL_BYTES = 2000


def tail(path: Path, n: int = TAIL_BYTES) -> str:
    """The last `n` bytes of the file at `path` as text, stripped; "" when it cannot be read."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - n))
            return f.read().decode(errors="replace").strip()
    except OSError:
        return ""


# What launchers put before each line of a rank's output: a timestamp, then torchrun's "[rank3]:" (2.2+) or
# "[default0]:" (--tee, role 'default'), accelerate's "[gpu187:1]:", srun --label's "0:", pdsh's "worker-1:".
PREFIX = r"(?:\d{4}-\d\d-\d\d[T ][\d:.,]+\s+)?(?:(?:\[[^\]\s]{1,40}\]|[\w.-]{1,40}):\s*){0,3}"
CAUSE = re.compile(r"^\s*" + PREFIX + r"(?P<cause>\[rank \d+\] .*|(?:[\w.]+\.)?\w*(?:Error|Exception|Exit)\b:.*)$")
LAUNCHER_NOISE = ("ChildFailedError", "torch.distributed.elastic", "CalledProcessError")


def root_cause(text: str, limit: int | None = 500) -> str:
    """The first error line of a crashed command, a launcher's prefix dropped (a launcher's summary is
    skipped), at most `limit` characters; or ''."""
    for line in text.splitlines():
        m = CAUSE.match(line)
        if m and not any(n in line for n in LAUNCHER_NOISE):
            return m.group("cause").strip()[:limit]
    return ""


def oom_lines(path: Path) -> tuple[str | None, str | None]:
    """(the error line holding the last of PyTorch's out-of-memory sentences in the file at `path` -- the
    sentence alone where no error line holds it --, the first out-of-memory error line), launchers' prefixes
    dropped; read through the whole file, since other ranks' tracebacks, NCCL's watchdog and a launcher's
    summary can print far more after it than any tail keeps. (None, None) where it shows neither."""
    said = first = None
    try:
        with open(path, "rb") as f:
            for raw in f:
                if b"emory" not in raw and b"EMORY" not in raw and b"bad_alloc" not in raw:
                    continue        # every marker of tuner.trial.OOM_MARKERS but bad_alloc says memory
                line = raw.decode(errors="replace")
                if not looks_oom(line):
                    continue
                cause, sentence = root_cause(line, None), oom_sentence(line)
                said = (cause if sentence and sentence in cause else sentence) or said
                first = first or cause or None
    except OSError:
        pass
    return said, first


def with_said(result: TrialResult, said: str | None) -> TrialResult:
    """An oom `result` whose message lacks PyTorch's out-of-memory sentence keeps the one its log `said`."""
    if result.status == Status.OOM and said and oom_sentence(result.message) is None:
        result.message = kept_message(f"{said} | {result.message}" if result.message else said, Status.OOM)
    return result
