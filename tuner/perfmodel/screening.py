"""`plan`'s ranking without predicting what it never shows: every layout's memory (p_fit: what plan counts and
what `require_fit` reads), the step time only of those it may list.

Pure. `rank_shown` answers exactly as `rank` does -- the same Predictions in the same order for the rows shown,
the same counts -- because `rank`'s order puts every layout the model cannot rule out (p_fit >= PRUNE_BELOW)
before every one it rules out, and Python's sort is stable: sorting each group alone, in the given order, is
the full ranking cut in two. The layouts ruled out are predicted only when the rows asked for reach them
(`plan --all` with fewer fitting layouts than `--top`).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

from tuner.layout import Layout
from tuner.perfmodel import PRUNE_BELOW, Prediction, memory_fit, predict, rank_key
from tuner.specs import Workload


@dataclass(frozen=True)
class Screened:
    """A layout's memory answer alone: what `plan` counts and `require_fit` reads of every layout."""

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
    mems, p_fits, fitting = [], [], []
    for i in range(lo, hi):
        fitted = memory_fit(layouts[i], workload, memo)
        mems.append(fitted[3]["total"])
        p_fits.append(fitted[4])
        if fitted[4] >= PRUNE_BELOW:
            fitting.append((i, predict(layouts[i], workload, memo=memo, fitted=fitted)))
    fitting.sort(key=lambda ip: rank_key(ip[1]))
    return mems, p_fits, fitting if top is None else fitting[:top]


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
