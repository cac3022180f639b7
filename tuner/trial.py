"""Trials: what a runner is given (TrialSpec) and what it returns (TrialResult).

A trial's own failure (OOM, timeout, crash) is a TrialResult with that status, never an exception.
"""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass
from pathlib import Path

from tuner.layout import Layout
from tuner.specs import Workload


class Status(str, enum.Enum):
    RUNNING = "running"
    OK = "ok"
    OOM = "oom"
    TIMEOUT = "timeout"
    FAILED = "failed"
    PRUNED = "pruned"          # the memory model says it cannot fit; never launched
    INTERRUPTED = "interrupted"  # the driver stopped while it ran; resume runs it again
    STOPPED = "stopped"        # stopped early by the searcher (clearly worse after warm-up)

    def __str__(self) -> str:
        return self.value

    @property
    def finished(self) -> bool:
        return self not in (Status.RUNNING, Status.INTERRUPTED)


@dataclass(frozen=True)
class TrialSpec:
    """Everything a runner needs for one trial, and nothing of the study beyond it."""

    study: str
    number: int
    layout: Layout
    workload: Workload
    trial_dir: Path | None = None

    def as_json(self) -> dict:
        """The protocol's trial.json (see README, "Command runner")."""
        w = self.workload
        return {"study": self.study, "trial": self.number, "layout": self.layout.as_dict(),
                "model": {k: v for k, v in w.model.as_dict().items() if v is not None},
                "cluster": w.cluster.name, "nodes": w.nodes, "gpus": w.gpus,
                "global_batch": w.global_batch}


@dataclass
class TrialResult:
    status: Status
    tflops_per_gpu: float | None = None      # Megatron's count (recompute included): reported, not ranked
    mfu: float | None = None                 # model-FLOPs utilisation: what searchers maximise
    peak_fraction: float | None = None
    samples_per_second: float | None = None
    peak_memory_gb: float | None = None
    message: str = ""
    log_path: str | None = None
    retryable: bool = False   # an infrastructure failure (node fail, launcher) worth one more try

    @property
    def objective(self) -> float | None:
        """What searchers maximise: MFU (training speed), or None for a failure."""
        return self.mfu if self.status == Status.OK else None

    def as_dict(self) -> dict:
        d = asdict(self)
        d["status"] = self.status.value
        return d


def failed(message: str, status: Status = Status.FAILED, **kw) -> TrialResult:
    return TrialResult(status=status, message=message[-2000:], **kw)
