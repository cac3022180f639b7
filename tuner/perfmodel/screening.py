"""`plan`'s ranking without predicting what it never shows: every layout's memory (p_fit: what plan counts and
what `require_fit` reads), the step time only of those it may list.

Pure. `rank_shown` answers exactly as `rank` does -- the same Predictions in the same order for the rows shown,
the same counts -- because `rank`'s order puts every layout the model cannot rule out (p_fit >= PRUNE_BELOW)
before every one it rules out, and Python's sort is stable: sorting each group alone, in the given order, is
the full ranking cut in two. The layouts ruled out are predicted only when the rows asked for reach them
(`plan --all` with fewer fitting layouts than `--top`).
"""

from __future__ import annotations

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
    memo: dict = {}
    screened, fitting = [], []
    for lay in layouts:
        fitted = memory_fit(lay, workload, memo)
        screened.append(Screened(lay, fitted[3]["total"], fitted[4]))
        if screened[-1].fits:
            fitting.append((lay, fitted))
    shown = sorted((predict(lay, workload, memo=memo, fitted=f) for lay, f in fitting), key=rank_key)
    if show_all and (top is None or len(shown) < top):
        shown += sorted((predict(s.layout, workload, memo=memo) for s in screened if not s.fits), key=rank_key)
    return Ranking(shown if top is None else shown[:top], screened)
