"""`plan`'s ranking without predicting what it never shows: every layout's memory (p_fit: what plan counts and
what `require_fit` reads), the step time only of those it may list.

Pure. `rank_shown` answers exactly as `rank` does -- the same Predictions in the same order for the rows shown,
the same counts -- because `rank`'s order puts every layout the model cannot rule out (p_fit >= PRUNE_BELOW)
before every one it rules out, and Python's sort is stable: sorting each group alone, in the given order, is
the full ranking cut in two. The layouts ruled out are predicted only when the rows asked for reach them
(`plan --all` with fewer fitting layouts than `--top`).

With a `top`, a layout that fits is predicted whole only while it may still reach the first `top` rows: a step is
never shorter than m micro-batches of its slowest stage (the stage the step waits for runs m of its own, at
least as long as the slowest stage's, and every other entry -- bubble, exposed gradient sync, optimizer -- is
>= 0), so global_batch / (m x slowest stage) x p_fit bounds its expected speed from above (`speed_bound`, with
a margin for rounding). The layouts are taken in order of that bound and the rest left once the bound falls
below the `top`-th expected speed found: each of them would rank below `top` others, by expected speed alone.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from typing import NamedTuple

from tuner.layout import Layout
from tuner.perfmodel import PRUNE_BELOW, Prediction, expected_speed, memory_fit, predict, rank_key, slowest_stage
from tuner.specs import Workload


class Screened(NamedTuple):
    """A layout's memory answer alone: what `plan` counts and `require_fit` reads of every layout (a named tuple:
    plan makes one for each of up to ~150,000 layouts, several times faster than a frozen dataclass)."""

    layout: Layout
    memory_gb: float
    p_fit: float

    @property
    def fits(self) -> bool:
        return self.p_fit >= PRUNE_BELOW


@dataclass(frozen=True)
class Ranking:
    """`shown`: the first `top` Predictions of `rank` (those it cannot rule out, or all with show_all);
    `screened`: every layout's memory answer, in the order given."""

    shown: list[Prediction]
    screened: list[Screened]

    @property
    def may_fit(self) -> int:
        return sum(s.fits for s in self.screened)


def rank_shown(layouts: list[Layout], workload: Workload, top: int | None = None,
               show_all: bool = False) -> Ranking:
    """The first `top` (None: all) rows `plan` lists of `rank(layouts, workload)`: those the model cannot rule
    out, and with `show_all` the ruled-out ones after them; each layout's memory for the rest."""
    return assemble(layouts, workload, [screen_run(layouts, workload, top, 0, len(layouts))], top, show_all)


def screen_run(layouts: list[Layout], workload: Workload, top: int | None, lo: int, hi: int) -> tuple:
    """For layouts[lo:hi]: each one's peak memory and p_fit, and the first `top` (None: all) (position,
    Prediction) of those the model cannot rule out, in rank's order (ties in position order). Runs of one
    list may be screened apart (in processes: tuner.planning) and put together by `assemble`."""
    memo: dict = {}
    mems, p_fits, fits = [], [], []
    for i in range(lo, hi):
        fitted = memory_fit(layouts[i], workload, memo)
        mems.append(fitted[3]["total"])
        p_fits.append(fitted[4])
        if fitted[4] >= PRUNE_BELOW:
            fits.append((i, fitted))
    if top is None:
        fitting = [(i, predict(layouts[i], workload, memo=memo, fitted=f)) for i, f in fits]
    else:
        fitting = reachable(layouts, workload, fits, top, memo)
    fitting.sort(key=lambda ip: rank_key(ip[1]))      # stable: ties in position order
    return mems, p_fits, fitting if top is None else fitting[:top]


#: The upper bound's margin: the step's entries are summed one by one, the bound's m x stage at once.
BOUND_MARGIN = 1e-9


def speed_bound(layout: Layout, workload: Workload, fitted: tuple, memo: dict) -> float:
    """An upper bound of the layout's expected speed (samples/s x p_fit) from its slowest stage alone."""
    m, sh, p_fit = fitted[0], fitted[1], fitted[4]
    floor = m * slowest_stage(layout, workload, sh, None, memo)[1]
    return workload.global_batch / floor * p_fit * (1.0 + BOUND_MARGIN) if floor > 0 else math.inf


def reachable(layouts: list[Layout], workload: Workload, fits: list[tuple], top: int, memo: dict) -> list[tuple]:
    """(position, Prediction) of every layout of `fits` ((position, memory_fit's answer), in position order) that
    may be among the first `top` of rank's order, in position order: predicted in order of speed_bound until the
    bound is below the `top`-th expected speed predicted (the module's docstring says why that is exact)."""
    bounded = sorted(((speed_bound(layouts[i], workload, f, memo), i, f) for i, f in fits), key=lambda b: -b[0])
    kept, best = [], []                  # best: a min-heap of the `top` highest expected speeds so far
    for bound, i, f in bounded:
        if len(best) == top and bound < best[0]:
            break
        p = predict(layouts[i], workload, memo=memo, fitted=f)
        kept.append((i, p))
        (heapq.heappush if len(best) < top else heapq.heappushpop)(best, expected_speed(p))
    kept.sort(key=lambda ip: ip[0])
    return kept


def assemble(layouts: list[Layout], workload: Workload, runs: list[tuple], top: int | None,
             show_all: bool) -> Ranking:
    """The Ranking of `layouts` from screen_run's answers for consecutive runs of it (all of it, in order): the
    rows merged by (rank's key, position), which is rank's stable order; the ruled-out layouts predicted here
    where `show_all` asks for more rows than fit."""
    screened = [Screened(lay, mem, p_fit) for lay, mem, p_fit in
                zip(layouts, (m for run in runs for m in run[0]), (f for run in runs for f in run[1]), strict=True)]
    shown = [p for _, p in heapq.merge(*(run[2] for run in runs), key=lambda ip: (rank_key(ip[1]), ip[0]))]
    if show_all and (top is None or len(shown) < top):
        memo: dict = {}
        shown += sorted((predict(s.layout, workload, memo=memo) for s in screened if not s.fits), key=rank_key)
    return Ranking(shown if top is None else shown[:top], screened)
