"""Process trees of running trials: kill a trial with every descendant, and reap what a dead driver left.

Used by the command runner (and through it the local runner). Effects only: signals and psutil.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import psutil

from tuner.trial import Status


def signal_name(num: int) -> str:
    try:
        return signal.Signals(num).name
    except ValueError:
        return f"signal {num}"


class ProcessTree:
    """One live trial: its process, and every descendant seen, for killing the lot."""

    def __init__(self, proc: subprocess.Popen):
        self.proc = proc
        self.seen: dict[int, psutil.Process] = {}
        self.reason: Status | None = None   # why we killed it (TIMEOUT, INTERRUPTED, STOPPED)
        self.progress: list = []            # progress records seen when it was stopped early
        self.lock = threading.Lock()
        self.track()

    def track(self) -> None:
        """Remember descendants now, so ones that leave the process group (torchrun's workers call
        setsid) or are orphaned when their parent dies are still killed."""
        try:
            kids = psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.Error:
            return
        with self.lock:
            for k in kids:
                self.seen.setdefault(k.pid, k)

    def signal_all(self, sig: int) -> None:
        self.track()
        try:
            os.killpg(self.proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
        with self.lock:
            procs = list(self.seen.values())
        for p in procs:
            try:
                p.send_signal(sig)   # psutil checks the pid was not reused
            except psutil.Error:
                pass

    def alive(self) -> list[psutil.Process]:
        with self.lock:
            procs = list(self.seen.values())
        out = []
        for p in procs:
            try:
                if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                    out.append(p)
            except psutil.Error:
                pass
        return out

    def kill(self, reason: Status | None, grace: float) -> None:
        """SIGTERM everything, wait up to `grace` seconds, then SIGKILL what is left."""
        if reason is not None and self.reason is None:
            self.reason = reason
        self.signal_all(signal.SIGTERM)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            if self.proc.poll() is not None and not self.alive():
                break
            time.sleep(0.05)
        self.signal_all(signal.SIGKILL)


def kill_leftovers(dirs: list[Path]) -> set[str]:
    """Kill what earlier attempts of these trials left running (their driver died without cleanup).

    A trial's processes carry TUNER_TRIAL_DIR in their environment, also those that left its process
    group or session, so one scan of the process table finds them all and never hits a stranger.
    Returns the trial directories that had processes killed."""
    wanted = {str(d) for d in dirs if (d / "pgid").exists()}
    if not wanted:
        return set()
    me, found = os.getpid(), {}
    for p in psutil.process_iter(["pid"]):
        try:
            where = p.environ().get("TUNER_TRIAL_DIR") if p.pid != me else None
        except (psutil.Error, OSError):
            continue
        if where in wanted:
            found[p] = where
    for p in found:
        try:
            p.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(list(found), timeout=5)
    return set(found.values())
