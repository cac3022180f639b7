"""Trial runners: each turns a TrialSpec into a TrialResult and never raises for a trial's own failure.

Contract (tests/test_runners.py runs it against every runner):
- `run(trial)` returns a TrialResult; OOM, timeout and crashes are statuses, not exceptions.
- `measured` is False for runners whose numbers are predictions (the simulator): `tuner best` says so.
- `cancel()` stops everything the runner started (Ctrl-C); afterwards `run` may return INTERRUPTED.
"""

from __future__ import annotations

from typing import Protocol

from tuner.errors import UsageError
from tuner.trial import TrialResult, TrialSpec

RUNNERS = ("sim", "command", "local", "slurm")


class TrialRunner(Protocol):
    name: str
    measured: bool

    def run(self, trial: TrialSpec) -> TrialResult: ...

    def cancel(self) -> None: ...


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
