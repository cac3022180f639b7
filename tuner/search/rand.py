"""Random search: a seeded permutation of the candidates, layouts deferred by failures moved last.

Deterministic: the next proposals depend only on the seed, the candidates and which layouts were
asked or told, so a restarted driver that replays its tells proposes what the first one would have.
"""

from __future__ import annotations

import numpy as np

from tuner.layout import Layout
from tuner.search.base import OrderedSearcher


class RandomSearcher(OrderedSearcher):
    name = "random"

    def __init__(self, candidates: list[Layout], *, seed: int = 0, **kw):
        n = len(set(candidates))
        order = np.random.default_rng([int(seed), 1]).permutation(n)
        super().__init__(candidates, order, seed=seed, **kw)
