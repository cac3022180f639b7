"""Megatron-Core's fresh memory batches (issue 24, benchmarks/draw_memory_batch.py --mcore): FRESH2 is re-drawn from its
seed by its own rule, and FRESH3, FRESH4 (round 8) and FRESH5 (round 9) hold no configuration measured or seen before them -- one
configuration is one row, another stage of a measured configuration included (published.split_key)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import draw_memory_batch as draw  # noqa: E402
import mcore_memory.configs as mcore  # noqa: E402
from published import held_out, split_key  # noqa: E402


def test_fresh2_is_its_seeds_draw():
    assert draw.mcore_draw(1350905612, 8, "fresh2") == mcore.FRESH2


@pytest.mark.parametrize("batch", ["fresh3", "fresh4", "fresh5"])
def test_a_fresh_batch_shares_no_configuration_with_any_earlier_batch(batch):
    key = lambda c: split_key(draw.mcore_split_row(c))      # noqa: E731
    earlier = {key(c) for c in draw.mcore_earlier(batch)}
    configs = getattr(mcore, batch.upper())
    fresh = [key(c) for c in configs]
    assert len(set(fresh)) == len(fresh) == 24
    assert not earlier & set(fresh)
    assert all(held_out(draw.mcore_split_row(c)) for c in configs)
