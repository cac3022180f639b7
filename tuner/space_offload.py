"""Where a space leaves CPU activation offloading unnamed: each Megatron-Core layout that may run it (pp 1, recompute
none: tuner.offload) and does not surely fit (p_fit < SURELY_FITS) gets its offloaded twins, from the fewest layers of
OFFLOAD_SHARES that make it surely fit to the most; a layout that fits, or that no share rescues, gets none. So plan and
search propose offloading on a memory-bound machine and the space grows by the layouts it rescues alone. The twins
beyond the fewest are what a user runs when that one runs out of memory after all (a memory account off by more than
its spread): the fastest offloaded layout of an issue 30 world was one share beyond the one the model said rescued it
(docs/issue30.md, round 37). Pure."""

from __future__ import annotations

import dataclasses

from tuner.layout import Layout
from tuner.offload import offload_refusal
from tuner.specs import Workload

#: The shares of the layers tried, fewest first: NVIDIA's Megatron-Bridge recipes offload 20 and 40 of Llama 3 70B's
#: 80 layers (GB300 / GB200 FP8 Megatron-FSDP) and 92-95 of Llama 3.1 405B's 126 (perf_recipes/llama at 067f987df).
OFFLOAD_SHARES = (0.25, 0.5, 0.75)
#: The p_fit a layout must reach without offloading not to be given a twin, and its twin with it (plan's `fits`).
SURELY_FITS = 0.95
#: Where measured memory corrects the model: `best` at a node count nobody measured answers with the twins the model
#: alone did not give a layout once that layout surely does not fit by what was measured (p_fit below 1 - SURELY_FITS):
#: a twin always costs time, and the copies' hiding is the part of its prediction no published run checks; a layout
#: between the two bars is still listed, as the answer's faster-if-it-fits trial where it is the fastest (issue 30
#: round 38: an H100 world's layouts at p_fit 0.2-0.4, which ran at 80 of 80 GB, lost 5-16 % to their twins at 0.5).
RESCUE_BELOW = 1.0 - SURELY_FITS
#: A guided study releases such a twin from its reserve once the layout is likelier out of memory than not
#: (tuner.search.reserve): a trial, not an answer, decides there.
RELEASE_BELOW = 0.5


def offload_counts(num_layers: int) -> list[int]:
    """The offload_layers tried for a model of `num_layers` layers: each share, rounded, 1 .. layers - 1, once."""
    return sorted({min(num_layers - 1, max(1, round(s * num_layers))) for s in OFFLOAD_SHARES}) if num_layers > 1 else []


def with_offload(layouts: list[Layout], workload: Workload) -> list[Layout]:
    """`layouts` (in order) with each one's offloaded twins right after it, fewest layers first (the module's rule)."""
    if workload.framework != "megatron-core":
        return layouts
    counts = offload_counts(workload.model.num_layers)
    base = [lay for lay in layouts if _may_offload(lay)]
    if not counts or not base:
        return layouts
    memo: dict = {}                        # memory_fit's, shared by the layouts of the workload
    most = [_plain(t) for t in _twins(base, counts[-1:], workload, memo)]   # what the most layers cannot rescue, none can
    need = [lay for lay, p in zip(most, _p_fits(most, workload, memo)) if p < SURELY_FITS]
    twins: dict[Layout, list[Layout]] = {}
    for t in _twins(need, counts, workload, memo):   # every count that surely fits, in one batch: more layers hold less
        twins.setdefault(_plain(t), []).append(t)    # of the GPU's memory (from the fewest that rescue it up), more of
    if not twins:                                    # the host's (its bound, checked with the rest)
        return layouts
    out = []
    for lay in layouts:
        out.append(lay)
        if lay.pp == 1 and lay in twins:
            out.extend(twins[lay])
    return out


def unoffered_twins(space, layouts: list[Layout], workload: Workload) -> list[Layout]:
    """held_twins of `layouts` where `space` leaves offloading unnamed (its own rule then offers only some); none where
    the space names offload_layers (its values are the user's)."""
    return [] if "offload_layers" in space.dimensions else held_twins(layouts, workload)


def held_twins(layouts: list[Layout], workload: Workload) -> list[Layout]:
    """Each layout's offloaded twins at every count of offload_counts that Megatron-Core runs and that are not among
    `layouts`, whatever the model says they hold, fewest first: for a caller whose memory account is not the raw
    model's -- tuner.best at a node count nobody measured (its memory corrected by measured peaks and OOMs) and a
    guided study, which holds them back until the memory it measures says a layout needs one (tuner.search.reserve)."""
    if workload.framework != "megatron-core":
        return []
    have = set(layouts)
    return [t for t in _runnable(layouts, offload_counts(workload.model.num_layers), workload) if t not in have]


def _runnable(layouts: list[Layout], counts: list[int], workload: Workload) -> list[Layout]:
    """The twins of the layouts without offloading at pp 1 and recompute none, offloading each of `counts` layers,
    that Megatron-Core runs (tuner.offload.offload_refusal), each layout's fewest first."""
    tried = [dataclasses.replace(lay, offload_layers=n) for lay in layouts if _may_offload(lay) for n in counts]
    return [t for t in tried if offload_refusal(workload.framework, t, workload) is None]


def _may_offload(lay: Layout) -> bool:
    """A layout without offloading that Megatron-Core could run offloaded: pp 1, recompute none (tuner.offload)."""
    return lay.pp == 1 and lay.recompute == "none" and not lay.offload_layers


def _twins(layouts: list[Layout], counts: list[int], workload: Workload, memo: dict) -> list[Layout]:
    """The layouts' twins offloading each of `counts` layers that Megatron-Core runs and that surely fit, each layout's
    fewest first."""
    tried = _runnable(layouts, counts, workload)
    return [t for t, p in zip(tried, _p_fits(tried, workload, memo)) if p >= SURELY_FITS]


def _plain(lay: Layout) -> Layout:
    return dataclasses.replace(lay, offload_layers=0)


def _p_fits(layouts: list[Layout], workload: Workload, memo: dict) -> list[float]:
    """memory_fit's p_fit of each layout: over columns for many (memory_batch answers as memory_fit does)."""
    from tuner.perfmodel import memory_fit
    if len(layouts) >= 2000:
        from tuner.perfmodel import memory_batch
        got = memory_batch.screen_memory(layouts, workload)
        if got is not None:
            return got[1]
    return [memory_fit(lay, workload, memo)[4] for lay in layouts]
