"""Trials: what a runner is given (TrialSpec) and what it returns (TrialResult), and where it runs.

A trial's own failure (OOM, timeout, crash) is a TrialResult with that status, never an exception.
`trial_dir` is the one place the trial directory (results/trials/<study>/<number>) is spelled;
`looks_oom` the one list of what an out-of-memory failure prints.
"""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass
from pathlib import Path

from tuner.errors import UsageError
from tuner.layout import Layout
from tuner.specs import Workload


#: Runners whose numbers are the performance model's own prediction, not a measurement: never evidence
#: (tuner.correction), marked as simulated wherever a trial is shown (tuner.report, `tuner best`).
SIMULATED = ("sim",)


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
        """The protocol's trial.json (see docs/runners/command.md)."""
        w = self.workload
        return {"study": self.study, "trial": self.number, "layout": self.layout.as_dict(),
                "model": {k: v for k, v in w.model.as_dict().items() if v is not None},
                "cluster": w.cluster.name, "nodes": w.nodes, "gpus": w.gpus,
                "global_batch": w.global_batch, "precision": w.precision, "framework": w.framework}

    def env(self, result_path: Path) -> dict[str, str]:
        """The protocol's TUNER_* variables, for a trial that writes its result to `result_path`
        (docs/runners/command.md): the command runner's and, with TUNER_MODEL, a Slurm job's."""
        lay, w = self.layout, self.workload
        trial_dir = result_path.parent
        return {
            "TUNER_TRIAL_JSON": str(trial_dir / "trial.json"), "TUNER_RESULT_JSON": str(result_path),
            "TUNER_TRIAL_DIR": str(trial_dir), "TUNER_STUDY": self.study, "TUNER_TRIAL": str(self.number),
            **lay.env(),             # TUNER_TP, TUNER_PP, ... (tuner.layout.DIMENSIONS)
            "TUNER_GLOBAL_BATCH": str(w.global_batch), "TUNER_NODES": str(w.nodes), "TUNER_GPUS": str(w.gpus),
            "TUNER_PEAK_TFLOPS": repr(float(w.cluster.peak_tflops)), "TUNER_PRECISION": w.precision,
            "TUNER_FRAMEWORK": w.framework,
        }


RESERVED_KEY = "peak_reserved_gb"   # a trial's `extra`: the caching allocator's reserved peak, GB of 1e9 bytes


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
    peak_reserved_gb: float | None = None    # the caching allocator's reserved peak (max_memory_reserved), if read

    @property
    def extra(self) -> dict:
        """What the store keeps of this result beyond its columns (the trial's `extra`): the reserved peak."""
        return {} if self.peak_reserved_gb is None else {RESERVED_KEY: self.peak_reserved_gb}

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


# What PyTorch (CUDA and ROCm/HIP), the C++ allocator, Python and the OS print when memory runs out;
# matched lower-cased against a log, stderr or an exception's text.
OOM_MARKERS = ("out of memory", "outofmemoryerror", "hiperroroutofmemory", "memoryerror",
               "can't allocate memory", "cannot allocate memory", "std::bad_alloc")


def looks_oom(text: str) -> bool:
    """Whether `text` (a log tail, stderr, an exception message) reports running out of memory."""
    low = text.lower()
    return any(m in low for m in OOM_MARKERS)


TRIALS = "trials"   # results/<TRIALS>/<study>/<number>/


def study_dir(results_dir: Path | str, study: str) -> Path:
    """results_dir/trials/<study>: the trial directories of one study. UsageError for a study name that
    is not one plain path component (empty, '.', '..', a '/', a leading '.'), which could escape it."""
    base = Path(results_dir) / TRIALS
    if (not study or study.startswith(".") or "/" in study or "\\" in study or "\0" in study
            or Path(study).is_absolute()):
        raise UsageError(f"study name {study!r} would put its trials outside {base}; "
                         "use letters, digits, '-', '_' and '.'")
    return base / study


def trial_dir(results_dir: Path | str, study: str, number: int) -> Path:
    """results_dir/trials/<study>/<number>: where trial `number` of `study` runs and leaves its files."""
    return study_dir(results_dir, study) / str(number)
