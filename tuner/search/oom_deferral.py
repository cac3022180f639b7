"""The guided searcher's OOM deferral: after an out-of-memory trial, what waits, and until when.

An OOM defers (tuner/search/base.py: proposed only once nothing else is left) every layout not yet run that the model
predicts to need at least as much memory on the same worst pipeline stage (Prediction.memory_stage) -- equal counts:
the model cannot tell such a layout from the one that ran out; once measured peaks explain the OOM, or a layout ran
with a measured peak at least the OOM'd one's predicted need (the GPU held that much: the OOM is that layout's own
error, not the usable memory's; issue 30 round 40), only those of its activation account
(tuner.oom_evidence.activation_account) and its memory twins (`deferred`: issue 30 round 34) --
until the memory learned from measured peaks puts it below every OOM'd layout that holds it; then expected
improvement weighs it by its p_fit like any other layout (issue 30 round 42: held until p_fit >= RECOMMEND_AT as
well, a Frontier 1T world's fastest, believed 8 % faster than the best measured at p_fit 0.85, waited the whole
budget). Below means by more than a GPU run's spread (RESOLUTION: the caching allocator's share and run-to-run noise,
one-sided 95 %, as tuner/oom_evidence reads a refutation), unless a measured ok peak at least as large as the layout's
predicted and learned peak shows that much fits; a layout predicted within that spread of an OOM'd one's and near it
in layout coordinates (within the correction's FAR_REACH) is its twin, which the learned peak sets apart by features
alone until a peak of the twin's own activation account is measured: till then it waits for such a measured peak
(issue 24 round 9: at 84.9 GB a selective-recompute twin of an OOM'd layout, the same predicted 57.82 GB, was let go
on a learned peak 0.5 % lower and ran out too; round 42: a measured pair without and with selective recompute 12 %
apart sets the twin apart by evidence). One as heavy but
unlike it (a pp-64 layout beside a pp-1 ZeRO-3 one) is the learned memory's to tell apart, and its p_fit's. Pure (numpy).
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np

from tuner.correction import FAR_REACH, layout_d2
from tuner.frameworks import ALLOCATOR_SD
from tuner.oom_evidence import Z95
from tuner.perfmodel import MEMORY_NOISE_SD

SAME_MEMORY = 1e-9         # relative: predicted peaks this close are equal (an OOM defers both)
RESOLUTION = Z95 * math.hypot(ALLOCATOR_SD, MEMORY_NOISE_SD)   # log: a GPU run's one-sided 95 % spread


class OomDeferral:
    """The layouts an OOM holds back, over candidates with predicted peaks `memory_gb` (GB, -inf where
    unknown) on worst stages `stage`, and log predicted memory `log_mem` at features `Z`, `FM`."""

    def __init__(self, memory_gb: np.ndarray, stage: np.ndarray, log_mem: np.ndarray, Z: np.ndarray,
                 FM: np.ndarray, account: np.ndarray | None = None):
        self.memory_gb, self.stage, self.log_mem, self.Z, self.FM = memory_gb, stage, log_mem, Z, FM
        self.account = np.zeros(len(memory_gb), dtype=int) if account is None else np.asarray(account, dtype=int)
        n = len(memory_gb)
        self.max_peak = -math.inf                    # log GB: the largest measured ok peak
        self.measured = set()                        # the activation accounts a measured ok peak speaks for
        self.heavier = np.zeros(n, dtype=bool)       # predicted to need as much as an OOM'd layout
        self.structural = np.zeros(n, dtype=bool)    # deferred by base.py's rule
        self.ooms: list[tuple] = []                  # each OOM's (worst stage, z, fm, log predicted memory, and whom
        #                                              it holds, its account's and its twins: after_oom)

    def note_base(self, deferred: np.ndarray) -> None:
        """Remember what base.py's rule (needs_more_memory) has deferred so far."""
        self.structural |= deferred & ~self.heavier

    def note_measured(self, peak_gb: float, account: int = -1) -> None:
        """A measured ok peak (GB) of a layout of activation account `account`: that much memory fit."""
        self.max_peak = max(self.max_peak, math.log(peak_gb))
        self.measured.add(account)

    def after_oom(self, memory_gb: float, stage: int, z, fm, log_mem: float, used: np.ndarray,
                  account: int = 0) -> np.ndarray:
        """After an OOM at a layout predicted to need `memory_gb` on pipeline stage `stage`, whose activations the
        model keeps by `account` (an id of tuner.oom_evidence.activation_account): every layout not yet run that is
        predicted to need at least as much there (deferred until `deferred` lets it go)."""
        heavier = ~used & (self.stage == stage) & (self.memory_gb >= memory_gb * (1 - SAME_MEMORY))
        twin = (self.log_mem <= log_mem + RESOLUTION) & self._near(np.asarray(z, float))
        kin = (self.account == account) | twin           # its account, or its memory twins
        self.ooms.append((stage, np.asarray(z, float), np.asarray(fm, float), log_mem, heavier, kin, twin))
        self.heavier |= heavier
        return heavier

    def _near(self, z: np.ndarray) -> np.ndarray:
        """The candidates within FAR_REACH of layout `z` in layout coordinates (tuner.correction: the reach of a
        measurement's support), where the learned memory cannot set a layout apart from it by evidence."""
        return layout_d2(self.Z, [z]) <= FAR_REACH ** 2

    def deferred(self, used: np.ndarray, peaks: Callable, stray: float,
                 log_capacity: float = math.inf) -> np.ndarray:
        """What stays deferred: base.py's deferrals, and the layouts predicted heavier than an OOM that holds them
        until the memory learned from measured peaks (`peaks()`: that correction, no OOM bound in it, and its (mean, sd)
        at every candidate) puts them below
        that OOM'd layout (the module's rule): the model's order of memory is only its own, and measured peaks that
        reorder it outweigh it; p_fit then weighs them. An OOM the measured peaks explain -- some peak strays
        from the model's account (`stray`, the largest |log(measured / predicted)|) by at least as much as the OOM'd
        layout's prediction lay under the capacity (`log_capacity`), so one account's error can explain it -- holds
        only its own activation account and its memory twins: the rest is left to p_fit, which the OOM lowers through
        the memory correction (issue 30 round 34: a ZeRO-0 layout's OOM, its state 1.17x the model's in the world as
        two measured ZeRO-0 peaks said, hid for the whole budget a layout without recompute whose peaks ran 0.9x the
        model's -- the world's fastest). One the peaks do not explain (none measured, or all closer to the model)
        speaks of what every layout shares, the GPU's usable memory, and holds every heavier layout -- until a layout
        runs with a measured peak at least the OOM'd one's predicted need: the GPU held that much (round 40). An OOM
        that does not hold a layout adds nothing to what keeps it (round 42)."""
        held = self.heavier & ~used
        if not held.any():
            return self.structural | held
        gp, (mean, _) = peaks()
        learned = self.log_mem + mean
        backed = self.max_peak >= np.maximum(self.log_mem, learned)    # a measured peak as large fit
        own = np.isin(self.account, list(self.measured))                # a peak of its own account measured
        holding = np.zeros(len(held), dtype=bool)
        for _, z, fm, log_mem, holds, kin, twin in self.ooms:
            unexplained = stray < log_capacity - log_mem and self.max_peak < log_mem
            bound = log_mem + gp.predict(z[None, :], fm[None, :])[0][0]
            clear = learned < bound - RESOLUTION                       # lighter by more than a run's spread
            let_go = (learned < bound + math.log1p(-SAME_MEMORY)) & (backed | clear & (~twin | own))
            holding |= holds & (kin | unexplained) & ~let_go
        return self.structural | (held & holding)
