"""The search loop: ask -> record -> run -> finish -> tell, under the study's lease.

The store is the single source of truth: on start the driver replays every finished trial into the
searcher (tuner.replay), re-runs trials a dead driver left interrupted, and never runs a finished layout
again; a heartbeat (tuner.lease.Heartbeat) keeps its lease while trials run. A trial's failure is a result;
only driver bugs and store failures raise.
"""

from __future__ import annotations

import logging
import re
import time
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from tuner import lease, metrics
from tuner.lease import HEARTBEAT_S
from tuner.errors import BudgetSpent, Displaced, TunerError, UsageError
from tuner.layout import Layout
from tuner.perfmodel import predict
from tuner.replay import faster, replay
from tuner.specs import Workload
from tuner.trial import Status, TrialResult, TrialSpec, trial_dir

log = logging.getLogger(__name__)
MAX_INFRA_RETRIES = 1
SAME_FAILURES = 3    # consecutive identical failures, with no success yet, that stop a study


def failure_signature(message: str) -> str:
    """A failure's message without the numbers that differ from trial to trial (paths, ids, times)."""
    return re.sub(r"\d+", "#", message or "").strip()


class Interrupted(TunerError):
    """Ctrl-C: running trials are marked interrupted; the message says how to resume."""

    exit_code = 130


@dataclass
class Progress:
    """What the CLI shows while a study runs."""

    study: str
    budget: int
    ran: int = 0
    pruned: int = 0
    running: int = 0
    running_trials: list = field(default_factory=list)   # (number, layout) of the trials in flight
    finished: list = field(default_factory=list)         # the trials this driver finished, in order
    best: object = None          # the fastest TrialRecord-like (layout, mfu, samples_per_second, number)
    last: object = None          # the trial that just finished
    started: float = field(default_factory=time.monotonic)


@dataclass
class Outcome:
    study: str
    ran: int                     # trials this driver ran (a resumed study's earlier ones not counted)
    pruned: int                  # layouts this driver pruned
    reason: str                  # budget | exhausted | converged (the searcher stopped) | time-limit
    earlier: int = 0             # trials run (or pruned) before, by earlier drivers: counted in the budget


class Driver:
    def __init__(self, *, store, study: str, workload: Workload, searcher, runner, executor,
                 budget: int, parallel: int = 1, time_limit: float | None = None, prune: bool = True,
                 results_dir: Path = Path("results"), on_progress: Callable[[Progress], None] | None = None,
                 early_stop: float | None = None, lease_mode: str = "run", keep_going: bool = False):
        if budget < 1 or parallel < 1:
            raise UsageError("--budget and --parallel must be >= 1")
        self.store, self.study, self.workload = store, study, workload
        self._earlier = (0, 0)            # (ran, pruned) by earlier drivers: _replay
        self.searcher, self.runner, self.executor = searcher, runner, executor
        self.budget, self.parallel, self.time_limit, self.prune = budget, parallel, time_limit, prune
        self.results_dir = Path(results_dir).resolve()   # workers (threads, Ray) may run elsewhere
        self.on_progress = on_progress or (lambda p: None)
        self.progress = Progress(study, budget)
        self._inflight: dict[Future, tuple[int, Layout, int]] = {}
        self._claimed: set[int] = set()      # claimed by this driver, not finished: interrupted on Ctrl-C
        self._spent = False                  # the study's budget is spent (by any of its drivers)
        self.lease = lease.StudyLease(store, study, lease_mode)   # its epoch fences claims and results
        self.failures = FailureStreak(study, keep_going)
        if early_stop:          # runners that watch no progress ignore it; executors carry it to the trial
            runner.early_stop = ClearlyWorse(early_stop, self.progress)

    # -- replay -------------------------------------------------------------------------------
    def _replay(self) -> list[tuple[int, Layout]]:
        """Tell the searcher every finished trial (tuner.replay); return the interrupted ones to run again."""
        found = replay(self.store.trials(self.study), self.searcher)
        self.progress.ran += found.ran
        self.progress.pruned += found.pruned
        self.progress.best = faster(self.progress.best, found.best)
        self._earlier = (self.progress.ran, self.progress.pruned)
        return found.again

    # -- one trial ----------------------------------------------------------------------------
    def _spec(self, number: int, layout: Layout) -> TrialSpec:
        return TrialSpec(self.study, number, layout, self.workload, trial_dir(self.results_dir, self.study, number))

    def _launch(self, number: int, layout: Layout, attempt: int = 0) -> None:
        fut = self.executor.submit(self.runner, self._spec(number, layout))
        self._inflight[fut] = (number, layout, attempt)
        log.debug("trial %d started: %s", number, layout.key())

    def _claim(self, layout: Layout, pred) -> int | None:
        """Claim `layout` within the study's budget; None when another driver has it or the budget is spent."""
        if self._spent:
            return None
        try:
            number = self.store.claim_trial(self.study, layout, pred, self.runner.name, epoch=self.lease.epoch)
        except BudgetSpent:
            self._spent = True
            return None
        if number is not None:
            self._claimed.add(number)
        return number

    def _propose(self, n: int) -> list[tuple[int, Layout]]:
        """Up to n claimed (number, layout) pairs; pruned layouts are recorded on the way."""
        out: list[tuple[int, Layout]] = []
        while len(out) < n and not self._spent:
            layouts = self.searcher.ask(n - len(out))
            if not layouts:
                break
            for lay in layouts:
                pred = predict(lay, self.workload)
                if self.prune and not pred.fits:
                    res = TrialResult(Status.PRUNED, peak_memory_gb=pred.memory_gb, message=pred.reason)
                    recorded = self.store.record_trial(self.study, lay, pred, res, self.runner.name, self.lease.epoch)
                    if recorded is not None:
                        self.progress.pruned += 1
                    self.searcher.tell(lay, res)
                    continue
                number = self._claim(lay, pred)
                if number is not None:
                    out.append((number, lay))
                elif not self._spent:       # another driver already has this layout
                    self.searcher.tell_claimed_elsewhere(lay)
        return out

    def _in_flight(self) -> None:
        self.progress.running = len(self._inflight)
        self.progress.running_trials = sorted((n, lay) for n, lay, _ in self._inflight.values())

    def _finish(self, fut: Future) -> None:
        number, layout, attempt = self._inflight.pop(fut)
        self._in_flight()                   # the live view shows a finished trial once, as finished
        result = fut.result()  # a runner that raises is a driver bug: let it propagate
        result = metrics.complete(result, self.workload, layout)   # every runner ranked on the same footing
        if result.status == Status.INTERRUPTED:
            self.store.mark_interrupted(self.study, [number])
            self._claimed.discard(number)
            return
        if result.retryable and attempt < MAX_INFRA_RETRIES:
            self._launch(number, layout, attempt + 1)
            return
        self.store.finish_trial(self.study, number, result, epoch=self.lease.epoch)
        self._claimed.discard(number)
        log.debug("trial %d %s %s: %s", number, result.status, layout.key(), result.message or "")
        self.searcher.tell(layout, result)
        self.progress.ran += 1
        self.progress.last = _Finished(number, layout, result)
        self.progress.finished.append(self.progress.last)
        if result.status == Status.OK:
            self.progress.best = faster(self.progress.best, self.progress.last)
        self.failures.see(result, succeeded=self.progress.best is not None)

    # -- the loop -----------------------------------------------------------------------------
    def _follow_budget(self, budget: int) -> None:
        """The study's budget as stored now (raised by `resume --budget` elsewhere): this driver keeps to it."""
        if budget != self.budget:
            self.budget = self.progress.budget = budget
            self._spent = False

    def _fill(self, reruns: list, deadline: float | None) -> bool:
        """Launch what the free slots allow; False once the time limit has passed."""
        if deadline and time.monotonic() >= deadline:
            return False
        free = min(self.parallel - len(self._inflight), self.budget - self.progress.ran - len(self._inflight))
        if free <= 0 or self.failures.abort:
            return True
        launched = 0
        while reruns and launched < free:       # a rerun another driver reclaimed frees its slot again
            number, lay = reruns.pop(0)
            if self._claim(lay, predict(lay, self.workload)) is not None:
                self._launch(number, lay)
                launched += 1
        if launched < free:
            for number, lay in self._propose(free - launched):
                self._launch(number, lay)
        return True

    def run(self) -> Outcome:
        """Run the study (its searcher's candidates: tuner.space.valid_layouts) to an end; see Outcome."""
        deadline = time.monotonic() + self.time_limit if self.time_limit else None
        self.lease.take(self.budget)            # and the study's budget is this driver's from here on
        beat = lease.Heartbeat(lambda: self.lease.renew(self._follow_budget))   # fresh while trials run
        reruns = self._replay()
        self.on_progress(self.progress)
        try:
            reason = self._loop(reruns, deadline)
        except Displaced as exc:       # another driver owns the study now: stop, write nothing more
            self.runner.cancel()
            self.executor.shutdown()
            raise TunerError(str(exc)) from None
        except KeyboardInterrupt as exc:     # Ctrl-C, or SIGTERM / SIGHUP (tuner.cli.Terminated: a signum)
            n = self._interrupt()
            signum = getattr(exc, "signum", None)
            err = Interrupted(f"{f'terminated by {exc}' if signum else 'interrupted'}: {n} running trial(s) marked "
                              f"interrupted; continue with `tuner resume {self.study}`")
            if signum:
                err.exit_code = 128 + signum
            raise err from None
        except TunerError as exc:   # e.g. a lost store or Ray cluster: leave the study resumable
            try:
                self._interrupt()
            except TunerError:
                pass
            err = TunerError(exc if self.failures.abort else f"{exc} (the study is saved: continue with "
                             f"`tuner resume {self.study}`)")
            err.exit_code = exc.exit_code
            raise err from None
        finally:
            beat.stop()
        self.progress.running, self.progress.running_trials = 0, []
        self.lease.release()
        self.on_progress(self.progress)
        ran, pruned = self._earlier
        return Outcome(self.study, self.progress.ran - ran, self.progress.pruned - pruned, reason, ran + pruned)

    def _loop(self, reruns: list, deadline: float | None) -> str:
        """Run trials until the budget, the space, the searcher or the time limit ends it; why it ended."""
        reason = "budget"
        while True:
            if self.lease.displaced:
                raise Displaced(self.study)
            before = len(self._inflight)
            if not self._fill(reruns, deadline):
                reason = "time-limit"
            self._in_flight()
            if len(self._inflight) > before:       # the live view shows what just started
                self.on_progress(self.progress)
            if not self._inflight:
                if self.failures.abort:
                    raise TunerError(self.failures.abort)
                if reason != "time-limit" and self.progress.ran < self.budget and not self._spent:
                    reason = "converged" if self.searcher.stopped else "exhausted"
                return reason
            left = deadline - time.monotonic() if deadline else HEARTBEAT_S
            timeout = min(left, HEARTBEAT_S) if left > 0 else HEARTBEAT_S   # past the limit: wait, never spin
            done, _ = wait(list(self._inflight), timeout=timeout, return_when=FIRST_COMPLETED)
            for fut in done:
                self._finish(fut)
                self.on_progress(self.progress)

    def _interrupt(self) -> int:
        """Stop: cancel the runner, mark every trial this driver claimed and did not finish interrupted."""
        self.runner.cancel()
        numbers = sorted(self._claimed | {n for n, _, _ in self._inflight.values()})
        if numbers:
            self.store.mark_interrupted(self.study, numbers)
        self._claimed.clear()
        self.lease.release()
        if not lease.holders(self.store.get_study(self.study).settings):   # joined drivers still run it
            self.store.set_study_state(self.study, "interrupted")
        self.executor.shutdown()
        return len(numbers)


class ClearlyWorse:
    """Multi-fidelity (`--early-stop FRACTION`): after its warm-up step, is a running trial clearly below
    the best so far? The runner calls it with the trial's per-step records (step, elapsed,
    samples_per_second, ...), the first of them warm-up; clearly worse = the latest samples/s below
    FRACTION x the best's (`progress.best`, the driver's, read at each call)."""

    def __init__(self, fraction: float, progress: Progress):
        self.fraction, self.progress = fraction, progress

    def __call__(self, records: list[dict]) -> bool:
        best = self.progress.best
        timed = [r for r in records[1:] if isinstance(r.get("samples_per_second"), (int, float))]
        if best is None or not best.samples_per_second or not timed:
            return False
        return timed[-1]["samples_per_second"] < self.fraction * best.samples_per_second


class FailureStreak:
    """Stops a study whose trials all fail the same way (a typo in --command burns no budget). An OOM, a
    timeout or a stopped trial is a result about its layout, not a broken command."""

    def __init__(self, study: str, keep_going: bool = False):
        self.study, self.keep_going = study, keep_going
        self._last: tuple[str, int] = ("", 0)     # (failure signature, how many in a row)
        self.abort: str | None = None              # why the study stops, once it must

    def see(self, result: TrialResult, succeeded: bool) -> None:
        """Count `result` (a finished trial's); `succeeded`: some trial of the study has succeeded."""
        if result.status != Status.FAILED or succeeded:
            self._last = ("", 0)
            return
        sig = failure_signature(result.message)
        n = self._last[1] + 1 if sig == self._last[0] else 1
        self._last = (sig, n)
        if n >= SAME_FAILURES and not self.keep_going and self.abort is None:
            self.abort = (f"{n} trials in a row failed the same way and none succeeded: {result.message[:400]} "
                          f"-- fix the cause and continue with `tuner resume {self.study}` (or resume with "
                          "--keep-going to run on regardless)")


@dataclass
class _Finished:
    """A finished trial as the progress display sees it (same fields as a TrialRecord)."""

    number: int
    layout: Layout
    result: TrialResult

    @property
    def status(self):
        return self.result.status

    @property
    def peak_fraction(self):
        return self.result.peak_fraction

    @property
    def mfu(self):
        return self.result.mfu

    @property
    def samples_per_second(self):
        return self.result.samples_per_second

    @property
    def tflops_per_gpu(self):
        return self.result.tflops_per_gpu
