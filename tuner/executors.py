"""Worker pools that run trials concurrently: inline, threads, or a Ray cluster.

An executor has `submit(fn, *args) -> concurrent.futures.Future` and `shutdown()`. The driver only
waits on futures; where a trial runs is the executor's business.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor

from tuner.errors import UsageError

EXECUTORS = ("thread", "ray")


class InlineExecutor:
    """Runs each trial in the calling thread (parallel = 1): simplest and fastest for the simulator."""

    def submit(self, fn, *args) -> Future:
        fut: Future = Future()
        try:
            fut.set_result(fn(*args))
        except BaseException as exc:  # the driver re-raises driver bugs from the future
            fut.set_exception(exc)
        return fut

    def shutdown(self) -> None:
        pass


class ThreadExecutor:
    def __init__(self, workers: int):
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="trial")

    def submit(self, fn, *args) -> Future:
        return self._pool.submit(fn, *args)

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def make_executor(name: str, parallel: int, **options):
    if name == "thread":
        return InlineExecutor() if parallel == 1 else ThreadExecutor(parallel)
    if name == "ray":
        from tuner.ray_pool import RayExecutor
        return RayExecutor(parallel=parallel, **options)
    raise UsageError(f"unknown executor '{name}'; executors: {', '.join(EXECUTORS)}")
