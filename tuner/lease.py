"""Which drivers run a study: leases kept in the study's settings, taken in one locked transaction.

A driver holds a lease (host, pid, last seen) in `settings["drivers"]`, refreshed every HEARTBEAT_S by a
thread; a lease is live while, on this host, its process exists, and elsewhere while it was refreshed
within three heartbeats.
`take` is the one decision, made by the store under a row lock (Store.modify_study_settings), so that
of N drivers started at the same instant on a study exactly one gets in (mode "run"), unless they
came to join (mode "join") or to take over from a driver that died on another host ("force").

Fencing: `settings["epoch"]` counts take-overs. "force" raises it; a driver keeps the epoch it took the
lease in, and the store refuses its claims and results once the epoch has moved on (Displaced), and
`refresh` never re-adds a displaced driver's lease. Joining leaves the epoch alone.
Pure apart from reading the clock, the host name and the process table; `StudyLease` is one driver's
lease, changed through the store, and `Heartbeat` the thread that keeps it fresh.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from typing import Callable

from tuner.errors import TunerError, UsageError

HEARTBEAT_S = 15.0   # a live driver refreshes its lease this often
MODES = ("run", "join", "force")


def me() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def _alive(lease: dict, now: float) -> bool:
    """On this host: its process exists. Elsewhere: refreshed within three heartbeats."""
    if lease.get("host") == socket.gethostname():
        try:
            os.kill(int(lease["pid"]), 0)
        except (ProcessLookupError, ValueError, KeyError):
            return False
        except PermissionError:
            pass
        return True
    return now - float(lease.get("seen", 0)) <= 3 * HEARTBEAT_S


def holders(settings: dict, now: float | None = None) -> dict[str, dict]:
    """The live leases of a study's settings, by driver id (a pre-lease-table "driver" entry included)."""
    now = time.time() if now is None else now
    leases = dict(settings.get("drivers") or {})
    if settings.get("driver"):
        old = settings["driver"]
        leases.setdefault(f"{old.get('host')}:{old.get('pid')}", old)
    return {k: v for k, v in leases.items() if _alive(v, now)}


def live_driver(settings: dict) -> str | None:
    """A description of another live driver of the study, or None."""
    now = time.time()
    others = {k: v for k, v in holders(settings, now).items() if k != me()}
    if not others:
        return None
    k, v = next(iter(others.items()))
    return f"host {v.get('host')} pid {v.get('pid')}, seen {now - float(v.get('seen', 0)):.0f} s ago"


def epoch(settings: dict) -> int:
    """How many times the study was taken over (`--force`): a driver's lease is good for one epoch."""
    return int(settings.get("epoch") or 0)


def take(settings: dict, study: str, mode: str) -> dict:
    """The settings change that gives this driver a lease on `study` (and, with "force", a new epoch
    that fences the drivers it displaces), or UsageError when another live driver runs it and `mode`
    is "run"."""
    if mode not in MODES:
        raise ValueError(f"lease mode must be one of {MODES}, got {mode!r}")
    live = live_driver(settings)
    if live and mode == "run":
        raise UsageError(f"study '{study}' is being run by a live driver ({live}): attach a second driver with "
                         f"`tuner resume {study} --join`, or, if that driver is gone, `tuner resume {study} --force`")
    keep = {} if mode == "force" else holders(settings)
    return {"driver": None, "epoch": epoch(settings) + (mode == "force"),
            "drivers": {**keep, me(): {"host": socket.gethostname(), "pid": os.getpid(), "seen": time.time()}}}


def refresh(settings: dict, held: int | None = None) -> dict | None:
    """The settings change that renews this driver's lease (keeping the other live ones); None (no
    change) when the study has moved on from the epoch `held` this driver took it in."""
    if held is not None and epoch(settings) != held:
        return None
    return {"drivers": {**holders(settings), me(): {"host": socket.gethostname(), "pid": os.getpid(),
                                                    "seen": time.time()}}}


def release(settings: dict) -> dict:
    """The settings change that gives this driver's lease up."""
    return {"driver": None, "drivers": {k: v for k, v in holders(settings).items() if k != me()}}


class Heartbeat:
    """Calls `beat` (a driver's lease refresh) every HEARTBEAT_S from a daemon thread until stopped."""

    def __init__(self, beat: Callable[[], None]):
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(beat,), daemon=True, name="tuner-lease")
        self._thread.start()

    def _run(self, beat: Callable[[], None]) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            try:
                beat()
            except TunerError:          # a lost store: the driver's own next call reports it
                pass

    def stop(self) -> None:
        self._stop.set()


class StudyLease:
    """One driver's lease on a study, kept in the study's settings and changed under its row lock
    (store.modify_study_settings): `epoch` fences the driver's claims and results, `displaced` says the
    study was taken over since."""

    def __init__(self, store, study: str, mode: str = "run"):
        self.store, self.study, self.mode = store, study, mode
        self.epoch: int | None = None
        self.displaced = False

    def take(self, budget: int) -> None:
        """Take the lease, and store `budget` as the study's: from here on the row holds it."""
        def change(settings: dict) -> dict:
            got = take(settings, self.study, self.mode)
            self.epoch = got["epoch"]
            return {**got, "budget": budget}
        self.store.modify_study_settings(self.study, change)

    def renew(self, follow_budget: Callable[[int], None]) -> None:
        """Renew the lease and hand the study's stored budget to `follow_budget`; a study taken over since
        this lease's epoch is noted (`displaced`), and the lease is not renewed."""
        def change(settings: dict) -> dict | None:
            got = refresh(settings, self.epoch)
            if got is None:
                self.displaced = True
            elif settings.get("budget"):
                follow_budget(int(settings["budget"]))
            return got
        self.store.modify_study_settings(self.study, change)

    def release(self) -> None:
        """Give this driver's lease up."""
        self.store.modify_study_settings(self.study, release)
