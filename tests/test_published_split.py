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


def test_a_row_added_after_every_speed_choice_is_seen_by_none():
    """A speed choice saw the rows of its time (published._saw): a copy of every row, tagged with a batch added after
    every choice, is seen by no speed choice of SEEN or HARDWARE_SEEN -- where 'not added by round 5' or 'not after
    the Blackwell GEMM curve' read the tag, the next batch was counted as seen by choices made before it."""
    later = "issue 99 round 1 (a batch added after every choice)"
    for table, rows in ((P.SEEN, P.published() + P.measured()), (P.HARDWARE_SEEN, P.hardware())):
        speed = {name: pred for name, (kind, pred) in table.items() if kind == "speed"}
        caught = {name for name, pred in speed.items() for r in rows if pred(r)}
        assert caught == set(speed)                       # each choice's copies below stand for rows it does catch
        assert not [name for name, pred in speed.items() for r in rows if pred({**r, "added": later})]


def test_every_added_row_names_a_batch_in_the_order_of_the_choices():
    """A row's `added` starts with one of published.BATCHES (append a new batch there): a batch the list lacks is
    taken as later than every choice, so an older row whose tag is misspelt would be counted as unseen."""
    rows = P._load(P.PUBLISHED + P.MEASURED + P.HARDWARE)
    assert [r["added"][:40] for r in rows if "added" in r and not r["added"].startswith(P.BATCHES)] == []
    first, last = P.BATCHES[0], P.BATCHES[-1]
    assert P._saw({}, None) and not P._saw({"added": first + "x"}, None)
    assert P._saw({"added": first + "x"}, last) and not P._saw({"added": last + "x"}, first)
