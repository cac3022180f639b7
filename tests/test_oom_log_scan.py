"""oom_lines reads a whole failed trial's stderr / Slurm log (task F, 7682d74), which can be GBs: it must hold a
bounded part of it at once -- also where a progress bar writes one '\\r'-separated line for the whole run (tqdm's
default on stderr), which the line-by-line reader took in whole (a 338 MB bar line: 2.6 GB resident, 10 s) -- and
find the same lines wherever a block boundary falls."""

from __future__ import annotations

import tracemalloc

import pytest

from tests.test_oom_runners import ACCELERATE, QWEN, crash_log
from tuner.runners import failure_log
from tuner.runners.failure_log import oom_lines

BAR = "\r 45%|####5     | 4500/10000 [01:23<01:42, 53.7it/s, loss=2.31, memory=41.2GB]"   # tqdm, with a postfix


def test_a_progress_bar_line_of_tens_of_mb_is_read_in_bounded_memory(tmp_path):
    log = tmp_path / "stderr.log"
    with open(log, "w") as f:
        f.write(BAR * (48_000_000 // len(BAR)))          # one line of 48 MB, naming memory every 80 bytes
        f.write("\n[rank3]: Traceback (most recent call last):\n[rank3]: " + QWEN + "\n")
    tracemalloc.start()
    try:
        found = oom_lines(log)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert found == (QWEN, QWEN)
    assert peak < 16e6, f"held {peak / 1e6:.0f} MB of a 48 MB log"


@pytest.mark.parametrize("block", [7, 64, 1000])
def test_block_boundaries_anywhere_find_the_same_lines(tmp_path, monkeypatch, block):
    monkeypatch.setattr(failure_log, "BLOCK_BYTES", block, raising=False)   # HEAD~: no blocks
    monkeypatch.setattr(failure_log, "LINE_BYTES", 4096, raising=False)
    log = tmp_path / "stderr.log"
    log.write_text("[gpu187:1]:" + ACCELERATE + "\n" + crash_log("[rank3]: " + QWEN, after_bytes=3_000))
    assert oom_lines(log) == (QWEN, ACCELERATE)
    log.write_text(BAR * 200 + "\rRuntimeError: CUDA error: out of memory\r" + BAR * 200)
    assert oom_lines(log) == (None, "RuntimeError: CUDA error: out of memory")


def test_a_long_run_of_word_characters_beside_a_marker_reads_as_before(tmp_path):
    # e92b908's first RAISED pattern began with the error type's name and backtracked quadratically on such a run
    # (16 kB of 'a.': 8.6 s per line); failure_log.raised reads the name back instead (a guard: no clock asserted)
    log = tmp_path / "stderr.log"
    log.write_text("a." * 8000 + " out of memory\n" + "a" * 16000 + " out of memory\n"
                   + "[1,3]<stderr>:" + "x" * 9000 + ".OutOfMemoryError: CUDA out of memory. Tried\n")
    assert oom_lines(log) == (None, "x" * 9000 + ".OutOfMemoryError: CUDA out of memory. Tried")
