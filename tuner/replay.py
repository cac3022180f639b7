"""Resume = replay the store: a study's stored trials told to a fresh searcher.

The store is the single source of truth. A driver that starts on a study tells its searcher every
finished trial (so no finished layout runs again and the searcher learns from all of them), counts what
earlier drivers ran and pruned (counted in the budget), and gets back the interrupted trials to run again;
a trial still running belongs to another live driver and is left alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

from tuner.layout import Layout
from tuner.trial import Status, TrialResult


@dataclass
class Replayed:
    """What a replay found: the interrupted trials to run again, and what earlier drivers did."""

    again: list[tuple[int, Layout]] = field(default_factory=list)
    ran: int = 0
    pruned: int = 0
    best: object = None          # the fastest ok trial (a TrialRecord), or None


def result_of(record) -> TrialResult:
    """The TrialResult a stored trial stands for (used to replay it into a searcher)."""
    return TrialResult(record.status, tflops_per_gpu=record.tflops_per_gpu, mfu=record.mfu,
                       peak_fraction=record.peak_fraction, samples_per_second=record.samples_per_second,
                       peak_memory_gb=record.peak_memory_gb, message=record.message or "",
                       peak_reserved_gb=getattr(record, "peak_reserved_gb", None))


def faster(best, trial):
    """`trial` when it is ok, has an MFU and beats `best` (or there is none), else `best`."""
    if (trial is not None and trial.status == Status.OK and trial.mfu is not None
            and (best is None or trial.mfu > best.mfu)):
        return trial
    return best


def replay(trials: Iterable, searcher) -> Replayed:
    """Tell `searcher` every finished trial of `trials` (a study's stored records, in order)."""
    out = Replayed()
    for rec in trials:
        if rec.status == Status.RUNNING:
            continue  # another live driver owns it (a dead one's were marked interrupted by resume)
        if rec.status == Status.INTERRUPTED:
            out.again.append((rec.number, rec.layout))
            continue
        searcher.tell(rec.layout, result_of(rec))
        if rec.status == Status.PRUNED:
            out.pruned += 1
        else:
            out.ran += 1
        out.best = faster(out.best, rec)
    return out
