"""The Slurm runner: one sbatch job per trial, polled with one `squeue` call for all live jobs.

Per trial, in results/trials/<study>/<number>/ (the command runner's protocol): trial.json, the
rendered job.sbatch, job_id, slurm-<job id>.out, exit_status (written by the job itself, because
accounting may be off) and result.json (written by the harness or command on rank 0; for the
megatron template the runner parses the log instead).

One poller thread serves every run() call waiting in other threads: each round it asks `squeue -t all`
about all live jobs at once, and `sacct` only for jobs squeue no longer knows, when accounting is on.
Slurm states map to statuses: OUT_OF_MEMORY -> oom, TIMEOUT/DEADLINE -> timeout, NODE_FAIL/BOOT_FAIL/
PREEMPTED -> resubmitted `node_fail_retries` times, then failed with retryable=True, CANCELLED ->
interrupted (timeout when the runner cancelled it for --trial-timeout). Jobs are cancelled on
cancel(), on timeout, and by cancel_jobs() / cancel_study_jobs() when a study is resumed.
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from tuner.errors import UsageError
from tuner.render.sbatch import (missing_table_message, render_sbatch, time_limit_for,
                                 validate_slurm, TEMPLATES)
from tuner.runners import CPU_FRACTION, TrialRunner, megatron
from tuner.runners.command import inherited_env, parse_result, read_progress, should_stop, stopped_result, tail
from tuner.specs import ClusterSpec
from tuner.trial import Status, TrialResult, TrialSpec, failed, looks_oom, study_dir, trial_dir

LIVE_STATES = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "REQUEUE_HOLD",
               "REQUEUE_FED", "RESIZING", "SIGNALING", "STAGE_OUT", "RESV_DEL_HOLD", "SPECIAL_EXIT"}
RETRY_STATES = {"NODE_FAIL", "BOOT_FAIL", "PREEMPTED"}
NO_SBATCH = "sbatch not found: --runner slurm needs Slurm's client commands on PATH"
_TUNER_ROOT = str(Path(__file__).resolve().parents[2])   # so ranks import this tuner, installed or not
SQUEUE_GIVE_UP_S = 300.0   # squeue failing this long -> live trials end as retryable failures


def map_state(state: str) -> tuple[Status | None, bool]:
    """(status, retryable) for a Slurm job state; status None means the job is still live, and
    COMPLETED/FAILED map to FAILED here because their trial's result.json or log decides."""
    state = state.split()[0].rstrip("+").upper() if state else "UNKNOWN"
    if state in LIVE_STATES:
        return None, False
    if state == "OUT_OF_MEMORY":
        return Status.OOM, False
    if state in ("TIMEOUT", "DEADLINE"):
        return Status.TIMEOUT, False
    if state in RETRY_STATES:
        return Status.FAILED, True
    if state == "CANCELLED":
        return Status.INTERRUPTED, False
    if state == "COMPLETED":
        return Status.OK, False
    return Status.FAILED, False


@dataclass
class _Job:
    job_id: str
    trial_dir: Path
    done: threading.Event = field(default_factory=threading.Event)
    state: str = "PENDING"
    started: float | None = None     # monotonic time first seen running
    reason: str | None = None        # "timeout" / "cancelled" / "stopped" when the runner scancelled it
    missing: int = 0
    progress: list = field(default_factory=list)   # the harness's progress.jsonl records, for early stop


class SlurmRunner(TrialRunner):
    name = "slurm"

    def __init__(self, cluster: ClusterSpec, template: str = "harness", results_dir: Path | str = Path("results"),
                 trial_timeout: float | None = None, poll_interval: float = 2.0, python: str = sys.executable,
                 command: list[str] | None = None, node_fail_retries: int = 1, warmup: int = 1):
        if not cluster.slurm:
            raise UsageError(missing_table_message(cluster.name))
        if shutil.which("sbatch") is None or shutil.which("squeue") is None:
            raise UsageError(NO_SBATCH)
        if template not in TEMPLATES:
            raise UsageError(f"unknown Slurm template '{template}'; templates: {', '.join(TEMPLATES)}")
        if template == "command" and not command:
            raise UsageError("template 'command' needs command=[argv ...]")
        if trial_timeout is not None and trial_timeout <= 0:
            raise UsageError(f"--trial-timeout must be > 0 seconds (got {trial_timeout})")
        self.slurm = validate_slurm(cluster.slurm, f"cluster '{cluster.name}' [slurm]")
        if isinstance(command, str):   # like the command runner: split like a shell, run without one
            command = shlex.split(command)
        self.cluster, self.template, self.python, self.command = cluster, template, python, command
        self.results_dir = Path(results_dir)
        self.trial_timeout, self.poll_interval = trial_timeout, poll_interval
        self.node_fail_retries, self.warmup = node_fail_retries, warmup
        self._lock = threading.Lock()
        self._jobs: dict[str, _Job] = {}
        self._poller: threading.Thread | None = None
        self._wake = threading.Event()
        self._cancelled = False
        self._sacct: bool | None = None   # accounting available? probed once
        self.squeue_calls = 0
        self._failing_since: float | None = None
        self.early_stop = None   # the driver's multi-fidelity hook: callable(progress records) -> bool

    # ------------------------------------------------------------------------------------ public
    def trial_dir(self, trial: TrialSpec) -> Path:
        if trial.trial_dir is not None:
            return Path(trial.trial_dir)
        return trial_dir(self.results_dir, trial.study, trial.number)

    def run(self, trial: TrialSpec) -> TrialResult:
        d = self.trial_dir(trial).resolve()
        d.mkdir(parents=True, exist_ok=True)
        for stale in ("result.json", "exit_status", "job_id"):
            (d / stale).unlink(missing_ok=True)
        (d / "trial.json").write_text(json.dumps(trial.as_json(), indent=2) + "\n")
        script = render_sbatch(trial, self.slurm, template=self.template, python=self.python, trial_dir=d,
                               time_limit=None if self.slurm["time_limit"] else time_limit_for(self.trial_timeout),
                               command=self.command, pythonpath=_TUNER_ROOT)
        (d / "job.sbatch").write_text(script)
        jobs: list[str] = []
        for attempt in range(self.node_fail_retries + 1):
            if self._cancelled:
                return TrialResult(Status.INTERRUPTED, message="cancelled before submission")
            job_id, err = self._submit(d)
            if job_id is None:
                return failed(f"sbatch failed: {err}", retryable=True)
            jobs.append(job_id)
            job = self._wait(job_id, d)
            result = self._result(trial, job)
            if not result.retryable or attempt == self.node_fail_retries:
                break
            (d / "result.json").unlink(missing_ok=True)
            (d / "exit_status").unlink(missing_ok=True)
        result.message = f"slurm job {','.join(jobs)}: {result.message}".rstrip(": ")
        return result

    def cancel(self) -> None:
        """scancel every job this runner has live; waiting run() calls return INTERRUPTED."""
        with self._lock:
            self._cancelled = True
            live = [j for j in self._jobs.values() if not j.done.is_set()]
            for j in live:
                j.reason = j.reason or "cancelled"
        self._scancel([j.job_id for j in live])
        self._wake.set()

    def resources(self, trial: TrialSpec) -> dict[str, float]:
        """A tenth of a CPU: the trial runs as a Slurm job, not in the worker."""
        return {"CPU": CPU_FRACTION}

    def cancel_jobs(self, job_ids) -> list[str]:
        """scancel those of `job_ids` that are still queued or running and are tuner's (by job name);
        for resuming an interrupted study. Returns the ids cancelled."""
        ids = [str(i).strip() for i in job_ids if str(i).strip().isdigit()]
        if not ids:
            return []
        out = self._squeue(ids, fmt="%i|%T|%j")
        if out is None:
            return []
        mine = [i for i, (state, name) in out.items() if state in LIVE_STATES and name.startswith("tuner-")]
        self._scancel(mine)
        return mine

    def job_ids_for(self, study: str) -> list[str]:
        """The job ids recorded in the trial directories of `study` (results/trials/<study>/*/job_id)."""
        base = study_dir(self.results_dir, study)
        return sorted({p.read_text().strip() for p in base.glob("*/job_id")}) if base.is_dir() else []

    def cancel_study_jobs(self, study: str) -> list[str]:
        """Cancel the jobs an interrupted driver left behind for `study` (call on resume)."""
        return self.cancel_jobs(self.job_ids_for(study))

    # ---------------------------------------------------------------------------------- effects
    def _submit(self, d: Path) -> tuple[str | None, str]:
        # --no-requeue: a node failure comes back to the runner, which resubmits it once itself.
        cmd = ["sbatch", "--parsable", "--no-requeue", f"--chdir={d}", f"--output={d}/slurm-%j.out",
               str(d / "job.sbatch")]
        try:
            # sbatch exports the submitter's environment to the job: not the store URL (a password)
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=inherited_env())
        except (OSError, subprocess.TimeoutExpired) as exc:
            return None, str(exc)
        job_id = p.stdout.strip().split(";")[0]
        if p.returncode != 0 or not job_id.isdigit():
            return None, (p.stderr or p.stdout).strip()[-500:]
        (d / "job_id").write_text(job_id + "\n")
        job = _Job(job_id, d)
        with self._lock:
            self._jobs[job_id] = job
            if self._cancelled:
                job.reason = "cancelled"
            if self._poller is None or not self._poller.is_alive():
                self._poller = threading.Thread(target=self._poll_loop, name="slurm-poller", daemon=True)
                self._poller.start()
        if job.reason == "cancelled":
            self._scancel([job_id])
        self._wake.set()
        return job_id, ""

    def _wait(self, job_id: str, d: Path) -> _Job:
        job, offset = self._jobs[job_id], 0
        while not job.done.wait(self.poll_interval):
            if self.early_stop is None or job.reason or job.started is None:
                continue
            offset = read_progress(d / "progress.jsonl", offset, job.progress)
            if job.progress and should_stop(self.early_stop, job.progress):
                job.reason = "stopped"
                self._scancel([job_id])
        job.done.wait()
        with self._lock:
            self._jobs.pop(job_id, None)
        return job

    def _scancel(self, ids: list[str]) -> None:
        if ids:
            try:
                subprocess.run(["scancel", *ids], capture_output=True, timeout=60)
            except (OSError, subprocess.TimeoutExpired):
                pass   # the poller keeps watching; a job that survives ends by its time limit

    def _squeue(self, ids: list[str], fmt: str = "%i|%T") -> dict[str, tuple[str, ...]] | None:
        """{job id: fields after the id} for the jobs squeue still knows; None when squeue failed."""
        self.squeue_calls += 1
        try:
            p = subprocess.run(["squeue", "-h", "-t", "all", "-j", ",".join(ids), "-o", fmt],
                               capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            return None
        if p.returncode != 0:
            return {} if "Invalid job id" in p.stderr else None
        out = {}
        for line in p.stdout.splitlines():
            parts = line.strip().split("|")
            if parts and parts[0] in ids:
                out[parts[0]] = tuple(parts[1:])
        return out

    def _sacct_states(self, ids: list[str]) -> dict[str, str]:
        if self._sacct is False or not shutil.which("sacct"):
            self._sacct = False
            return {}
        try:
            p = subprocess.run(["sacct", "-n", "-X", "-P", "-j", ",".join(ids), "-o", "JobID,State"],
                               capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            return {}
        if p.returncode != 0 or "disabled" in p.stderr:
            self._sacct = False
            return {}
        self._sacct = True
        return {a: b for a, _, b in (l.partition("|") for l in p.stdout.splitlines()) if a in ids}

    def _poll_loop(self) -> None:
        while True:
            with self._lock:
                live = {i: j for i, j in self._jobs.items() if not j.done.is_set()}
                if not live:
                    self._poller = None
                    return
            try:
                self._poll_round(live)
            except Exception as exc:   # never leave run() callers waiting on a dead poller
                with self._lock:
                    for j in live.values():
                        j.state, j.reason = f"poller error {type(exc).__name__}: {exc}", "poller"
                        j.done.set()
                self._scancel(list(live))
                raise
            self._wake.wait(self.poll_interval)
            self._wake.clear()

    def _poll_round(self, live: dict[str, _Job]) -> None:
        states = self._squeue(list(live))
        now = time.monotonic()
        if states is None:
            self._failing_since = self._failing_since or now
            if now - self._failing_since > SQUEUE_GIVE_UP_S:
                for j in live.values():
                    j.state, j.reason = "SQUEUE_FAILED", "squeue"
                    j.done.set()
                self._scancel(list(live))   # best effort: no job left running unwatched
        else:
            self._failing_since = None
            gone = [i for i in live if i not in states]
            acct = self._sacct_states(gone) if gone else {}
            for i, job in live.items():
                self._update(job, states[i][0] if i in states else acct.get(i), now)

    def _update(self, job: _Job, state: str | None, now: float) -> None:
        if state is None:   # squeue forgot it and there is no accounting: the job's own file decides
            rc = job.trial_dir / "exit_status"
            job.missing += 1
            if rc.exists():
                state = "COMPLETED" if rc.read_text().strip() == "0" else "FAILED"
            elif job.missing >= 3:
                state = "UNKNOWN"
            else:
                return
        job.state = state.split()[0].rstrip("+")
        if job.state != "PENDING" and job.started is None:
            job.started = now
        status, _ = map_state(job.state)
        if status is not None:
            job.done.set()
        elif (self.trial_timeout and job.started is not None and job.reason is None
              and now - job.started > self.trial_timeout):
            job.reason = "timeout"
            self._scancel([job.job_id])

    # ---------------------------------------------------------------------------------- results
    def _result(self, trial: TrialSpec, job: _Job) -> TrialResult:
        log = job.trial_dir / f"slurm-{job.job_id}.out"
        log_path = str(log)
        log_tail = _tail_text(tail(log, 1500)) if log.exists() else "no log"
        if job.reason == "timeout":
            return failed(f"ran past --trial-timeout of {self.trial_timeout:g} s (from the job's start); scancelled",
                          Status.TIMEOUT,
                          log_path=log_path)
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
        if status == Status.INTERRUPTED:
            who = "cancelled" if job.reason == "cancelled" else "cancelled outside tuner (scancel?)"
            return TrialResult(Status.INTERRUPTED, message=who, log_path=log_path)
        if status in (Status.OOM, Status.TIMEOUT) or retryable:
            return failed(f"Slurm state {job.state}; {log_tail}", status, retryable=retryable, log_path=log_path)
        if self.template == "megatron":
            return self._megatron_result(trial, job, log_path)
        if (job.trial_dir / "result.json").exists():
            res = parse_result(job.trial_dir / "result.json", trial)
            res.log_path = log_path
            return res
        if looks_oom(log_tail):
            return failed(f"out of memory: {log_tail}", Status.OOM, log_path=log_path)
        return failed(f"Slurm state {job.state}, no result.json; {log_tail}", log_path=log_path)

    def _megatron_result(self, trial: TrialSpec, job: _Job, log_path: str) -> TrialResult:
        text = Path(log_path).read_text(errors="replace") if Path(log_path).exists() else ""
        w, lay = trial.workload, trial.layout
        parsed = megatron.parse_log(text, w.model, w.gpus, recompute=lay.recompute,
                                    global_batch=w.global_batch, warmup=self.warmup)
        if parsed is None:
            status = Status.OOM if looks_oom(text) else Status.FAILED
            return failed(f"Slurm state {job.state}, no iteration after warm-up in the log; {_tail_text(text)}",
                          status, log_path=log_path)
        msg = f"median of {parsed.iterations} iterations: {parsed.time_ms:.1f} ms"
        if parsed.mismatch:
            msg += f"; TFLOPs recomputed from samples processed ({parsed.mismatch})"
        return TrialResult(Status.OK, tflops_per_gpu=parsed.tflops,
                           peak_fraction=parsed.tflops / self.cluster.peak_tflops,
                           samples_per_second=parsed.samples_per_second, peak_memory_gb=parsed.peak_memory_gb,
                           message=msg, log_path=log_path)


def _tail_text(text: str, n: int = 1500) -> str:
    """The last lines of a log's last `n` characters on one line, for a trial's message."""
    return " | ".join(text[-n:].strip().splitlines()[-8:]) or "empty log"
