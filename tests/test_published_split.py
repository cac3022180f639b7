"""The held-out split of the benchmarks' rows (benchmarks/published.py): one configuration is one row
across every data file, the split hashes the configuration (never its source or line), and the committed
list benchmarks/data/held_out.txt is what the rule gives."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("published", ROOT / "benchmarks" / "published.py")
P = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(P)


def test_the_committed_held_out_list_is_the_rule():
    lines = [x for x in P.HELD_OUT_FILE.read_text().splitlines() if x and not x.startswith("#")]
    assert lines == P.held_out_lines()
    assert len(lines) >= 40


def test_one_configuration_is_one_row_across_files():
    raw = P._load(P.PUBLISHED)
    rows = P.published()
    assert len({P.config_key(r) for r in rows}) == len(rows) < len(raw)
    both = [r for r in rows if len(r["files"]) > 1]
    assert both, "torchtitan's tables sit in two files: they must merge into one row each"
    assert all(r["measurements"] >= 2 for r in both)


def test_the_split_ignores_source_release_and_file():
    row = next(r for r in P._load(P.PUBLISHED) if r["framework"] == "torchtitan")
    moved = {**row, "source": "elsewhere @ 0000", "release": "another release", "file": "other.toml"}
    assert P.held_out(moved) == P.held_out(row)
    other = {**row, "micro_batch": row["micro_batch"] + 1}
    assert P.config_key(other) != P.config_key(row)
    stage = {**row, "stage": 3}      # another stage of one run lands on the same side
    assert P.held_out(stage) == P.held_out(row) and P.config_key(stage) != P.config_key(row)


def test_every_choice_names_what_it_changes():
    assert all(kind in ("speed", "memory") for kind, _ in P.SEEN.values())
    rows = P.published()
    assert all(not P.clean(r) for r in rows if not P.held_out(r))


def test_a_row_whose_configuration_a_choice_saw_is_not_clean():
    """Two measurements of one configuration (another stage, another loss) are one row for the split: when a
    choice saw one of them, the other is not held out either (the fresh memory batches had 8 such rows)."""
    for kind in ("memory", "speed"):
        seen = P._seen_configurations(kind)
        rows = P.published() + P.measured()
        twins = [r for r in rows if P.held_out(r) and not P.seen_by(r, kind) and P.split_key(r) in seen]
        assert all(not P.clean(r, kind) for r in twins)
    mem = [r for r in P.measured() if P.held_out(r) and not P.seen_by(r, "memory")]
    assert any(P.split_key(r) in P._seen_configurations("memory") for r in mem), "no such twin left: test is idle"
