"""Offloaded twins a guided study holds back until what it measures says they are needed (issue 30 round 38).

A space that leaves CPU activation offloading unnamed gives a Megatron-Core layout its offloaded twins only where the
model alone says the layout may not fit (tuner.space_offload). Where the model holds too little (an issue 30 world
whose allocator keeps a third more than the account: a layout predicted at 47 GB of 64 ran out of memory at 62), the
twin that rescues the layout is what a user runs next -- and a searcher cannot add candidates during a study. So the
study hands the guided searcher every other twin as a reserve: held (never proposed, never counted) while the plain
layout is likelier to fit than not by the memory the searcher has learned, released once its p_fit falls below one half
(space_offload.RELEASE_BELOW), from then on a candidate like any other. Pure.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from tuner.layout import Layout
from tuner.space_offload import RELEASE_BELOW


class Reserve:
    """Which of a searcher's `candidates` are held twins (`held`), and each one's plain layout's index (`plain`)."""

    def __init__(self, candidates: list[Layout], reserve) -> None:
        index = {c: i for i, c in enumerate(candidates)}
        reserve = set(reserve)
        self.plain = np.array([index.get(replace(c, offload_layers=0), -1) if c in reserve else -1
                               for c in candidates], dtype=int)
        self.held = self.plain >= 0

    def release(self, p_fit: np.ndarray) -> np.ndarray:
        """The indices of the held twins whose plain layout is now likelier out of memory than not by `p_fit` (each
        candidate's), no longer held."""
        go = np.flatnonzero(self.held)
        go = go[p_fit[self.plain[go]] < RELEASE_BELOW]
        self.held[go] = False
        return go
