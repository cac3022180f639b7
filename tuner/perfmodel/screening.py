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
A looser bound first (`floor_bound`: stage_floor's per-layer pieces instead of the slowest stage, with a wider
margin) orders them until a layout comes first; only then is its speed_bound asked and the layout put back in line
(DeepSeek-V3 on 128 H100 nodes: ~450 of its ~34,000 layouts that fit need their slowest stage).
"""

from __future__ import annotations

import functools
import heapq
import itertools
import math
import operator
from dataclasses import dataclass
from typing import NamedTuple

from tuner.layout import Layout, micro_batches_per_pipeline
from tuner.perfmodel import (PRUNE_BELOW, Prediction, _memo_shape, expected_speed, memory_fit, predict, rank_key,
                             slowest_stage)
from tuner.perfmodel.stages import stage_floor
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

    @functools.cached_property
    def may_fit(self) -> int:
        return sum(map(PRUNE_BELOW.__le__, map(operator.itemgetter(2), self.screened)))     # s.fits of each


def rank_shown(layouts: list[Layout], workload: Workload, top: int | None = None,
               show_all: bool = False) -> Ranking:
    """The first `top` (None: all) rows `plan` lists of `rank(layouts, workload)`: those the model cannot rule
    out, and with `show_all` the ruled-out ones after them; each layout's memory for the rest."""
    return assemble(layouts, workload, [screen_run(layouts, workload, top, 0, len(layouts))], top, show_all)


#: From this many layouts in a plan the memory of each of its runs is answered over columns (tuner.perfmodel.memory_batch,
#: with numpy, which costs ~0.1 s to import: what ~4,000 layouts cost one by one); below, memory_fit per layout.
BATCH_FROM = 5000
#: How many layouts of a run check memory_batch's answer against memory_fit's (any difference: memory_fit for all).
SAMPLE = 200


def screen_run(layouts: list[Layout], workload: Workload, top: int | None, lo: int, hi: int) -> tuple:
    """For layouts[lo:hi]: each one's peak memory and p_fit, and the first `top` (None: all) (position,
    Prediction) of those the model cannot rule out, in rank's order (ties in position order). Runs of one
    list may be screened apart (in processes: tuner.planning) and put together by `assemble`."""
    memo: dict = {}
    mems, p_fits, fitted = screen_memory(layouts, workload, lo, hi, memo)
    fits = [(i, p_fit) for i, p_fit in zip(range(lo, hi), p_fits) if p_fit >= PRUNE_BELOW]
    if top is None:
        fitting = [(i, predict(layouts[i], workload, memo=memo, fitted=fitted.get(i))) for i, _ in fits]
    else:
        fitting = reachable(layouts, workload, fits, top, memo, fitted)
    fitting.sort(key=lambda ip: rank_key(ip[1]))      # stable: ties in position order
    return mems, p_fits, fitting if top is None else fitting[:top]


def screen_memory(layouts: list[Layout], workload: Workload, lo: int, hi: int, memo: dict) -> tuple[list, list, dict]:
    """memory_fit's memory_gb and p_fit of layouts[lo:hi], and memory_fit's whole answer by position where it was
    asked: over columns in a plan of BATCH_FROM layouts or more (where memory_batch answers for the workload and its
    answers for an even sample of SAMPLE layouts of the run are memory_fit's), else one by one."""
    if len(layouts) >= BATCH_FROM:
        from tuner.perfmodel import memory_batch
        got = memory_batch.screen_memory(layouts[lo:hi], workload)
        if got is not None and all((got[0][i - lo], got[1][i - lo]) == _memory(layouts[i], workload, memo)
                                   for i in range(lo, hi, max(1, (hi - lo) // SAMPLE))):
            return (*got, {})
    fitted = {i: memory_fit(layouts[i], workload, memo) for i in range(lo, hi)}
    return [f[3]["total"] for f in fitted.values()], [f[4] for f in fitted.values()], fitted


def _memory(layout: Layout, workload: Workload, memo: dict) -> tuple[float, float]:
    fitted = memory_fit(layout, workload, memo)
    return fitted[3]["total"], fitted[4]


#: The upper bound's margin: the step's entries are summed one by one, the bound's m x stage at once.
BOUND_MARGIN = 1e-9


def speed_bound(layout: Layout, workload: Workload, p_fit: float, memo: dict) -> float:
    """An upper bound of the layout's expected speed (samples/s x p_fit, with memory_fit's p_fit) from its slowest
    stage alone."""
    m = micro_batches_per_pipeline(layout, workload.global_batch)
    floor = m * slowest_stage(layout, workload, _memo_shape(layout, workload, memo), None, memo)[1]
    return workload.global_batch / floor * p_fit * (1.0 + BOUND_MARGIN) if floor > 0 else math.inf


#: The floor's margin over speed_bound's: stage_floor sums per layer what the stage sums per entry.
FLOOR_MARGIN = 1e-6


def floor_bound(layout: Layout, workload: Workload, p_fit: float, memo: dict) -> float:
    """An upper bound of speed_bound (so of the expected speed) from stage_floor, a lower bound of the slowest stage
    that needs no stage's breakdown: a few times cheaper to ask."""
    key = ("floor", layout.tp, layout.sequence_parallel, layout.context_parallel, layout.pp, layout.virtual_pipeline,
           layout.pipeline_split, layout.dp, layout.expert_parallel, layout.expert_tensor_parallel, layout.micro_batch,
           layout.recompute, layout.offload_layers)       # what stage_times reads (not the ZeRO stage)
    floor = memo.get(key)
    if floor is None:
        floor = memo[key] = (micro_batches_per_pipeline(layout, workload.global_batch)
                             * stage_floor(layout, workload, _memo_shape(layout, workload, memo), memo))
    return workload.global_batch / floor * p_fit * (1.0 + FLOOR_MARGIN) if floor > 0 else math.inf


def reachable(layouts: list[Layout], workload: Workload, fits: list[tuple], top: int, memo: dict,
              fitted: dict | None = None) -> list[tuple]:
    """(position, Prediction) of every layout of `fits` ((position, p_fit), in position order) that may be among the
    first `top` of rank's order, in position order: taken in order of their bound -- floor_bound until a layout comes
    first, then its speed_bound, then its prediction -- until the bound is below the `top`-th expected speed
    predicted (the module's docstring says why that is exact: a bound above speed_bound leaves no layout that may
    reach the first rows unpredicted). `fitted`: memory_fit's answers by position, where known."""
    heap = [(-floor_bound(layouts[i], workload, p_fit, memo), i, p_fit, False) for i, p_fit in fits]
    heapq.heapify(heap)
    kept, best = [], []                  # best: a min-heap of the `top` highest expected speeds so far
    while heap:
        bound, i, p_fit, tight = heapq.heappop(heap)
        if len(best) == top and -bound < best[0]:
            break
        if not tight:                    # its speed_bound, a tighter one, goes back in line
            heapq.heappush(heap, (-speed_bound(layouts[i], workload, p_fit, memo), i, p_fit, True))
            continue
        p = predict(layouts[i], workload, memo=memo, fitted=(fitted or {}).get(i))
        kept.append((i, p))
        (heapq.heappush if len(best) < top else heapq.heappushpop)(best, expected_speed(p))
    kept.sort(key=lambda ip: ip[0])
    return kept


def assemble(layouts: list[Layout], workload: Workload, runs: list[tuple], top: int | None,
             show_all: bool) -> Ranking:
    """The Ranking of `layouts` from screen_run's answers for consecutive runs of it (all of it, in order): the
    rows merged by (rank's key, position), which is rank's stable order; the ruled-out layouts predicted here
    where `show_all` asks for more rows than fit."""
    screened = list(map(Screened._make, zip(layouts, itertools.chain.from_iterable(run[0] for run in runs),
                                            itertools.chain.from_iterable(run[1] for run in runs), strict=True)))
    shown = [p for _, p in heapq.merge(*(run[2] for run in runs), key=lambda ip: (rank_key(ip[1]), ip[0]))]
    if show_all and (top is None or len(shown) < top):
        memo: dict = {}
        shown += sorted((predict(s.layout, workload, memo=memo) for s in screened if not s.fits), key=rank_key)
    return Ranking(shown if top is None else shown[:top], screened)
