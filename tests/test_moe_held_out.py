"""benchmarks/moe_accuracy.py's HELD OUT line (issue 25 round 5, c58e396): it counts only published.clean rows --
hashed out AND seen by no speed choice --, never a hashed-out row that some choice saw (before, its 'held-out'
line held every hashed-out row, 13 of 13 seen)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import moe_accuracy  # noqa: E402


def _clean_row(rows: list[dict]) -> dict:
    """A hashed-out row no speed choice saw, for when the data holds none (since 9c8d949 every MoE row is seen): the
    first row on A100 (no Hopper-class cluster: the attention study's entry does not name it), of a batch
    published.BATCHES does not list (so no choice saw it), its global batch moved until the hash holds it out."""
    P = moe_accuracy.published
    base = {**rows[0], "cluster": "a100", "added": "synthetic row of tests/test_moe_held_out.py"}
    return next(r for gb in range(base["global_batch"] + 1, base["global_batch"] + 200)
                if P.clean(r := {**base, "global_batch": gb}, "speed"))


def test_the_held_out_line_holds_the_clean_rows_only(monkeypatch):
    P = moe_accuracy.published
    rows = moe_accuracy.load_rows()
    if not any(P.clean(r, "speed") for r in rows):
        rows.append(_clean_row(rows))
    position = {id(r): i for i, r in enumerate(rows)}       # each row's stub error: its position (no prediction)
    monkeypatch.setattr(moe_accuracy, "load_rows", lambda: rows)
    monkeypatch.setattr(moe_accuracy, "evaluate", lambda r: {
        "refused": None, "layout": None, "error": float(position[id(r)]), "pred": 0.0, "p_fit": 1.0,
        "memory_gb": 0.0, "a2a_s": 0.0, "step_s": 1.0})
    clean = [float(i) for i, r in enumerate(rows) if P.clean(r, "speed")]
    seen = [i for i, r in enumerate(rows) if P.held_out(r) and not P.clean(r, "speed")]
    assert clean and seen                  # both kinds are in the data: the line has rows to leave out
    assert moe_accuracy.main()["held_out"] == clean
