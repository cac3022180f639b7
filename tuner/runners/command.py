"""The command runner: any user training command, driven through a small file-and-environment protocol.

For each trial the runner creates the trial directory (results/trials/<study>/<number>/), writes
`trial.json` (TrialSpec.as_json) and runs the command there as an argv list (shlex-split, never
through a shell unless the command itself is `bash -c ...`) in a new session, so the whole process
group can be killed. Relative paths in the command mean files in the directory tuner was started
from (TUNER_START_DIR): argv[0] when it contains a '/', and every argument (or `--opt=value` value)
naming an existing file there, are made absolute (`resolve_relative`). The environment is tuner's
without the store's secrets (tuner.environment). The command reads TUNER_* environment
variables or trial.json and writes its result JSON to $TUNER_RESULT_JSON:

    {"status": "ok" | "oom" | "failed", "samples_per_second": .. (or "step_time_s": ..),
     "peak_memory_gb": .. (optional), "peak_reserved_gb": .. (optional), "message": ".." (optional)}

peak_memory_gb is max_memory_allocated, peak_reserved_gb the caching allocator's max_memory_reserved (GB of
1e9 bytes); tuner keeps the latter in the trial's extra and, when it is larger, counts it as the run's need.

Status ok needs samples_per_second > 0 (or step_time_s > 0: samples/s = global batch / step time);
tuner derives MFU, Megatron's TFLOPS and the fraction of peak from it (tuner.metrics), so a
result's own tflops_per_gpu / peak_fraction are ignored, and one with only tflops_per_gpu is failed.
Per-step records appended to $TUNER_TRIAL_DIR/progress.jsonl (JSON lines with `samples_per_second`;
`step`, `elapsed`, `tflops_per_gpu` optional) feed the driver's early-stop hook.

Outcomes: a valid result -> its status; past `trial_timeout` -> SIGTERM, then SIGKILL to the process
group and every descendant seen -> timeout; `cancel()` -> interrupted; `early_stop(progress)` true
-> stopped, with the samples/s of its latest progress record; no result -> oom if stderr shows an
out-of-memory marker, else failed with the exit status or signal and the stderr tail. `run` never
raises for a trial's own failure.
"""

from __future__ import annotations

import json
import math
import os
import shlex
import subprocess
import threading
import time
from pathlib import Path
from typing import Callable, Sequence


from tuner.environment import inherited_env, withhold, withheld
from tuner.errors import UsageError
from tuner.metrics import complete, samples_from_step_time
from tuner.runners import CPU_FRACTION, TrialRunner
from tuner.runners.failure_log import oom_lines, root_cause, tail, with_log_said
from tuner.runners.process import ProcessTree, kill_leftovers, signal_name
from tuner.trial import (Status, TrialResult, TrialSpec, failed, host_memory, kept_message, looks_oom, study_dir,
                         trial_dir)

RESULT_STATUSES = {"ok": Status.OK, "oom": Status.OOM, "failed": Status.FAILED}
NUMBER_FIELDS = ("samples_per_second", "step_time_s", "peak_memory_gb", "peak_reserved_gb")
# A result's own `tflops_per_gpu` / `peak_fraction` are ignored: tuner derives MFU and Megatron's count
# from samples/s and the model spec (tuner.metrics), so every runner is ranked on the same footing.
# Failures of the launcher, not of the layout: worth one more try (issue 8).
RETRY_MARKERS = ("address already in use", "eaddrinuse", "rendezvous", "connection refused")

EarlyStop = Callable[[list], bool]


def parse_result(path: Path, trial: TrialSpec) -> TrialResult:
    """Read a result JSON; anything malformed is a failed result that names the file and the fix.
    MFU, TFLOPS and fraction of peak come from the result's samples/s (tuner.metrics.complete)."""
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        return failed(f"result file {path} is not valid JSON ({exc}); the command must write a JSON "
                      "object with a 'status' of ok, oom or failed")
    except (OSError, UnicodeDecodeError) as exc:
        return failed(f"result file {path} cannot be read: {exc}")
    return result_from_dict(data, trial, f"result file {path}", "the command must write")


def result_from_dict(data, trial: TrialSpec, where: str, must: str) -> TrialResult:
    """A result object (the command runner's result.json, a Python trial function's dict) as a
    TrialResult; anything malformed is a failed result naming `where` and what it `must` give."""
    if not isinstance(data, dict) or "status" not in data:
        return failed(f"{where} has no 'status'; {must} a JSON object with a 'status' of ok, oom or failed")
    status = RESULT_STATUSES.get(str(data["status"]).lower())
    if status is None:
        return failed(f"{where}: status {data['status']!r} is not one of ok, oom, failed")
    values = {}
    for key in NUMBER_FIELDS:
        v = data.get(key)
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
            return failed(f"{where}: '{key}' must be a finite number >= 0, got {v!r}")
        values[key] = float(v)
    step = values.pop("step_time_s", None)
    if not values.get("samples_per_second") and step:
        values["samples_per_second"] = samples_from_step_time(step, trial.workload)
    if status == Status.OK and not values.get("samples_per_second"):
        return failed(f"{where}: status ok needs 'samples_per_second' (or 'step_time_s') > 0, "
                      "and it has neither; tuner derives MFU and TFLOPS from it ('tflops_per_gpu' alone "
                      "is not accepted)")
    result = TrialResult(status, message=kept_message(str(data.get("message") or ""), status), **values)
    return complete(result, trial.workload, trial.layout)


def resolve_relative(argv: list[str], start: Path) -> list[str]:
    """`argv` with its relative paths made absolute against `start` (the directory tuner was started
    from), since the command runs in its trial directory: argv[0] when it contains a '/', and every
    later argument, or value of `--option=value`, that names an existing file or directory there."""
    first = argv[0]
    if "/" in first and not os.path.isabs(first):
        first = os.path.abspath(os.path.join(start, first))
    return [first, *(_resolve_arg(a, start) for a in argv[1:])]


def _resolve_arg(arg: str, start: Path) -> str:
    if arg.startswith("-"):
        opt, eq, value = arg.partition("=")
        return f"{opt}={_resolve_arg(value, start)}" if eq and value and not value.startswith("-") else arg
    if not arg or os.path.isabs(arg):
        return arg
    path = os.path.abspath(os.path.join(start, arg))
    try:
        return path if os.path.exists(path) else arg
    except (OSError, ValueError):
        return arg


class CommandRunner(TrialRunner):
    """Runs `command` once per trial; see the module docstring for the protocol."""

    name = "command"

    def __init__(self, command: str | Sequence[str], trial_timeout: float | None = None,
                 results_dir: Path | str = Path("results"), env: dict[str, str] | None = None,
                 early_stop: EarlyStop | None = None, kill_grace: float = 5.0, poll_interval: float = 0.5,
                 resolve_paths: bool = True, host_memory: bool | None = None):
        try:
            argv = shlex.split(command) if isinstance(command, str) else [str(a) for a in command]
        except ValueError as exc:       # "No closing quotation", "No escaped character"
            raise UsageError(f"--command {command!r} does not split as a shell would ({exc}): balance its quotes, or "
                             "escape the character") from None
        if not argv:
            raise UsageError("the command runner needs a command: --command \"python train.py\"")
        self.start_dir = Path.cwd()   # where tuner was started: the command's relative paths mean files here
        if resolve_paths:
            argv = resolve_relative(argv, self.start_dir)
        if trial_timeout is not None and trial_timeout <= 0:
            raise UsageError(f"--trial-timeout must be > 0 seconds (got {trial_timeout})")
        self.argv, self.trial_timeout, self.results_dir = argv, trial_timeout, Path(results_dir)
        self.env = {str(k): str(v) for k, v in (env or {}).items()}
        self.early_stop, self.kill_grace, self.poll_interval = early_stop, kill_grace, poll_interval
        self.host_memory = host_memory   # whether the host's memory is the ranks' (None: the trial's cluster says)
        self._live: set[ProcessTree] = set()
        self._lock = threading.Lock()
        self._cancelled = threading.Event()

    def __getstate__(self) -> dict:   # sent to Ray workers: locks and live processes stay behind
        state = {k: v for k, v in self.__dict__.items() if k not in ("_live", "_lock", "_cancelled")}
        state["early_stop"] = None
        state["_withheld"] = withheld()   # the store's passwords stay withheld on the worker too
        return state

    def __setstate__(self, state: dict) -> None:
        withhold(*state.pop("_withheld", ()))
        self.__dict__.update(state)
        self._live, self._lock, self._cancelled = set(), threading.Lock(), threading.Event()

    # -- the protocol -------------------------------------------------------------------------
    def trial_dir(self, trial: TrialSpec) -> Path:
        if trial.trial_dir is not None:
            return Path(trial.trial_dir).resolve()   # the command runs inside it: env paths must be absolute
        return trial_dir(self.results_dir, trial.study, trial.number).resolve()

    def run(self, trial: TrialSpec, argv: Sequence[str] | None = None,
            extra_env: dict[str, str] | None = None, timeout: float | None = None) -> TrialResult:
        """Run one trial. `argv`, `extra_env` and `timeout` let a wrapping runner (local) adapt the
        command; users leave them unset."""
        try:
            d = self.trial_dir(trial)
        except UsageError as exc:
            return failed(str(exc))
        result = self._run(trial, d, list(argv or self.argv), extra_env or {},
                           self.trial_timeout if timeout is None else timeout)
        result.log_path = str(d)
        return result

    def cancel(self) -> None:
        """Kill every live trial (its whole process group); those runs return INTERRUPTED, and so
        does every later call to run."""
        self._cancelled.set()
        with self._lock:
            live = list(self._live)
        threads = [threading.Thread(target=r.kill, args=(Status.INTERRUPTED, self.kill_grace)) for r in live]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    def resources(self, trial: TrialSpec) -> dict[str, float]:
        """A tenth of a CPU: the command does its own work (often elsewhere)."""
        return {"CPU": CPU_FRACTION}

    def cancel_study_jobs(self, study: str) -> list[str]:
        """On resume: kill what a driver that died without cleanup (SIGKILL, a lost node) left running for
        `study`. Returns the trial numbers whose processes were killed."""
        base = study_dir(self.results_dir, study).resolve()
        hit = kill_leftovers([d for d in base.glob("*") if d.is_dir()])
        return sorted((Path(h).name for h in hit), key=lambda n: (len(n), n))

    # -- the work -----------------------------------------------------------------------------
    def _run(self, trial: TrialSpec, d: Path, argv: list[str], extra_env: dict[str, str],
             timeout: float | None) -> TrialResult:
        if self._cancelled.is_set():
            return TrialResult(Status.INTERRUPTED, message="cancelled before it started")
        result_path = d / "result.json"
        kill_leftovers([d])   # a driver killed by SIGKILL may have left this trial's last attempt running
        try:
            d.mkdir(parents=True, exist_ok=True)
            for stale in ("result.json", "progress.jsonl"):   # a resumed trial must not read old files
                (d / stale).unlink(missing_ok=True)
            (d / "trial.json").write_text(json.dumps(trial.as_json(), indent=2) + "\n")
        except OSError as exc:
            return failed(f"cannot prepare trial directory {d}: {exc.strerror or exc}; check that "
                          "--results-dir is writable")
        env = {**inherited_env(), **self.env, **extra_env, **trial.env(result_path),
               "TUNER_START_DIR": str(self.start_dir)}
        stdout_path, stderr_path = d / "stdout.log", d / "stderr.log"
        try:
            with open(stdout_path, "wb") as out, open(stderr_path, "wb") as err:
                proc = subprocess.Popen(argv, cwd=d, env=env, stdout=out, stderr=err,
                                        stdin=subprocess.DEVNULL, start_new_session=True)
        except FileNotFoundError:
            why = (" (PATH was withheld from the trial: it contains the store's password)"
                   if "PATH" in os.environ and "PATH" not in env else "")
            return failed(f"command not found: {argv[0]!r}; check --command and PATH{why} "
                          "(the command runs without a shell)")
        except PermissionError:
            return failed(f"command {argv[0]!r} is not executable: chmod +x it or run it through its "
                          "interpreter (python script.py)")
        except OSError as exc:
            return failed(f"cannot start {argv[0]!r}: {exc.strerror or exc}")
        run = ProcessTree(proc)
        (d / "pgid").write_text(str(proc.pid))   # marks a started attempt, for kill_leftovers after a crash
        with self._lock:
            self._live.add(run)
        try:
            if self._cancelled.is_set():        # cancel() ran between the check above and add()
                run.kill(Status.INTERRUPTED, self.kill_grace)
            started = time.monotonic()
            self._wait(run, d, started, timeout)
            elapsed = time.monotonic() - started
        finally:
            run.kill(None, min(self.kill_grace, 1.0))   # reap stragglers left behind by the command
            proc.wait()
            kill_leftovers([d])   # and any that left the tree unseen (forked into a session of its own, its
            #                       parent gone, between two looks): they carry this trial's TUNER_TRIAL_DIR
            with self._lock:
                self._live.discard(run)
        return self._classify(trial, run, result_path, stderr_path, elapsed, timeout)

    def _wait(self, run: ProcessTree, d: Path, started: float, timeout: float | None) -> None:
        progress, offset = [], 0
        while True:
            try:
                run.proc.wait(self.poll_interval)
                return
            except subprocess.TimeoutExpired:
                pass
            if run.reason is not None:          # cancel() is killing it
                continue
            run.track()
            if timeout is not None and time.monotonic() - started > timeout:
                run.kill(Status.TIMEOUT, self.kill_grace)
            elif self.early_stop is not None:
                offset = read_progress(d / "progress.jsonl", offset, progress)
                if progress and should_stop(self.early_stop, progress):
                    run.progress = list(progress)
                    run.kill(Status.STOPPED, self.kill_grace)

    def _classify(self, trial: TrialSpec, run: ProcessTree, result_path: Path, stderr_path: Path,
                  elapsed: float, timeout: float | None) -> TrialResult:
        rc = run.proc.returncode
        host = host_memory(trial) if self.host_memory is None else self.host_memory
        if run.reason == Status.INTERRUPTED:
            return TrialResult(Status.INTERRUPTED, message="cancelled: the driver stopped while it ran")
        if run.reason == Status.STOPPED:
            return stopped_result(run.progress, trial, f"after {elapsed:.1f}s")
        if run.reason == Status.TIMEOUT:
            if result_path.exists():
                r = parse_result(result_path, trial)
                if r.status != Status.FAILED:
                    r.message = (r.message + "; " if r.message else "") + "hung after writing its result: killed"
                    return with_log_said(r, stderr_path, host)
            said, first_oom = oom_lines(stderr_path, host)   # one rank ran out; the others waited in a collective
            if first_oom:
                return failed(f"out of memory, then ran past --trial-timeout {timeout:g}s (killed its process "
                              f"group): {said or first_oom} | stderr tail: {tail(stderr_path, 500)}", Status.OOM)
            return TrialResult(Status.TIMEOUT, message=f"ran past --trial-timeout {timeout:g}s: killed its "
                               f"process group; raise --trial-timeout if the layout is just slow. stderr tail: "
                               f"{tail(stderr_path, 500)}"[-2000:])
        if result_path.exists():
            r = parse_result(result_path, trial)
            if rc != 0 and r.status == Status.OK:
                r.message = (r.message + "; " if r.message else "") + f"exit status {rc} after writing the result"
            return with_log_said(r, stderr_path, host)
        said, first_oom = oom_lines(stderr_path, host)
        err = tail(stderr_path)
        oom = bool(first_oom) or looks_oom(err, host)
        cause = (said if oom else None) or first_oom or root_cause(tail(stderr_path, 20000))
        err = f"{cause} | stderr tail: {err}" if cause else f"stderr tail: {err}"
        if oom:
            return failed(f"out of memory (exit status {rc}, no result): {err}", status=Status.OOM)
        if rc < 0:
            return failed(f"killed by {signal_name(-rc)} (no result written); {err}")
        if rc == 0:
            return failed(f"exited 0 but wrote no result to {result_path}: the command must write its result "
                          "JSON to $TUNER_RESULT_JSON. " + err)
        retry = any(m in err.lower() for m in RETRY_MARKERS)
        return failed(f"exit status {rc} (no result written); {err}", retryable=retry)


def read_progress(path: Path, offset: int, records: list) -> int:
    """Append the complete new lines of progress.jsonl to `records`; return the new offset."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            chunk = f.read()
    except OSError:
        return offset
    end = chunk.rfind(b"\n") + 1
    for line in chunk[:end].splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return offset + end


def stopped_result(progress: list, trial: TrialSpec, when: str) -> TrialResult:
    """A trial stopped early keeps its partial measurement: it is real, just short. Its throughput is
    the `samples_per_second` of its latest progress record that has one."""
    sps = [r["samples_per_second"] for r in progress if isinstance(r, dict) and _positive(r.get("samples_per_second"))]
    result = TrialResult(Status.STOPPED, samples_per_second=float(sps[-1]) if sps else None,
                         message=f"stopped early {when}: clearly worse than the best so far")
    return complete(result, trial.workload, trial.layout)


def _positive(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0


def should_stop(early_stop: EarlyStop, progress: list) -> bool:
    """Ask the driver's early-stop hook about a trial's progress records; its bugs never kill a trial."""
    try:
        return bool(early_stop(list(progress)))
    except Exception:     # a searcher's bug must not kill a healthy trial; the driver will see it on tell
        return False
