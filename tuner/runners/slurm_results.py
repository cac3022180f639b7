"""What a finished Slurm job says about its trial: the runner's own reason (timeout, early stop, a poller
or squeue that failed), Slurm's state (OUT_OF_MEMORY, TIMEOUT, NODE_FAIL, CANCELLED, ...), then the
trial's result.json (the harness or command template) or Megatron's iteration log (the megatron template).
"""

from __future__ import annotations

import json
from pathlib import Path

from tuner.runners import megatron
from tuner.runners.command import parse_result, stopped_result
from tuner.runners.failure_log import marked_lines, oom_in, oom_lines, tail, with_log_said, with_said
from tuner.runners.slurm_jobs import SQUEUE_GIVE_UP_S, Job, map_state
from tuner.trial import OOM_MARKERS, Status, TrialResult, TrialSpec, failed, host_memory, looks_oom


def job_result(trial: TrialSpec, job: Job, *, template: str, trial_timeout: float | None, warmup: int,
               peak_tflops: float) -> TrialResult:
    """The trial's result from its finished `job` (the runner's settings: template, timeout, Megatron
    warm-up iterations, the cluster's peak TFLOPS)."""
    log = job.trial_dir / f"slurm-{job.job_id}.out"
    log_path = str(log)
    log_tail = _tail_text(tail(log, 1500)) if log.exists() else "no log"
    if job.reason == "timeout":
        return _timed_out(trial, log, f"ran past --trial-timeout of {trial_timeout:g} s (from the job's start); "
                                      "scancelled")
    if job.reason == "stopped":
        res = stopped_result(job.progress, trial, f"at step {len(job.progress)}")
        res.log_path = log_path
        return res
    if job.reason == "poller":
        return failed(f"the runner's squeue poller failed ({job.state}); job scancelled", retryable=True,
                      log_path=log_path)
    if job.reason == "squeue":
        return failed(f"squeue failed for {SQUEUE_GIVE_UP_S:g} s; job state unknown, scancel sent", retryable=True,
                      log_path=log_path)
    status, retryable = map_state(job.state)
    host = host_memory(trial)
    if status == Status.OOM:
        said, first_oom = oom_lines(log, host)
        if not host and not first_oom:      # Slurm counts the job's host memory (its cgroup), never the GPUs'
            return failed(f"Slurm state {job.state}: the job ran out of its host memory (the cgroup's limit, not "
                          f"the GPUs'); {log_tail}", log_path=log_path)
        return with_said(failed(f"Slurm state {job.state}; {log_tail}", status, log_path=log_path), said)
    if status == Status.TIMEOUT:            # Slurm's own limit (the cluster file's time_limit): as the runner's
        return _timed_out(trial, log, f"Slurm state {job.state}; {log_tail}")
    if status == Status.INTERRUPTED:
        who = "cancelled" if job.reason == "cancelled" else "cancelled outside tuner (scancel?)"
        return TrialResult(Status.INTERRUPTED, message=who, log_path=log_path)
    if retryable:
        return failed(f"Slurm state {job.state}; {log_tail}", status, retryable=True, log_path=log_path)
    if template == "megatron":
        return _megatron_result(trial, job, log_path, warmup, peak_tflops)
    if (job.trial_dir / "result.json").exists():
        ran_on = cpu_run(job.trial_dir / "result.json", trial)
        if ran_on:
            return failed(ran_on, log_path=log_path)
        res = parse_result(job.trial_dir / "result.json", trial)
        res.log_path = log_path
        return with_log_said(res, log, host)
    said, first_oom = oom_lines(log, host)      # the whole log: its last 8 lines are often a launcher's summary
    if first_oom or looks_oom(log_tail, host):
        cause = said or first_oom
        return failed(f"out of memory: {cause + ' | ' if cause else ''}{log_tail}", Status.OOM, log_path=log_path)
    return failed(f"Slurm state {job.state}, no result.json; {log_tail}", log_path=log_path)


def _timed_out(trial: TrialSpec, log: Path, why: str) -> TrialResult:
    """A job stopped at a time limit (`why`: the runner's --trial-timeout, Slurm's --time): an OOM where a rank's
    result says so (the harness: the first failure wins, while the other ranks wait on it in a collective) or its
    log shows an out-of-memory error line, else a timeout."""
    said, first_oom = oom_lines(log, host_memory(trial))
    if (log.parent / "result.json").exists():
        ran_on = cpu_run(log.parent / "result.json", trial)
        if ran_on:                          # a CPU rank's OOM says nothing of the GPUs' memory
            return failed(f"{ran_on}; {why}", log_path=str(log))
        res = parse_result(log.parent / "result.json", trial)
        if res.status == Status.OOM:
            res.message, res.log_path = (res.message + "; " if res.message else "") + why, str(log)
            return with_said(res, said)
    if first_oom:
        return failed(f"out of memory, then {why}: {said or first_oom} | {_tail_text(tail(log, 1500))}", Status.OOM,
                      log_path=str(log))
    return failed(why, Status.TIMEOUT, log_path=str(log))


def _megatron_result(trial: TrialSpec, job: Job, log_path: str, warmup: int, peak_tflops: float) -> TrialResult:
    """The result Megatron's iteration log at `log_path` says; read once, a block at a time (a log can be GBs),
    keeping only the lines parse_log reads and the out-of-memory lines."""
    lines = list(marked_lines(Path(log_path), megatron.LOG_MARKERS + OOM_MARKERS))
    w, lay = trial.workload, trial.layout
    parsed = megatron.parse_log("\n".join(lines), w.model, w.gpus, recompute=lay.recompute,
                                global_batch=w.global_batch, warmup=warmup)
    if parsed is None:
        host = host_memory(trial)
        said, first_oom = oom_in(lines, host)
        status = Status.OOM if first_oom or any(looks_oom(line, host) for line in lines) else Status.FAILED
        cause = (said if status == Status.OOM else None) or first_oom
        return failed(f"Slurm state {job.state}, no iteration after warm-up in the log; "
                      f"{cause + ' | ' if cause else ''}{_tail_text(tail(Path(log_path), 1500))}", status,
                      log_path=log_path)
    msg = f"median of {parsed.iterations} iterations: {parsed.time_ms:.1f} ms"
    if parsed.mismatch:
        msg += f"; TFLOPs recomputed from samples processed ({parsed.mismatch})"
    return TrialResult(Status.OK, tflops_per_gpu=parsed.tflops,
                       peak_fraction=parsed.tflops / peak_tflops,
                       samples_per_second=parsed.samples_per_second, peak_memory_gb=parsed.peak_memory_gb,
                       peak_reserved_gb=parsed.peak_reserved_gb,
                       message=msg, log_path=log_path)


def _tail_text(text: str, n: int = 1500) -> str:
    """The last lines of a log's last `n` characters on one line, for a trial's message."""
    return " | ".join(text[-n:].strip().splitlines()[-8:]) or "empty log"


def cpu_run(path: Path, trial: TrialSpec) -> str | None:
    """Why the result at `path` is not the trial's measurement: the bundled harness says it trained on CPU cores (its
    `device`, on every result: the node showed it no CUDA device) while the trial's cluster describes GPUs (not device
    "cpu"); its step time and memory -- or its OOM, of the host's memory -- would be read as those GPUs'. None
    otherwise (another command's result says no device)."""
    try:
        device = str(json.loads(path.read_text(errors="replace")).get("device") or "")
    except (OSError, ValueError, AttributeError):
        return None
    if not device.startswith("cpu") or host_memory(trial):
        return None
    return (f"the harness trained on CPU cores (device {device!r}: the node showed it no CUDA device), but cluster "
            f"'{trial.workload.cluster.name}' describes GPUs: not stored as its measurement; run on its GPU nodes "
            "(the [slurm] partition / gres), or use a CPU cluster file (device = \"cpu\")")

