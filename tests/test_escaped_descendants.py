"""A trial that forks a process into a session of its own while the runner kills it (between ProcessTree's look
at its descendants and its killpg: microseconds, which a busy machine stretches) leaves no process behind."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path

import psutil

from tuner.layout import Layout
from tuner.runners import make_runner
from tuner.runners import process
from tuner.specs import make_workload
from tuner.trial import Status, TrialSpec

FIXTURE = Path(__file__).parent / "fixtures" / "fork_on_usr1.py"


def running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_a_process_forked_into_its_own_session_during_the_kill_is_killed(tmp_path, monkeypatch):
    runner = make_runner("command", command=f"{sys.executable} {FIXTURE}", results_dir=tmp_path, kill_grace=0.5,
                         poll_interval=0.1)
    d = tmp_path / "trials" / "s" / "0"
    killpg, forked = os.killpg, []

    def fork_then_killpg(pgid, sig):        # the trial forks right after the runner's last look at its tree
        if not forked:
            os.kill(pgid, signal.SIGUSR1)
            while not (d / "escaped.pid").exists():
                time.sleep(0.01)
            forked.append(int((d / "escaped.pid").read_text()))
        killpg(pgid, sig)

    monkeypatch.setattr(process.os, "killpg", fork_then_killpg)
    trial = TrialSpec("s", 0, Layout(tp=1, pp=1, dp=1, micro_batch=1), make_workload("tiny", 1, "local"))
    out = []
    t = threading.Thread(target=lambda: out.append(runner.run(trial)))
    t.start()
    while t.is_alive() and "ready" not in ((d / "stdout.log").exists() and (d / "stdout.log").read_text() or ""):
        time.sleep(0.05)
    runner.cancel()
    t.join(120)                              # a hang guard, not a timing
    assert not t.is_alive() and out[0].status == Status.INTERRUPTED, out
    assert forked, "the fixture never forked"
    escaped = forked[0]
    left = running(escaped)
    if left:
        os.kill(escaped, signal.SIGKILL)     # not left to the next test
    assert not left, f"process {escaped}, forked into its own session during the kill, outlived the trial"
