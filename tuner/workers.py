"""Worker processes forked to share what the parent read: `tuner plan` screens runs of its layouts in them,
`tuner scale` answers its points in them.

A forked worker inherits the CLI's signal handlers, which raise (tuner.cli.catch_termination). Left so, a
pool's terminate() -- a SIGTERM to each worker -- may not end a worker that waits on the pool's queue lock,
and the parent then waits on it for ever; Ctrl-C to the process group prints a traceback per worker. So
every worker starts with `quiet_worker`: SIGTERM and SIGHUP end it, SIGINT is the parent's to handle.
"""

from __future__ import annotations

import contextlib
import gc
import multiprocessing
import os
import signal


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity: a Slurm step's share of a node), not the node's count."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:          # no affinity on this platform
        return os.cpu_count() or 1


def fork_context():
    """The fork start method's context (workers read the parent's data as forked), or None where it does not
    exist: the caller then works in one process."""
    if "fork" not in multiprocessing.get_all_start_methods():
        return None
    return multiprocessing.get_context("fork")


def quiet_worker() -> None:
    """A pool's initializer: SIGTERM and SIGHUP end the worker (what a pool's terminate relies on), SIGINT is
    ignored (Ctrl-C reaches the parent, which ends the pool)."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@contextlib.contextmanager
def collector_paused():
    """Python's cyclic garbage collector off for the block (and in the workers it forks): `tuner plan` makes and
    screens ~150,000 layouts, each with tuples and dicts that live to the end, and every collection of the oldest
    generation walks all of them again -- a fifth of DeepSeek-V3's plan (benchmarks/plan_speed.py). What plan
    makes holds no reference cycles, so reference counting frees it as before; the collector is on again after."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()
