"""The local runner: real DeepSpeed trials of the bundled GPT harness on G devices of this machine.

Each trial is the command-runner protocol (trial.json, TUNER_* environment, result.json, logs in the
trial directory) with the command

    python -m torch.distributed.run --standalone --nproc_per_node G -m tuner.runners.harness.train

(or `deepspeed --num_gpus G --module ...` with launcher="deepspeed"). On CPU that is G processes
(DS_ACCELERATOR=cpu, gloo, OMP_NUM_THREADS=1 each); with G visible CUDA devices, G GPUs (nccl).
One trial runs at a time per device set, however many threads call `run`.

Memory cap on CPU: `memory_gb` (default 80 % of this machine's RAM) is shared by the G ranks; each
rank's address space may grow by memory_gb / G after start-up (TUNER_MEMORY_LIMIT_GB, enforced by the
harness with RLIMIT_AS), and as a backstop every process of the trial starts under a soft RLIMIT_AS
of memory_gb / G + 4 GB (start-up needs ~1 GB of address space). A runaway layout becomes `oom`.
"""

from __future__ import annotations

import hashlib
import logging
import os
import resource
import sys
import threading
import time
from pathlib import Path
from typing import Sequence

from tuner.errors import MissingExtra, UsageError, require
from tuner.runners import TrialRunner
from tuner.runners.command import CommandRunner, EarlyStop
from tuner.runners.harness.support import layout_refusal
from tuner.trial import Status, TrialResult, TrialSpec, failed

HARNESS = "tuner.runners.harness.train"
LAUNCHERS = ("torchrun", "deepspeed")
VA_HEADROOM_GB = 4.0          # address space a rank maps beyond its data (libraries, thread arenas)
DEFAULT_MEMORY_FRACTION = 0.8

STALE_BUILD_LOCK_S = 600.0    # a DeepSpeed op build takes ~30 s here: a lock this old is a killed build's
BUILDER_GRACE_S = 2.0         # a lock younger than this is left alone even when no process holds it yet
log = logging.getLogger(__name__)

_DEVICE_LOCKS: dict[str, threading.Lock] = {}
_LOCKS_GUARD = threading.Lock()


def _device_lock(key: str) -> threading.Lock:
    with _LOCKS_GUARD:
        return _DEVICE_LOCKS.setdefault(key, threading.Lock())


def extensions_dir() -> Path:
    """Where the trials' op builds go: TORCH_EXTENSIONS_DIR when set, else a folder of tuner's own per Python
    environment (~/.cache/tuner/torch_extensions/<venv>-<hash>), never torch's default ~/.cache/torch_extensions,
    which every venv (other torch versions) and every killed build share."""
    if os.environ.get("TORCH_EXTENSIONS_DIR"):
        return Path(os.environ["TORCH_EXTENSIONS_DIR"])
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    env = hashlib.sha1(sys.prefix.encode()).hexdigest()[:10]
    return cache / "tuner" / "torch_extensions" / f"{Path(sys.prefix).name.lstrip('.') or 'python'}-{env}"


def build_locks(root: Path) -> list[Path]:
    """torch's op build locks under `root` (its FileBaton: `<root>/[pyXY_cpu/]<op>/lock`)."""
    return sorted([*root.glob("*/lock"), *root.glob("*/*/lock")])


def lock_holders(lock: Path) -> list[int] | None:
    """The live processes that hold `lock` open: torch's FileBaton keeps the lock's file descriptor open
    for the whole build, so none means its builder is gone. None where /proc cannot tell (not Linux)."""
    if not Path("/proc/self/fd").is_dir():
        return None
    target, holders = os.path.realpath(lock), []
    for fds in Path("/proc").glob("[0-9]*/fd"):
        try:
            if any(os.readlink(fd.path) == target for fd in os.scandir(fds) if fd.is_symlink()):
                holders.append(int(fds.parent.name))
        except OSError:
            continue              # gone, or another user's process (which builds in no folder of ours)
    return holders


def clear_stale_build_locks(root: Path | None = None, older_than_s: float = STALE_BUILD_LOCK_S) -> list[Path]:
    """Remove the build locks a killed op build left behind (every later build waits on one for ever): a
    lock no live process holds open (its builder is gone; BUILDER_GRACE_S old at least), or, where /proc
    cannot tell, one older than `older_than_s`. The removed paths."""
    root = root or extensions_dir()
    now, removed = time.time(), []
    for lock in build_locks(root):
        try:
            age, holders = now - lock.stat().st_mtime, lock_holders(lock)
            if (holders == [] and age > BUILDER_GRACE_S) or (holders is None and age > older_than_s):
                lock.unlink()
                removed.append(lock)
        except OSError:
            continue              # gone already, or not ours to remove: the build will say so
    for lock in removed:
        log.warning("removed op build lock %s: no process builds there any more (a build killed before it "
                    "finished); the op is rebuilt", lock)
    return removed


def lock_cause(root: Path) -> str:
    """What a build lock under `root` says of a trial that ran out of time ("" when there is none): who holds
    it, or that its builder is gone (and the lock is then removed, so the next trial builds again)."""
    said = []
    for lock in build_locks(root):
        holders = lock_holders(lock)
        if holders:
            said.append(f"it was waiting on op build lock {lock}, held by process {', '.join(map(str, holders))} "
                        f"({_cmdline(holders[0])}): let that build finish, or end that process")
        elif holders == [] and clear_stale_build_locks(root, older_than_s=0.0):
            said.append(f"an op build (lock {lock}) did not finish: its lock was removed, the next trial rebuilds; "
                        "raise --trial-timeout if the build is just slow")
    return "; ".join(said)


def _cmdline(pid: int) -> str:
    try:
        text = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return "gone"
    return text if len(text) <= 120 else text[:117] + "..."


def default_memory_gb() -> float:
    """80 % of this machine's RAM: what all ranks of one CPU trial may use together."""
    import psutil
    return round(psutil.virtual_memory().total * DEFAULT_MEMORY_FRACTION / 1e9, 1)


def launch_argv(gpus: int, launcher: str = "torchrun") -> list[str]:
    """The launcher command for G ranks of the harness (pure)."""
    if launcher == "torchrun":
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(gpus),
                "-m", HARNESS]
    if launcher == "deepspeed":
        return [sys.executable, "-m", "deepspeed.launcher.runner", "--num_gpus", str(gpus), "--master_addr",
                "127.0.0.1", "--master_port", str(_free_port()), "--module", HARNESS]
    raise UsageError(f"unknown launcher '{launcher}'; launchers: {', '.join(LAUNCHERS)}")


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _detect_device(device: str, gpus: int) -> str:
    try:
        import torch
    except ImportError:
        raise MissingExtra("torch", "deepspeed") from None
    cuda = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if device == "auto":
        return "cuda" if cuda >= gpus else "cpu"
    if device == "cuda" and cuda < gpus:
        raise UsageError(f"--gpus {gpus} on CUDA but {cuda} CUDA device(s) are visible: lower --gpus or "
                         "run on CPU (device 'cpu')")
    if device not in ("cpu", "cuda"):
        raise UsageError(f"unknown device '{device}'; devices: auto, cpu, cuda")
    return device


def device_for(cluster, gpus: int) -> str:
    """The device the local runner trains `gpus` ranks on for `cluster`: CPU cores where its file says device = "cpu"
    (local, local-slurm, a file `tuner calibrate` wrote on CPUs), else CUDA -- refused where this machine shows fewer
    than `gpus` CUDA devices: CPU ranks' step times and peaks stored as that GPU's would be read as its measurements."""
    if cluster.device == "cpu":
        return "cpu"
    if _detect_device("auto", gpus) == "cpu":
        raise UsageError(f"--runner local would train {gpus} rank(s) on this machine's CPU cores (fewer than {gpus} "
                         f"CUDA device(s) visible), and store them as measurements of '{cluster.name}' GPUs: run "
                         "it on a node with those GPUs, or use --cluster local (CPU ranks) or a cluster file "
                         "`tuner calibrate` wrote on this machine")
    return "cuda"


class LocalRunner(TrialRunner):
    name = "local"

    def __init__(self, gpus: int = 1, trial_timeout: float | None = None, results_dir: Path | str = Path("results"),
                 memory_gb: float | None = None, device: str = "auto", launcher: str = "torchrun",
                 steps: int | None = None, warmup: int | None = None, env: dict[str, str] | None = None,
                 early_stop: EarlyStop | None = None, kill_grace: float = 5.0):
        if not isinstance(gpus, int) or gpus < 1:
            raise UsageError(f"--gpus must be an integer >= 1 (got {gpus!r})")
        if memory_gb is not None and memory_gb <= 0:
            raise UsageError(f"--memory-gb must be > 0 (got {memory_gb})")
        for name, v in (("--steps", steps), ("--warmup", warmup)):
            if v is not None and (not isinstance(v, int) or v < (1 if name == "--steps" else 0)):
                raise UsageError(f"{name} must be an integer >= {1 if name == '--steps' else 0} (got {v!r})")
        self.gpus, self.device = gpus, _detect_device(device, gpus)
        require("deepspeed")          # the harness trains with it: say so before any trial fails
        self.argv = launch_argv(gpus, launcher)
        self.launcher = launcher
        extra = dict(env or {})
        # the op builds go to a folder of their own (extensions_dir), where the runner clears killed builds' locks
        self.extensions_dir = Path(extra.get("TORCH_EXTENSIONS_DIR") or extensions_dir())
        extra["TORCH_EXTENSIONS_DIR"] = str(self.extensions_dir)
        # the harness must import this tuner, even from a checkout that is not pip-installed
        root = str(Path(__file__).resolve().parents[2])
        extra["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [os.environ.get("PYTHONPATH")])])
        if steps is not None:
            extra["TUNER_STEPS"] = str(steps)
        if warmup is not None:
            extra["TUNER_WARMUP_STEPS"] = str(warmup)
        if self.device == "cpu":
            self.memory_gb = memory_gb if memory_gb is not None else default_memory_gb()
            per_rank = self.memory_gb / gpus
            extra.update(DS_ACCELERATOR="cpu", CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1",
                         TUNER_MEMORY_LIMIT_GB=f"{per_rank:.3f}")
            self.argv = [sys.executable, "-m", "tuner.runners.local", "--soft-as",
                         str(int((per_rank + VA_HEADROOM_GB) * 1e9)), "--", *self.argv]
            self._lock_key = "cpu"
        else:
            self.memory_gb = memory_gb
            self._lock_key = "cuda:" + os.environ.get("CUDA_VISIBLE_DEVICES", "all")
        self._cmd = CommandRunner(self.argv, trial_timeout=trial_timeout, results_dir=results_dir, env=extra,
                                  early_stop=early_stop, kill_grace=kill_grace, resolve_paths=False,
                                  host_memory=self.device == "cpu")   # CPU ranks: the host's memory is theirs
        self._cancelled = threading.Event()

    def cancel_study_jobs(self, study: str) -> list[str]:
        """On resume: kill trial processes a dead driver left running (see CommandRunner)."""
        return self._cmd.cancel_study_jobs(study)

    def __getstate__(self) -> dict:   # sent to Ray workers: the event stays behind
        return {k: v for k, v in self.__dict__.items() if k != "_cancelled"}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._cancelled = threading.Event()

    def run(self, trial: TrialSpec) -> TrialResult:
        lay = trial.layout
        if lay.gpus != self.gpus:
            return failed(f"layout {lay.key()} uses tp*cp*pp*dp = {lay.gpus} devices but the local runner has "
                          f"--gpus {self.gpus}; the workload has {trial.workload.gpus} GPUs "
                          f"({trial.workload.nodes} x {trial.workload.cluster.gpus_per_node} of cluster "
                          f"'{trial.workload.cluster.name}'): use --gpus {lay.gpus} or a cluster file "
                          f"with gpus_per_node = {self.gpus} (`tuner calibrate --gpus {self.gpus}`)")
        refusal = layout_refusal(lay, trial.workload.model.num_layers, trial.workload.precision,
                                 model=trial.workload.model)   # fails unlaunched
        if refusal:
            return failed(refusal)
        lock = _device_lock(self._lock_key)
        while not lock.acquire(timeout=0.2):
            if self._cancelled.is_set():
                return TrialResult(Status.INTERRUPTED, message="cancelled while waiting for the devices")
        try:
            clear_stale_build_locks(self.extensions_dir)   # else the trial's op build waits on it for ever
            result = self._cmd.run(trial)
            if result.status == Status.TIMEOUT:
                cause = lock_cause(self.extensions_dir)
                result.message = f"{cause}; {result.message}" if cause else result.message
            return result
        finally:
            lock.release()

    def cancel(self) -> None:
        self._cancelled.set()
        self._cmd.cancel()

    def resources(self, trial: TrialSpec) -> dict[str, float]:
        """A device per rank: the layout's GPUs (a worker pool without GPUs gives CPUs instead)."""
        return {"GPU": float(trial.layout.gpus)}

    @property
    def early_stop(self) -> EarlyStop | None:
        """The multi-fidelity hook (callable(progress records) -> bool), set by the driver."""
        return self._cmd.early_stop

    @early_stop.setter
    def early_stop(self, fn: EarlyStop | None) -> None:
        self._cmd.early_stop = fn


def _exec_with_soft_limit(argv: Sequence[str]) -> None:
    """`python -m tuner.runners.local --soft-as BYTES -- CMD ...`: exec CMD under a soft RLIMIT_AS.
    Soft only, so the harness may set its own tighter cap; a wrapper, because preexec_fn is unsafe
    in the driver's threads."""
    if len(argv) < 4 or argv[0] != "--soft-as" or argv[2] != "--":
        sys.exit("usage: python -m tuner.runners.local --soft-as BYTES -- CMD ...")
    soft = int(argv[1])
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY:
        soft = min(soft, hard)
    resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
    os.execvp(argv[3], list(argv[3:]))


if __name__ == "__main__":
    _exec_with_soft_limit(sys.argv[1:])
