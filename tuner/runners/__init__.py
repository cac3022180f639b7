"""Trial runners: each turns a TrialSpec into a TrialResult and never raises for a trial's own failure.

Every runner subclasses `TrialRunner`, which declares the whole interface; the optional hooks have
do-nothing defaults, so callers use them without probing (tests/test_runners.py runs the contract
against every runner):
- `run(trial)` returns a TrialResult; OOM, timeout and crashes are statuses, not exceptions.
- `measured` is False for runners whose numbers are predictions (the simulator): `tuner best` says so.
- `cancel()` stops everything the runner started (Ctrl-C); afterwards `run` may return INTERRUPTED.
- `early_stop` is the driver's multi-fidelity hook, `callable(progress records) -> bool` or None:
  a runner that watches a trial's progress stops it (STOPPED) once the hook says so; others ignore it.
  It is the driver's, so it never travels with a pickled runner: an executor that runs trials in
  other processes (Ray) gives each trial its own hook there (tuner.executors.ray).
- `resources(trial)` is what one trial asks a worker pool for, in Ray resource names ({"GPU": 8}).
- `cancel_study_jobs(study)` kills what a dead driver left running for `study` (on resume) and
  returns the trials or jobs it killed.
"""

from __future__ import annotations

from typing import Callable

from tuner.errors import UsageError
from tuner.trial import TrialResult, TrialSpec

RUNNERS = ("sim", "command", "local", "slurm")
CPU_FRACTION = 0.1      # what a trial whose work runs elsewhere (a prediction, a Slurm job) asks a pool for
#: The trial timeout of the real runners (command, local, slurm) when --trial-timeout is not given: a trial
#: that cannot start (a build lock, a hung rendezvous) fails as `timeout` in bounded time instead of
#: holding the study for ever. Half an hour: a short tuning trial's budget; --trial-timeout raises it.
DEFAULT_TRIAL_TIMEOUT_S = 1800.0

EarlyStop = Callable[[list], bool]


class TrialRunner:
    """The runner interface, with do-nothing defaults for the optional hooks."""

    name: str = ""
    measured: bool = True
    early_stop: EarlyStop | None = None

    def run(self, trial: TrialSpec) -> TrialResult:
        raise NotImplementedError

    def cancel(self) -> None:
        """Nothing to stop by default."""

    def resources(self, trial: TrialSpec) -> dict[str, float]:
        """One CPU by default; a runner whose work runs elsewhere asks for less, a GPU trainer for GPUs."""
        return {"CPU": 1}

    def cancel_study_jobs(self, study: str) -> list[str]:
        """Nothing left behind by default."""
        return []

    def __getstate__(self) -> dict:
        """Pickled (for Ray workers) without the driver's early-stop hook."""
        state = dict(self.__dict__)
        state.pop("early_stop", None)
        return state


def make_runner(name: str, **options) -> TrialRunner:
    """Build a runner by name; `options` are the runner's own settings (see each runner)."""
    if name == "sim":
        from tuner.runners.sim import SimRunner
        return SimRunner(**options)
    if name == "command":
        from tuner.runners.command import CommandRunner
        return CommandRunner(**options)
    if name == "local":
        from tuner.runners.local import LocalRunner
        return LocalRunner(**options)
    if name == "slurm":
        from tuner.runners.slurm import SlurmRunner
        return SlurmRunner(**options)
    raise UsageError(f"unknown runner '{name}'; runners: {', '.join(RUNNERS)}")
