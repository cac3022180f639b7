"""What a failed trial printed says: a log's tail, its first error line behind a launcher's prefix, and an
out-of-memory error anywhere in it with PyTorch's sentence (what the GPUs held: tuner.trial.oom_capacity_gb).
The command runner reads its stderr with these, the Slurm runner its job's log.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from tuner.trial import ABORTED, OOM_MARKERS, Status, TrialResult, kept_message, looks_oom, oom_sentence

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
# PyTorch's out-of-memory error as Python prints one it raised ("torch.OutOfMemoryError: CUDA out of memory. ...",
# before 2.1 "RuntimeError: CUDA out of memory. ..."), behind any prefix (Open MPI's --tag-output "[1,3]<stderr>:").
# A sentence without its error type was logged, not raised: Inductor's max-autotune logs the OOM of a choice it then
# ignores ("[rank0]:E1210 ... select_algorithm.py:2691] [8/0] Runtime error during autotuning:" then the text,
# pytorch#170130).
RAISED = re.compile(r"Error: (?:CUDA|HIP) out of memory\.")     # its type's name is read back from there (raised())


def root_cause(text: str, limit: int | None = 500) -> str:
    """The first error line of a crashed command, a launcher's prefix dropped (a launcher's summary is
    skipped), at most `limit` characters; or ''."""
    for line in text.splitlines():
        m = CAUSE.match(line)
        if m and not any(n in line for n in LAUNCHER_NOISE):
            return m.group("cause").strip()[:limit]
    return ""


BLOCK_BYTES = 1 << 22     # what oom_lines holds of a log at once
LINE_BYTES = 1 << 14      # the most of a line it keeps on each side of an out-of-memory marker


def oom_lines(path: Path, host: bool = True) -> tuple[str | None, str | None]:
    """(the error line holding the last of PyTorch's out-of-memory sentences in the file at `path` -- the
    sentence alone where no error line holds it: what the process had, not that it failed --, the first
    out-of-memory error line: what says the run failed of it), launchers' prefixes dropped; read through the whole
    file, since other ranks' tracebacks, NCCL's watchdog and a launcher's summary can print far more after it than
    any tail keeps. (None, None) where it shows neither.
    A block at a time (a log can be GBs, a progress bar's '\r'-separated line too): only the lines around an
    out-of-memory marker (tuner.trial.OOM_MARKERS: marked_lines) are decoded, at most LINE_BYTES on each side of it.
    `host`: whether the host's memory is the ranks' (tuner.trial.looks_oom); where not, a line of the host's markers
    alone is none."""
    return oom_in(marked_lines(path), host)


def oom_in(lines, host: bool = True) -> tuple[str | None, str | None]:
    """oom_lines of a log's `lines` already read (marked_lines: those holding an out-of-memory marker, and others)."""
    said = first = None
    for line in lines:
        if not looks_oom(line, host):
            continue
        cause, sentence = root_cause(line, None) or raised(line) or aborted(line), oom_sentence(line)
        said = (cause if sentence and sentence in cause else sentence) or said
        first = first or cause or None
    return said, first


def marked_lines(path: Path, markers: tuple[str, ...] = OOM_MARKERS):
    """The lines (ended by '\n' or '\r', at most LINE_BYTES each side of the marker) of the file at `path` that
    hold one of `markers` (lower case; matched whatever the line's case: by default the out-of-memory ones), in
    order, decoded; none where it cannot be read. A block at a time: what a log's reader holds is its lines."""
    found = tuple(m.encode() for m in markers)
    carry = b""
    try:
        with open(path, "rb") as f:
            while True:
                block = f.read(BLOCK_BYTES)
                buf = carry + block
                if not block:
                    cut = len(buf)
                else:
                    cut = max(buf.rfind(b"\n"), buf.rfind(b"\r")) + 1
                    if cut < len(buf) - LINE_BYTES:   # a line longer than what is kept of it: go on within it
                        cut = len(buf) - LINE_BYTES
                yield from _lines_at(buf, cut, found)
                carry = buf[cut:]
                if not block:
                    return
    except OSError:
        return


def _lines_at(buf: bytes, cut: int, markers: tuple[bytes, ...]):
    """The lines of `buf` holding one of `markers` that starts before `cut` (each line once)."""
    low, starts = buf.lower(), set()
    hits = sorted(pos for m in markers for pos in _find_all(low, m, cut))
    for pos in hits:
        start = max(buf.rfind(b"\n", 0, pos), buf.rfind(b"\r", 0, pos), pos - LINE_BYTES - 1) + 1
        if start in starts:
            continue
        starts.add(start)
        ends = [e for e in (buf.find(b"\n", pos), buf.find(b"\r", pos)) if e >= 0]
        yield buf[start:min([*ends, pos + LINE_BYTES])].decode(errors="replace")


def _find_all(low: bytes, marker: bytes, cut: int):
    pos = low.find(marker, 0, cut + len(marker) - 1)
    while pos >= 0:
        yield pos
        pos = low.find(marker, pos + 1, cut + len(marker) - 1)


def raised(line: str) -> str:
    """From the type's name of the out-of-memory error `line` shows as raised (RAISED) to the line's end; or ''.
    The name is read back character by character: a pattern that starts with it backtracks quadratically on a long
    run of word characters (16 kB of them: 2-9 s)."""
    m = RAISED.search(line)
    if not m:
        return ""
    start = m.start()
    while start > 0 and (line[start - 1].isalnum() or line[start - 1] in "._"):
        start -= 1
    return line[start:].strip()


def aborted(line: str) -> str:
    """From a C++ abort's device out-of-memory error in `line` (tuner.trial.ABORTED) to the line's end; or ''."""
    m = ABORTED.search(line)
    return line[m.start():].strip() if m else ""


def with_log_said(result: TrialResult, log: Path, host: bool = True) -> TrialResult:
    """`with_said` from the log at `log` (oom_lines), read only where an oom `result`'s message lacks the sentence:
    a log can be GBs, and most OOM results carry their own."""
    if result.status != Status.OOM or oom_sentence(result.message) is not None:
        return result
    return with_said(result, oom_lines(log, host)[0])


def with_said(result: TrialResult, said: str | None) -> TrialResult:
    """An oom `result` whose message lacks PyTorch's out-of-memory sentence keeps the one its log `said`."""
    if result.status == Status.OOM and said and oom_sentence(result.message) is None:
        result.message = kept_message(f"{said} | {result.message}" if result.message else said, Status.OOM)
    return result
