"""The model's predictions of a study's layouts, kept for the process.

A study asks the model about every layout of its space more than once: `create` checks that some may fit, and
every `run` (search, resume, `Study.optimize`) builds its guided searcher, which ranks them all again. The docs'
notebook (docs/library_example.py: two studies of one workload, created, optimized, resumed) asked 55,716 times
for its 9,279 layouts. `predict` is pure: its answer depends on the layout and the workload only (both frozen
dataclasses), so each is computed once, sharing `rank`'s memo, for the last KEEP workloads. A workload is known by
its repr, every field's value (a cluster's dict-valued keys leave it unhashable).

A kept prediction holds ~2.6 KB (its two breakdowns): at most MOST are kept, and a space larger than that is
predicted again each time, as before. Only the study's own calls come here (tuner.study); `predict` itself keeps
nothing, so a caller that swaps a part of the model (benchmarks/parallel_bounds.py) always reaches it.
`forget()` empties the cache. Studies may run in threads of one process (`Study.optimize` from two threads): the
cache's own bookkeeping is under one lock; the model's calls are not (two threads may predict one layout twice,
with the same answer)."""

from __future__ import annotations

import threading
from collections import OrderedDict

from tuner.perfmodel import predict

KEEP = 2            # workloads: a study's and one more (a multi-node search's next count, a notebook's other study)
MOST = 60_000       # predictions kept in all, ~160 MB (llama3-70b on 8 H100 nodes: 9,279 layouts; mixtral-8x7b 19,490)

_KEPT: OrderedDict = OrderedDict()      # repr(workload) -> (memo, {layout: Prediction}), oldest first
_LOCK = threading.Lock()


def predictions(layouts, workload) -> list:
    """predict(layout, workload) for each of `layouts`, in order; each computed once while its workload is kept."""
    key = repr(workload)
    with _LOCK:
        memo, known = _KEPT.get(key) or ({}, {})
    out = []
    for lay in layouts:
        p = known.get(lay)
        if p is None:
            p = known[lay] = predict(lay, workload, memo=memo)
        out.append(p)
    with _LOCK:
        _KEPT.pop(key, None)
        if len(known) <= MOST:
            _KEPT[key] = memo, known            # the newest
        while len(_KEPT) > KEEP or sum(len(k) for _, k in _KEPT.values()) > MOST:
            _KEPT.popitem(last=False)
    return out


def forget() -> None:
    """Drop every kept prediction (tests start from none)."""
    with _LOCK:
        _KEPT.clear()
