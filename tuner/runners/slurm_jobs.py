"""Slurm's side of the Slurm runner: submitting a job, watching every live job with one poller, cancelling.

One poller thread serves every `wait` in other threads: each round it asks `squeue -t all` about all live
jobs at once, and `sacct` only for jobs squeue no longer knows, when accounting is on (without it, the
job's own exit_status file decides). A job running past the trial timeout (from its start) is scancelled;
so is one whose progress the runner's early-stop hook judges clearly worse. `map_state` says what a Slurm
state means for a trial (tuner.runners.slurm_results reads the rest).
"""

from __future__ import annotations

import shutil
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from tuner.environment import inherited_env
from tuner.runners.command import read_progress, should_stop
from tuner.trial import Status

LIVE_STATES = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "REQUEUE_HOLD",
               "REQUEUE_FED", "RESIZING", "SIGNALING", "STAGE_OUT", "RESV_DEL_HOLD", "SPECIAL_EXIT"}
RETRY_STATES = {"NODE_FAIL", "BOOT_FAIL", "PREEMPTED"}
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
class Job:
    job_id: str
    trial_dir: Path
    done: threading.Event = field(default_factory=threading.Event)
    state: str = "PENDING"
    started: float | None = None     # monotonic time first seen running
    reason: str | None = None        # "timeout" / "cancelled" / "stopped" when the runner scancelled it
    missing: int = 0
    progress: list = field(default_factory=list)   # the harness's progress.jsonl records, for early stop


class SlurmQueue:
    """The jobs one Slurm runner has live, and the one poller that watches them."""

    def __init__(self, trial_timeout: float | None, poll_interval: float):
        self.trial_timeout, self.poll_interval = trial_timeout, poll_interval
        self._lock = threading.Lock()
        self._jobs: dict[str, Job] = {}
        self._poller: threading.Thread | None = None
        self._wake = threading.Event()
        self.cancelled = False
        self._sacct: bool | None = None   # accounting available? probed once
        self.squeue_calls = 0
        self._failing_since: float | None = None

    def cancel_all(self) -> None:
        """scancel every live job; waiting `wait` calls return their job, marked cancelled."""
        with self._lock:
            self.cancelled = True
            live = [j for j in self._jobs.values() if not j.done.is_set()]
            for j in live:
                j.reason = j.reason or "cancelled"
        self.scancel([j.job_id for j in live])
        self._wake.set()

    def submit(self, d: Path) -> tuple[str | None, str]:
        """sbatch the trial directory's job.sbatch; (job id, "") or (None, why)."""
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
        job = Job(job_id, d)
        with self._lock:
            self._jobs[job_id] = job
            if self.cancelled:
                job.reason = "cancelled"
            if self._poller is None or not self._poller.is_alive():
                self._poller = threading.Thread(target=self._poll_loop, name="slurm-poller", daemon=True)
                self._poller.start()
        if job.reason == "cancelled":
            self.scancel([job_id])
        self._wake.set()
        return job_id, ""

    def wait(self, job_id: str, d: Path, early_stop=None) -> Job:
        """The job once it ended (or was given up on); `early_stop(progress)` true scancels it early."""
        job, offset = self._jobs[job_id], 0
        while not job.done.wait(self.poll_interval):
            if early_stop is None or job.reason or job.started is None:
                continue
            offset = read_progress(d / "progress.jsonl", offset, job.progress)
            if job.progress and should_stop(early_stop, job.progress):
                job.reason = "stopped"
                self.scancel([job_id])
        job.done.wait()
        with self._lock:
            self._jobs.pop(job_id, None)
        return job

    def scancel(self, ids: list[str]) -> None:
        if ids:
            try:
                subprocess.run(["scancel", *ids], capture_output=True, timeout=60)
            except (OSError, subprocess.TimeoutExpired):
                pass   # the poller keeps watching; a job that survives ends by its time limit

    def squeue(self, ids: list[str], fmt: str = "%i|%T") -> dict[str, tuple[str, ...]] | None:
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
                self.scancel(list(live))
                raise
            self._wake.wait(self.poll_interval)
            self._wake.clear()

    def _poll_round(self, live: dict[str, Job]) -> None:
        states = self.squeue(list(live))
        now = time.monotonic()
        if states is None:
            self._failing_since = self._failing_since or now
            if now - self._failing_since > SQUEUE_GIVE_UP_S:
                for j in live.values():
                    j.state, j.reason = "SQUEUE_FAILED", "squeue"
                    j.done.set()
                self.scancel(list(live))   # best effort: no job left running unwatched
        else:
            self._failing_since = None
            gone = [i for i in live if i not in states]
            acct = self._sacct_states(gone) if gone else {}
            for i, job in live.items():
                self._update(job, states[i][0] if i in states else acct.get(i), now)

    def _update(self, job: Job, state: str | None, now: float) -> None:
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
            self.scancel([job.job_id])
