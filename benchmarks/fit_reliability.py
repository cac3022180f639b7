"""Whether `tuner best --nodes 2N`'s p_fit is a probability: its reliability over EVERY layout it weighs at 2N.

The search benchmarks (ext_search.py, search_efficiency.py) score the one layout `best --nodes 2N` answers after a
10-trial study at N, and that pick's stated p_fit against whether it ran: almost every pick states p_fit >= 0.95, so
those lines test the top bin only. Here every layout `best` weighs at 2N (tuner.best.unmeasured_rows: the model
corrected by the study's trials, memory by their peaks and OOMs) is paired with whether the world at 2N runs it, and
the pairs are binned by the stated p_fit: stated against realised per bin, and the Brier score.

The layouts of one world share one memory correction, so their outcomes are not independent: each bin says over
how many worlds (world, seed) its layouts spread, and its realised rate twice -- over its layouts, and as the mean of
each world's own rate in the bin (every world counted once).
"""

from __future__ import annotations

import dataclasses
import statistics

from tuner.best import fastest_unmeasured, unmeasured_rows
from tuner.layout import Layout
from tuner.trial import Status

BINS = ((0.0, 0.02), (0.02, 0.1), (0.1, 0.3), (0.3, 0.5), (0.5, 0.7), (0.7, 0.9), (0.9, 0.95), (0.95, 0.99),
        (0.99, 0.999), (0.999, 1.0001))


def without_offload(space):
    """`space` with CPU activation offloading pinned off (offload_layers [0]: a dimension the space names is its own
    choice, tuner.space.valid_layouts). The independent worlds (search_efficiency.py) have no offloading physics --
    they charge an offloaded layout as if it kept every activation on the GPU -- and the layouts they enumerate at N
    have none, but `best` at 2N adds an offloaded twin where it rescues a Megatron-Core layout: on the Llama 3 70B
    worlds of `--modern` they were picked and ran out of memory. A benchmark asks its worlds only what their physics
    can answer. (The ext worlds have offloading physics: benchmarks/worlds_ext/step.py offload_s.)"""
    return dataclasses.replace(space, dimensions={**space.dimensions, "offload_layers": [0]})


def best_at(workload, space, trials, studies, runs=None, fraction=None) -> dict:
    """`tuner best`'s answer for `workload` (a node count the study did not measure) after `trials` (of `studies`),
    as best_for_unmeasured gives it; with `runs(layout)` (whether the world there runs a layout), its "fit_pairs":
    (stated p_fit, ran) of every layout `best` weighs there; with `fraction(layout)` (its true speed / the fastest
    there, 0 where it does not run), its "bound" (rule_bound). The rows are worked out once for all."""
    weighed = unmeasured_rows(workload, space, trials, studies)
    answer = fastest_unmeasured(weighed, space, 1, studies)[0]
    if runs is not None:
        answer["fit_pairs"] = [(float(r["p_fit"]), bool(runs(r["layout"]))) for r in weighed[0]]
    if fraction is not None:
        answer["bound"] = rule_bound(weighed[0], fraction)
    return answer


#: Issue 30's targets, per world: the guided searcher after 10 trials, median / worst seed; `best --nodes 2N`, median.
TARGET, WORST, TRANSFER_TARGET = 0.97, 0.93, 0.95


def verdict(rows: list[tuple[str, list[float], list[float] | None]], trials: int = 10) -> str:
    """The targets' count over the worlds `rows` = (label, guided's fractions after `trials` over the seeds, the 2N
    answers' fractions or None): how many meet each, and which miss with their figures -- read off the tables, not
    left to whoever quotes them."""
    guided = [(lab, statistics.median(g), min(g)) for lab, g, _ in rows]
    miss = [f"{lab} {m:.3f} / {w:.3f}" for lab, m, w in guided if m < TARGET or w < WORST]
    out = (f"targets (issue 30): guided after {trials} meets {TARGET} / {WORST} (median / worst) on "
           f"{len(rows) - len(miss)} of {len(rows)} worlds" + (f" (misses: {'; '.join(miss)})" if miss else ""))
    moved = [(lab, statistics.median(t)) for lab, _, t in rows if t]
    if moved:
        low = [f"{lab} {m:.3f}" for lab, m in moved if m < TRANSFER_TARGET]
        out += (f"\n                    `best --nodes 2N` median >= {TRANSFER_TARGET} on {len(moved) - len(low)} of "
                f"{len(moved)}" + (f" (misses: {'; '.join(low)})" if low else ""))
    return out


#: What the two bounds the search benchmarks print beside guided and `best --nodes 2N` (ext_search.py,
#: search_efficiency.py) say.
BOUNDS_NOTE = ("bounds: 'ran, fastest' is the truly fastest trial the guided study ran (no choice among its "
               "measurements does better: below it, the search; between it and guided's recommendation, the noise); "
               "'2N, bound' the "
               "truly fastest layout of those `best` answers from at 2N (the ones that keep the memory headroom: "
               "fit_reliability.rule_bound; below it, the memory rule and the stated p_fit; between it and the answer, "
               "the ranking)")


def measured_ok(trials: list, k: int) -> list:
    """Of the first k trials, those that ran ok with a measured speed: what a recommendation is chosen from."""
    return [t for t in trials[:k] if t.status == Status.OK and t.samples_per_second]


def rule_bound(rows: list[dict], fraction) -> float:
    """The truly fastest (`fraction`) of the rows `best`'s rule answers from (tuner.best.fastest_unmeasured): those that
    keep the memory headroom (p_fit >= RECOMMEND_AT), else those likely to fit (p_fit >= 0.5). No ranking of those rows
    can answer better: what is left below it is the memory rule's and the stated p_fit's, not the ranking's."""
    pool = [r for r in rows if r["headroom_ok"]] or [r for r in rows if r["p_fit"] >= 0.5]
    return max((fraction(r["layout"]) for r in pool), default=0.0)


def reliability(worlds: list[list[tuple[float, bool]]]) -> list[tuple]:
    """Per bin of stated p_fit: (lo, hi, layouts, worlds, mean stated, realised over layouts, realised per world)."""
    out = []
    for lo, hi in BINS:
        per = [[ran for p, ran in pairs if lo <= p < hi] for pairs in worlds]
        per = [w for w in per if w]
        got = [(p, ran) for pairs in worlds for p, ran in pairs if lo <= p < hi]
        if got:
            out.append((lo, min(hi, 1.0), len(got), len(per), statistics.fmean(p for p, _ in got),
                        statistics.fmean(ran for _, ran in got), statistics.fmean(statistics.fmean(w) for w in per)))
    return out


def brier(worlds: list[list[tuple[float, bool]]]) -> float:
    """The Brier score of the stated p_fit over every pair (0: certain and right)."""
    pairs = [pr for w in worlds for pr in w]
    return statistics.fmean((p - ran) ** 2 for p, ran in pairs) if pairs else float("nan")


def print_reliability(worlds: list[list[tuple[float, bool]]]) -> None:
    """The table: stated p_fit against the realised fit rate at 2N, per bin, and the Brier score."""
    worlds = [w for w in worlds if w]
    if not worlds:
        return
    print(f"\n`best --nodes 2N`'s p_fit over every layout it weighs at 2N ({sum(map(len, worlds))} layouts of "
          f"{len(worlds)} world(s)): stated / realised fit rate; Brier score {brier(worlds):.4f}")
    print(f"{'stated p_fit':>16} {'layouts':>8} {'worlds':>6} {'stated':>7} {'realised':>8} {'per world':>9}")
    for lo, hi, n, nw, stated, realised, per_world in reliability(worlds):
        print(f"{f'[{lo:.3f}, {hi:.3f})':>16} {n:8d} {nw:6d} {stated:7.3f} {realised:8.3f} {per_world:9.3f}")


def riskier(answer: dict, fraction) -> dict:
    """{"riskier": (stated p_fit, fraction(layout))} of the answer's faster-if-it-fits layout (tuner.best), `fraction`
    its true speed / the fastest at 2N (0 where it does not run); {} where the answer names none."""
    named = answer.get("faster_if_it_fits")
    return {} if named is None else {"riskier": (named["p_fit"], fraction(Layout.from_dict(named["layout"])))}


def print_riskier(picks: list[dict]) -> None:
    """`best`'s "faster if it fits" line over the worlds (each pick's "riskier": (stated p_fit, its true speed / the 2N
    fastest, 0 where it does not run), beside "transfer", the answer's): how often it is offered, how often it runs
    against the p_fit it states, and `best` plus that one trial (keep the faster of the two that ran) against `best`
    alone, median / worst over every world."""
    if not picks:
        return
    offered = [r for r in picks if "riskier" in r]
    alone = [r["transfer"] for r in picks]
    one_trial = [max(r["transfer"], r["riskier"][1]) if "riskier" in r else r["transfer"] for r in picks]
    ran = [r for r in offered if r["riskier"][1] > 0]
    stated = f"stated p_fit mean {statistics.fmean(r['riskier'][0] for r in offered):.3f}, " if offered else ""
    print(f"`best`'s faster-if-it-fits layout: offered in {len(offered)} of {len(picks)} worlds ({stated}ran in "
          f"{len(ran)}, faster than the answer in {sum(r['riskier'][1] > r['transfer'] for r in ran)}); `best` alone "
          f"{statistics.median(alone):.3f} / {min(alone):.3f}, with that one trial {statistics.median(one_trial):.3f} / "
          f"{min(one_trial):.3f} (median / worst)")
