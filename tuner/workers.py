"""Worker processes forked to share what the parent read: `tuner plan` screens runs of its layouts in them,
`tuner scale` answers its points in them.

A forked worker inherits the CLI's signal handlers, which raise (tuner.cli.catch_termination). Left so, a
pool's terminate() -- a SIGTERM to each worker -- may not end a worker that waits on the pool's queue lock,
and the parent then waits on it for ever; Ctrl-C to the process group prints a traceback per worker. So
every worker starts with `quiet_worker`: SIGTERM and SIGHUP end it, SIGINT is the parent's to handle.
`forked_map` (plan) uses no pool at all: a process and a pipe per task, killed on any exception, no handler
threads whose joins an interrupted pool's terminate() can wait on for ever.
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


def forked_map(context, fn, tasks: list) -> list:
    """[fn(t) for t in tasks], each in its own process forked from `context` (it reads the parent's data as
    forked) that sends its answer back on a pipe. Any exception here -- Ctrl-C, SIGTERM through the CLI's
    handler, a worker's error or death -- kills every worker, waits for each, and propagates."""
    procs, pipes = [], []
    try:
        with _signals_held():           # a signal now would orphan a worker between its fork and the list
            for task in tasks:
                reader, writer = context.Pipe(duplex=False)
                proc = context.Process(target=_forked_task, args=(writer, fn, task), daemon=True)
                proc.start()
                writer.close()
                procs.append(proc)
                pipes.append(reader)
        return [_forked_answer(reader, proc) for reader, proc in zip(pipes, procs)]
    except BaseException:
        for proc in procs:
            proc.kill()
        raise
    finally:
        with _signals_held():           # a signal while one joins would leave the rest running
            for proc in procs:
                proc.join()
            for reader in pipes:
                reader.close()


_HELD = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@contextlib.contextmanager
def _signals_held():
    """SIGINT, SIGTERM and SIGHUP noted, not acted on, during the block, and raised again after it through the
    handlers they had (a mask would not do: another thread may take the signal, and Python runs its handler in
    the main thread all the same). Outside the main thread, where handlers cannot be set: the block as it is."""
    arrived = []
    try:
        saved = {s: signal.signal(s, lambda number, _frame: arrived.append(number)) for s in _HELD}
    except ValueError:
        saved = {}
    try:
        yield
    finally:
        for number, handler in saved.items():
            signal.signal(number, handler)
        for number in arrived:
            signal.raise_signal(number)


def _forked_task(writer, fn, task) -> None:
    quiet_worker()
    try:
        answer = (True, fn(task))
    except Exception as error:          # the parent raises it
        answer = (False, error)
    writer.send(answer)
    writer.close()


def _forked_answer(reader, proc):
    try:
        ok, answer = reader.recv()
    except EOFError:
        proc.join()
        raise RuntimeError(f"a worker process ended without an answer (exit code {proc.exitcode})") from None
    if not ok:
        raise answer
    return answer
