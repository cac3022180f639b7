"""Grid search: every candidate in a fixed order, layouts deferred by failures moved last.

The order walks the (tp, pp) grid from the least to the most model-parallel layout and, inside one
(tp, pp), from the most memory-frugal layout (small micro-batch, checkpointing on, high ZeRO stage)
towards the most memory-hungry, as DeepSpeed's autotuner grows the micro-batch: the first OOM in a
group defers every sibling that needs at least as much memory.
"""

from __future__ import annotations

import numpy as np

from tuner.layout import RECOMPUTE, Layout
from tuner.search.base import OrderedSearcher


def grid_key(lay: Layout) -> tuple:
    return (lay.tp * lay.context_parallel * lay.pp, lay.tp, lay.context_parallel, lay.pp, lay.virtual_pipeline,
            not lay.sequence_parallel, lay.micro_batch, -RECOMPUTE.index(lay.recompute), -lay.zero_stage)


class GridSearcher(OrderedSearcher):
    name = "grid"

    def __init__(self, candidates: list[Layout], *, seed: int = 0, **kw):
        ordered = sorted(set(candidates))
        order = np.array(sorted(range(len(ordered)), key=lambda i: grid_key(ordered[i])), dtype=int)
        super().__init__(ordered, order, seed=seed, **kw)
