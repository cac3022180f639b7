"""The Slurm runner: one sbatch job per trial, polled with one `squeue` call for all live jobs.

Per trial, in results/trials/<study>/<number>/ (the command runner's protocol): trial.json, the
rendered job.sbatch, job_id, slurm-<job id>.out, exit_status (written by the job itself, because
accounting may be off) and result.json (written by the harness or command on rank 0; for the
megatron template the runner parses the log instead).

One poller thread serves every run() call waiting in other threads: each round it asks `squeue -t all`
about all live jobs at once, and `sacct` only for jobs squeue no longer knows, when accounting is on.
Slurm states map to statuses: OUT_OF_MEMORY -> oom (on GPUs only where the log shows the GPUs' OOM:
slurm_results), TIMEOUT/DEADLINE -> timeout, NODE_FAIL/BOOT_FAIL/PREEMPTED -> resubmitted `node_fail_retries`
times, then failed with retryable=True, CANCELLED -> interrupted (timeout when the runner cancelled it for
--trial-timeout). Jobs are cancelled on cancel(), on timeout, and by cancel_jobs() / cancel_study_jobs() when a
study is resumed.

Three rooms: this one submits (the script, resubmission after a node failure) and answers for the
runner; tuner.runners.slurm_jobs polls and cancels (SlurmQueue, one poller for every live job) and says
what a Slurm state means (map_state); tuner.runners.slurm_results reads a finished job's result.
"""

from __future__ import annotations

import json
import shlex
import shutil
import sys
from pathlib import Path

from tuner.errors import UsageError
from tuner.render.sbatch import (missing_table_message, render_sbatch, time_limit_for,
                                 validate_slurm, TEMPLATES)
from tuner.runners import CPU_FRACTION, TrialRunner
from tuner.runners.slurm_jobs import LIVE_STATES, SlurmQueue
from tuner.runners.slurm_results import job_result
from tuner.specs import ClusterSpec
from tuner.trial import Status, TrialResult, TrialSpec, failed, study_dir, trial_dir

NO_SBATCH = "sbatch not found: --runner slurm needs Slurm's client commands on PATH"
_TUNER_ROOT = str(Path(__file__).resolve().parents[2])   # so ranks import this tuner, installed or not


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
        self._queue = SlurmQueue(trial_timeout, poll_interval)
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
            if self._queue.cancelled:
                return TrialResult(Status.INTERRUPTED, message="cancelled before submission")
            job_id, err = self._queue.submit(d)
            if job_id is None:
                return failed(f"sbatch failed: {err}", retryable=True)
            jobs.append(job_id)
            job = self._queue.wait(job_id, d, self.early_stop)
            result = job_result(trial, job, template=self.template, trial_timeout=self.trial_timeout,
                                warmup=self.warmup, peak_tflops=self.cluster.peak_tflops)
            if not result.retryable or attempt == self.node_fail_retries:
                break
            (d / "result.json").unlink(missing_ok=True)
            (d / "exit_status").unlink(missing_ok=True)
        result.message = f"slurm job {','.join(jobs)}: {result.message}".rstrip(": ")
        return result

    def cancel(self) -> None:
        """scancel every job this runner has live; waiting run() calls return INTERRUPTED."""
        self._queue.cancel_all()

    @property
    def squeue_calls(self) -> int:
        """How many `squeue` calls this runner made (benchmarks/slurm_overhead.py)."""
        return self._queue.squeue_calls

    def resources(self, trial: TrialSpec) -> dict[str, float]:
        """A tenth of a CPU: the trial runs as a Slurm job, not in the worker."""
        return {"CPU": CPU_FRACTION}

    def cancel_jobs(self, job_ids) -> list[str]:
        """scancel those of `job_ids` that are still queued or running and are tuner's (by job name);
        for resuming an interrupted study. Returns the ids cancelled."""
        ids = [str(i).strip() for i in job_ids if str(i).strip().isdigit()]
        if not ids:
            return []
        out = self._queue.squeue(ids, fmt="%i|%T|%j")
        if out is None:
            return []
        mine = [i for i, (state, name) in out.items() if state in LIVE_STATES and name.startswith("tuner-")]
        self._queue.scancel(mine)
        return mine

    def job_ids_for(self, study: str) -> list[str]:
        """The job ids recorded in the trial directories of `study` (results/trials/<study>/*/job_id)."""
        base = study_dir(self.results_dir, study)
        return sorted({p.read_text().strip() for p in base.glob("*/job_id")}) if base.is_dir() else []

    def cancel_study_jobs(self, study: str) -> list[str]:
        """Cancel the jobs an interrupted driver left behind for `study` (call on resume)."""
        return self.cancel_jobs(self.job_ids_for(study))
