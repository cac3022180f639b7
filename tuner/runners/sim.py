"""The simulator runner: the performance model's prediction as the measurement.

Seeded noise is drawn from (seed, layout), so a resumed study sees the same numbers as an
uninterrupted one. A layout the memory model says cannot fit comes back as OOM. Its peak memory is what every
runner reports (tuner.perfmodel.fit.measured_need_gb): the allocated bytes, the predicted peak less the cluster's
fixed reserve.
"""

from __future__ import annotations

import hashlib
import random
import threading

from tuner.perfmodel import predict
from tuner.runners import CPU_FRACTION, TrialRunner
from tuner.trial import SIMULATED, Status, TrialResult, TrialSpec


class SimRunner(TrialRunner):
    name = SIMULATED[0]
    measured = False

    def __init__(self, noise: float = 0.0, delay: float = 0.0, seed: int = 0):
        if noise < 0 or delay < 0:
            raise ValueError("noise and delay must be >= 0")
        self.noise, self.delay, self.seed = noise, delay, seed
        self._stop = threading.Event()

    def _factor(self, key: str) -> float:
        if not self.noise:
            return 1.0
        digest = hashlib.sha256(f"{self.seed}:{key}".encode()).digest()
        return max(0.05, 1.0 + random.Random(digest).gauss(0.0, self.noise))

    def run(self, trial: TrialSpec) -> TrialResult:
        if self.delay and self._stop.wait(self.delay):
            return TrialResult(Status.INTERRUPTED, message="cancelled")
        p = predict(trial.layout, trial.workload)
        if p.memory_gb > trial.workload.cluster.memory_gb:      # the simulated world: the model's point estimate
            return TrialResult(Status.OOM, peak_memory_gb=p.memory_gb, message=f"simulated OOM: {p.reason}")
        f = self._factor(trial.layout.key())
        allocated = p.memory_gb - trial.workload.cluster.memory_reserved_gb   # what a GPU run's peak reports
        return TrialResult(Status.OK, tflops_per_gpu=p.tflops_per_gpu * f, peak_fraction=p.peak_fraction * f,
                           samples_per_second=p.samples_per_second * f, peak_memory_gb=allocated,
                           message="simulated (predicted, not measured)")

    def cancel(self) -> None:
        self._stop.set()

    def resources(self, trial: TrialSpec) -> dict[str, float]:
        """What a trial asks a worker pool for (Ray resource names): the simulator only waits."""
        return {"CPU": CPU_FRACTION}

    def __getstate__(self) -> dict:
        """Picklable for Ray workers: the stop Event stays behind and a fresh one is made there."""
        state = super().__getstate__()
        del state["_stop"]
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._stop = threading.Event()
