"""p_fit's two sources (issue 24 round 4): the account's error on allocated bytes and the caching allocator's share,
each stated with where it was measured, and the allocator's constants are the ones its benchmark chooses."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

from tuner import frameworks
from tuner.frameworks import ALLOCATOR_BIAS, ALLOCATOR_N, ALLOCATOR_SD
from tuner.perfmodel import account_sd, fit_probability, gpu_fit_probability, memory_prior_sd

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import allocator_share  # noqa: E402


def test_the_stated_allocator_constants_are_what_the_benchmark_chooses_on_its_rows():
    rows = allocator_share.load()
    chosen = [r for r in rows if allocator_share.chosen_on(r)]
    centre, sd, _ = allocator_share.choose(chosen)
    assert len(chosen) == ALLOCATOR_N and ALLOCATOR_SD == pytest.approx(sd, abs=5e-4)
    assert ALLOCATOR_BIAS == pytest.approx(allocator_share.reserve_check(chosen, centre), abs=5e-4)
    assert all(not allocator_share.held_out(r) and r["kind"] == "oom" for r in chosen)   # never a held-out row


def test_the_stated_tail_is_what_the_benchmark_chooses_on_the_same_rows():
    """ALLOCATOR_TAIL_WEIGHT / ALLOCATOR_TAIL_SD (issue 30): the share of the chosen rows beyond +3 sd and their root mean
    square, on the rows ALLOCATOR_SD was chosen on -- two fragmented runs, not a number picked for a benchmark."""
    rows = allocator_share.load()
    chosen = [r for r in rows if allocator_share.chosen_on(r)]
    centre, sd, _ = allocator_share.choose(chosen)
    weight, tail_sd = allocator_share.tail(chosen, centre, sd)
    assert weight == pytest.approx(frameworks.ALLOCATOR_TAIL_WEIGHT, abs=5e-4) and weight > 0
    assert tail_sd == pytest.approx(frameworks.ALLOCATOR_TAIL_SD, abs=5e-4) and tail_sd > 5 * sd


def test_a_gpu_p_fit_adds_the_allocators_share_to_the_accounts_spread():
    shares = [0.3, 0.3, 0.2, 0.0, 0.2, 0.0, 0.0, 0.0, 0.0]
    for fw in frameworks.FRAMEWORKS.values():
        acc = account_sd(fw.memory_sd, shares)
        assert memory_prior_sd(fw.memory_sd, shares) == pytest.approx(math.hypot(acc, ALLOCATOR_SD))
        assert acc < memory_prior_sd(fw.memory_sd, shares)
        for mem in (60.0, 79.0, 80.0, 81.0):
            assert gpu_fit_probability(mem, 80.0, acc) == pytest.approx(
                fit_probability(mem, 80.0, memory_prior_sd(fw.memory_sd, shares), ALLOCATOR_BIAS))
    assert gpu_fit_probability(80.0, 80.0, 0.01) == pytest.approx(0.5)     # no bias on top: half at the capacity


@pytest.mark.parametrize("name", ["megatron-core", "torchtitan", "megatron-deepspeed"])
def test_every_memory_note_names_both_sources_and_whether_each_was_measured(name):
    fw = frameworks.FRAMEWORKS[name]
    note = fw.memory_note()
    assert note.startswith(f"{name}'s memory error measured on") == bool(fw.memory_n)
    assert ("ASSUMED" in note) == (not fw.memory_n)
    assert f"caching allocator's share measured on {ALLOCATOR_N} " in note and f"sd {ALLOCATOR_SD:.4f}" in note
