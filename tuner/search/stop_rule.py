"""The guided searcher's stop rule: stop once no layout is likely to beat the recommended one.

After at least `min_trials` successful trials, stop when the probability that *some* layout beats the
recommended one (the fastest measured) by more than `threshold` is at most `probability` -- joint over
every layout, against the recommended layout's posterior (tuner/search/confidence.py, computed by the
searcher from its belief). `confidence` (1 minus that probability) and `reason` say how sure it is after
every check, whether or not stopping is on (`threshold` None: never stop). benchmarks/stop_calibration.py
checks the stated confidence against the realised false-stop rate on independent worlds. Pure.
"""

from __future__ import annotations

from typing import Callable


class StopRule:
    def __init__(self, threshold: float | None, probability: float, min_trials: int):
        self.threshold, self.probability, self.min_trials = threshold, probability, int(min_trials)
        self.confidence: float | None = None    # P(no layout beats the recommended one by > threshold)
        self.reason: str | None = None
        self.stopped = False
        self._checked: int | None = None

    def check(self, learned: int, n_ok: int, confidence: Callable[[], float], recommended: str) -> bool:
        """Update `confidence` (recomputed only when `learned`, the count of results that taught something,
        changed); True when stopping is on and no layout is likely to beat `recommended` (its description)."""
        if self._checked != learned:
            self._checked, self.confidence = learned, confidence()
        self.stopped = False
        if self.threshold is None or n_ok < self.min_trials or 1.0 - self.confidence > self.probability:
            return False
        self.stopped = True
        self.reason = (f"{100 * self.confidence:.1f} % confident that no layout trains more than "
                       f"{100 * self.threshold:g} % faster than {recommended}")
        return True
