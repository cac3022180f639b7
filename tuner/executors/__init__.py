"""Worker pools that run trials concurrently: inline, threads (here), or a Ray cluster (`ray.py`).

An executor has `submit(runner, trial) -> concurrent.futures.Future` of the runner's TrialResult, and
`shutdown()`. The driver only waits on futures; where a trial runs is the executor's business, and so
is carrying the runner's `early_stop` hook to it (the same object here; a relay under Ray). An
exception the runner raises is a driver bug: it comes back out of the future.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor

from tuner.errors import UsageError
from tuner.runners import TrialRunner
from tuner.trial import TrialSpec

EXECUTORS = ("thread", "ray")


class InlineExecutor:
    """Runs each trial in the calling thread (parallel = 1): simplest and fastest for the simulator."""

    def submit(self, runner: TrialRunner, trial: TrialSpec) -> Future:
        fut: Future = Future()
        try:
            fut.set_result(runner.run(trial))
        except BaseException as exc:  # the driver re-raises driver bugs from the future
            fut.set_exception(exc)
        return fut

    def shutdown(self) -> None:
        pass


class ThreadExecutor:
    """Runs each trial in one of `workers` threads of this process."""

    def __init__(self, workers: int):
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="trial")

    def submit(self, runner: TrialRunner, trial: TrialSpec) -> Future:
        return self._pool.submit(runner.run, trial)

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def make_executor(name: str, parallel: int, **options):
    if name == "thread":
        return InlineExecutor() if parallel == 1 else ThreadExecutor(parallel)
    if name == "ray":
        from tuner.executors.ray import RayExecutor
        return RayExecutor(parallel=parallel, **options)
    raise UsageError(f"unknown executor '{name}'; executors: {', '.join(EXECUTORS)}")
