"""Trials: what a runner is given (TrialSpec) and what it returns (TrialResult), and where it runs.

A trial's own failure (OOM, timeout, crash) is a TrialResult with that status, never an exception.
`trial_dir` is the one place the trial directory (results/trials/<study>/<number>) is spelled;
`looks_oom` the one list of what an out-of-memory failure prints.
"""

from __future__ import annotations

import enum
import re
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


MESSAGE_CHARS = 2000    # what a result keeps of a failure's text: its tail


def failed(message: str, status: Status = Status.FAILED, **kw) -> TrialResult:
    """A failed result keeping what `kept_message` keeps of `message`."""
    return TrialResult(status=status, message=kept_message(message, status), **kw)


def kept_message(message: str, status: Status) -> str:
    """What a result of `status` keeps of a failure's text: its tail, and an OOM's allocator sentence
    (oom_sentence) where the tail lost it (a launcher's summary after the traceback), for what it says of the
    memory the process had -- or, where it has none, a C++ abort's out-of-memory error (oom_abort): why it is one."""
    tail = message[-MESSAGE_CHARS:]
    line = (oom_sentence(message) or oom_abort(message)) if status == Status.OOM else None
    if line and line not in tail:
        keep = max(MESSAGE_CHARS - len(line) - 5, 0)
        tail = line + " ... " + message[len(message) - keep:]
    return tail


# What PyTorch (CUDA and ROCm/HIP), the C++ allocator, Python and the OS print when memory runs out;
# matched lower-cased against a log, stderr or an exception's text. The device's: PyTorch's allocator and the CUDA /
# HIP runtime. The host's: Python's MemoryError, the C++ allocator's std::bad_alloc and the OS's ENOMEM ("Cannot
# allocate memory": a fork, an mmap, RDMA's locked pages) -- the layout's memory only where the ranks are CPU cores.
DEVICE_OOM_MARKERS = ("out of memory", "outofmemoryerror", "hiperroroutofmemory")
HOST_OOM_MARKERS = ("memoryerror", "can't allocate memory", "cannot allocate memory", "std::bad_alloc")
OOM_MARKERS = DEVICE_OOM_MARKERS + HOST_OOM_MARKERS


def looks_oom(text: str, host: bool = True) -> bool:
    """Whether `text` (a log tail, stderr, an exception message) reports running out of the ranks' memory; `host`:
    whether that is the host's (CPU ranks). On GPUs the host running out is another failure, not the layout's OOM: as
    an oom it would bound the layout's GPU memory at the GPUs' capacity and hold back its neighbours."""
    low = text.lower()
    return any(m in low for m in (OOM_MARKERS if host else DEVICE_OOM_MARKERS))


# A rank that ran out of device memory inside C++ aborts with no Python traceback: c10's CUDA / HIP check throws a
# c10::Error nobody catches ("terminate called after throwing an instance of 'c10::Error'" then "  what():  CUDA error:
# out of memory", rwth-i6/returnn#1482; "HIP error: out of memory" on ROCm: hipGetErrorString(hipErrorOutOfMemory) is
# "out of memory", JuliaGPU/AMDGPU.jl#591), or NCCL's watchdog rethrows the sticky error ("[PG ID 0 PG GUID
# 0(default_pg) Rank 3] Process group watchdog thread terminated with exception: CUDA error: out of memory", the form of
# InternLM/lmdeploy#3258; "[Rank 3] NCCL watchdog thread ..." before 2.2); NCCL's own cudaMalloc: "Cuda failure 2 'out
# of memory'" (ncclUnhandledCudaError). Each says the run failed of the device's memory, with no figure of it
# (oom_capacity_gb: None). "CUDA error: out of memory" alone is no abort: code that caught it prints it and goes on
# (Inductor's max-autotune: "Runtime error during autotuning:" then the error's text, "Ignoring this choice."; a
# script's own retry); raised in Python it is an error line ("RuntimeError: CUDA error: ...", failure_log.root_cause).
# Other sticky errors ("an illegal memory access was encountered", "unspecified launch failure") are no OOM.
ABORTED = re.compile(r"(?:what\(\):\s+|(?:\[(?:PG [^\]]{0,80}|Rank \d+)\] )?(?:Process group|NCCL) watchdog thread "
                     r"terminated with exception: )(?:CUDA|HIP) error: out of memory"
                     r"|Cuda failure (?:\d+ )?'out of memory'")


def oom_abort(text: str) -> str | None:
    """The first C++ abort's device out-of-memory error in `text` (ABORTED), or None."""
    m = ABORTED.search(text or "")
    return m.group(0) if m else None


def host_memory(trial) -> bool:
    """Whether a trial's ranks run on CPU cores, so the host's memory is theirs (its cluster says device "cpu")."""
    return trial.workload.cluster.device == "cpu"


# PyTorch's caching allocator on CUDA and ROCm (c10/cuda/CUDACachingAllocator.cpp, DeviceCachingAllocator::malloc),
# as users quote it: since 2.1 "CUDA out of memory. Tried to allocate 22.00 MiB. GPU 0 has a total capacity of 23.65
# GiB of which 11.06 MiB is free. Including non-PyTorch memory, this process has 23.60 GiB memory in use. Of the
# allocated memory 22.90 GiB is allocated by PyTorch, and 194.87 MiB is reserved by PyTorch but unallocated."
# (pytorch/pytorch#16417; 2.1 spells "capacty"). Between "is free." and "Of the allocated" come, in NVML's order, one
# "Process N has X memory in use." per process on the GPU ("Including non-PyTorch memory, this process has" for this
# one; none without NVML, on ROCm, and no "this process" where a container's PID namespace hides it: OCRFlux#42,
# RunPod-Fooocus-API#42), then "X allowed; " under a per-process memory fraction; "with X allocated in private pools
# (e.g., CUDA Graphs)," (HIP Graphs on ROCm) follows "allocated by PyTorch," where graphs hold memory
# (ROCm/TheRock#2118). Before 2.1: "Tried to allocate 2.26 GiB (GPU 0; 6.00 GiB total capacity; 781.59 MiB already
# allocated; 3.03 GiB free; 1.24 GiB reserved in total by PyTorch)" (pytorch/pytorch#59778), "X allowed; " before
# the reserved bytes under a fraction (pytorch/pytorch#111729).
_UNITS = {"bytes": 1.0, "KiB": 2.0 ** 10, "MiB": 2.0 ** 20, "GiB": 2.0 ** 30, "TiB": 2.0 ** 40}
_ANY = r"[0-9.]+\s*(?:bytes|KiB|MiB|GiB|TiB)"


def _size(name: str) -> str:
    return rf"(?P<{name}>[0-9.]+)\s*(?P<{name}_unit>bytes|KiB|MiB|GiB|TiB)"


_PROCESS = r"(?:Including non-PyTorch memory, this process|Process \d+) has " + _ANY + r" memory in use\.\s*"
_NEW = re.compile(r"(?:CUDA|HIP) out of memory\. Tried to allocate " + _ANY + r"\.\s*GPU \d+ has a total capac\w* of "
                  + _size("total") + " of which " + _size("free") + r" is free\.\s*(?P<procs>(?:" + _PROCESS + r")*)"
                  + r"(?:" + _size("allowed") + r" allowed;\s*)?Of the allocated memory " + _size("allocated")
                  + r" is allocated by PyTorch,\s*(?:with " + _ANY + r" allocated in private pools \(e\.g\., \w+ "
                  + r"Graphs\),\s*)?and " + _size("unallocated") + r" is reserved by PyTorch but unallocated\.")
_OLD = re.compile(r"(?:CUDA|HIP) out of memory\. Tried to allocate " + _ANY + r" \(GPU \d+; " + _size("total")
                  + r" total capacity; " + _ANY + r" already allocated; " + _size("free") + r" free; (?:"
                  + _size("allowed") + r" allowed; )?" + _size("reserved") + r" reserved in total by PyTorch\)")
_THIS = re.compile(r"this process has " + _size("in_use") + r" memory in use")


def _gb(m, name: str) -> float | None:
    return float(m.group(name)) * _UNITS[m.group(name + "_unit")] / 1e9 if m.group(name) is not None else None


def oom_sentence(text: str) -> str | None:
    """The last of PyTorch's out-of-memory sentences in `text` (a log, stderr, a stored message), or None."""
    found = [m.group(0) for rx in (_NEW, _OLD) for m in rx.finditer(text or "")]
    return max(found, key=lambda s: (text or "").rfind(s)) if found else None


def oom_capacity_gb(text: str, reserve_gb: float) -> float | None:
    """The memory (GB of 1e9 bytes) this process could use on its GPU when it ran out, as PyTorch's message in
    `text` says: what it had in use (non-PyTorch memory included) and what was free -- less than the GPU's
    capacity by what the driver and other processes hold. Where the message does not give this process's use
    (no NVML, ROCm, a container's PID namespace; before 2.1), the allocator's reserved bytes plus `reserve_gb`
    (the cluster's memory outside PyTorch: context, communicator buffers) stand for it, at most the GPU's total.
    Under a per-process memory fraction ("X allowed"), at most that plus the memory outside PyTorch. None when
    `text` has no such message."""
    m, this = _oom_match(text)
    if m is None:
        return None
    if this:
        had, outside = _gb(this, "in_use") + _gb(m, "free"), _outside_gb(m, this)
    else:
        had, outside = min(_reserved_gb(m) + reserve_gb + _gb(m, "free"), _gb(m, "total")), reserve_gb
    allowed = _gb(m, "allowed")
    return had if allowed is None else min(had, allowed + outside)


def oom_outside_gb(text: str) -> float | None:
    """The memory (GB) the process held outside PyTorch's caching allocator when it ran out (CUDA context, communicator
    buffers, workspaces), as PyTorch's message in `text` says: what it had in use less what the allocator reserved;
    None where the message does not give this process's use (no NVML, ROCm, a container's PID namespace; before 2.1)."""
    m, this = _oom_match(text)
    return _outside_gb(m, this) if this else None


def _oom_match(text: str) -> tuple:
    """(PyTorch's last out-of-memory sentence in `text` matched, its "this process has" part) or (None, None)."""
    line = oom_sentence(text)
    if line is None:
        return None, None
    m = _NEW.search(line) or _OLD.search(line)
    return m, _THIS.search(m.group("procs")) if "procs" in m.re.groupindex else None


def _reserved_gb(m) -> float:
    return _gb(m, "reserved") if "reserved" in m.re.groupindex else _gb(m, "allocated") + _gb(m, "unallocated")


def _outside_gb(m, this) -> float:
    """What the message's process had in use (`this`) less what its allocator reserved (`m`), GB."""
    return max(_gb(this, "in_use") - _reserved_gb(m), 0.0)


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
