"""A Ray worker pool: each trial runs as one Ray task sized by the trial's GPUs, not the driver's CPUs.

`RayExecutor(parallel, address=None)` connects to the Ray cluster at `address` (`host:port` of its GCS,
`ray://host:10001` through Ray Client from a login node, or `auto`) or, with no address, starts a
private single-node Ray on loopback. `submit(runner, trial)` returns a `concurrent.futures.Future`
of the TrialResult, so the driver does not know where a trial ran.

What a trial asks Ray for (`trial_resources`): the runner's `resources(trial)`, in Ray resource names
({"CPU": 0.1} for work that happens elsewhere, {"GPU": 8} for the local DeepSpeed runner). On a
cluster without GPUs a GPU becomes a CPU (DeepSpeed on CPU runs one process per rank). A trial no
single node can hold fails at submit with the node sizes, instead of pending forever (Ray Tune #38505).

Early stop: the runner's `early_stop` hook is the driver's (it reads the best so far), so it cannot
travel with the pickled runner. Each trial gets a `RelayedEarlyStop` instead, which hands the trial's
progress records to a small Ray actor (`_Relay`); a thread here takes them from the actor every
`RELAY_S` seconds, asks the driver's hook, and posts the trials to stop, which the worker's hook
answers at its next poll. The driver's rule is thus applied to the live best, as with threads.

Ray's own failures (a worker or node died, the memory monitor killed the task) come back as
retryable FAILED results, and a cancelled task as INTERRUPTED: they are results, not driver bugs.
An exception the runner itself raises is re-raised from the future, as with the thread pool.
"""

from __future__ import annotations

import itertools
import os
import socket
import threading
from concurrent.futures import Future

from tuner.errors import MissingExtra, UsageError
from tuner.runners import EarlyStop, TrialRunner
from tuner.trial import Status, TrialResult, TrialSpec

PROBE_TIMEOUT = 3.0     # seconds to wait for a TCP answer before calling an address dead
CANCEL_GRACE = 5.0      # seconds a cancelled trial gets to clean up before its worker is killed
RELAY_S = 0.2           # how often the driver's early-stop hook judges the progress of trials on Ray
RELAY_TIMEOUT = 10.0    # seconds a worker waits for the relay before it lets its trial run on
AUTH_FIX = ("set RAY_AUTH_TOKEN to the cluster's token (`ray get-auth-token` on the head node), or run both "
            "the cluster (`ray start`) and tuner with RAY_AUTH_MODE=disabled")


def _import_ray(local: bool):
    if local:
        # A private single-node Ray must bind to 127.0.0.1, not the machine's address; Ray does that only
        # with this variable off, which it reads once at import (ray_constants.ENABLE_RAY_CLUSTER).
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    try:
        import ray
    except ImportError:
        raise MissingExtra("ray", "ray") from None
    if local and os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] == "0":
        from ray._private import ray_constants
        ray_constants.ENABLE_RAY_CLUSTER = False    # ray was imported before us
    return ray


def trial_resources(runner: TrialRunner, trial: TrialSpec) -> dict[str, float]:
    """What one trial asks the cluster for, in Ray resource names."""
    return {k: float(v) for k, v in runner.resources(trial).items() if v}


def translate(need: dict[str, float], nodes: list[dict[str, float]]) -> dict[str, float]:
    """On a cluster without GPUs a trial's GPUs become CPUs (DeepSpeed on CPU: one process per rank)."""
    need = dict(need)
    if need.get("GPU") and not any(n.get("GPU") for n in nodes):
        need["CPU"] = max(need.get("CPU", 0.0), need.pop("GPU"))
    return need


def place(need: dict[str, float], nodes: list[dict[str, float]]) -> dict[str, float] | None:
    """`need` as this cluster can give it, or None if no single node can hold it."""
    need = translate(need, nodes)
    fits = any(all(n.get(k, 0.0) >= v for k, v in need.items()) for n in nodes)
    return need if fits else None


def _fmt(res: dict[str, float]) -> str:
    shown = {k: v for k, v in res.items() if k in ("CPU", "GPU") or not (k.startswith("node:") or k in (
        "memory", "object_store_memory"))}
    return ", ".join(f"{v:g} {k}" for k, v in sorted(shown.items())) or "nothing"


def _split(address: str) -> tuple[str, int]:
    hostport = address.split("://", 1)[-1].rstrip("/")
    host, sep, port = hostport.rpartition(":")
    if not sep or not port.isdigit():
        raise UsageError(f"Ray address {address!r} is not HOST:PORT (e.g. 127.0.0.1:6379, or ray://HOST:10001 "
                         "through Ray Client)")
    return host.strip("[]") or "127.0.0.1", int(port)


def _start_hint(port: int) -> str:
    return (f"start one with `ray start --head --port={port}` on that host (add --node-ip-address=127.0.0.1 "
            "on a single machine), check the host and port with `ray status`, or drop --ray-address to "
            "start a private local Ray")


def check_address(address: str) -> None:
    """UsageError naming the fix unless a Ray cluster answers at `address` and accepts this driver.

    Seconds, not minutes: ray.init retries a dead address for about two minutes, and reports a refused
    token only as a generic ConnectionError. The CLI can call this before it stores a study.
    """
    if address == "auto":
        return                                  # ray.init finds the local cluster or says there is none
    host, port = _split(address)
    try:
        socket.create_connection((host, port), timeout=PROBE_TIMEOUT).close()
    except OSError as exc:
        raise UsageError(f"no Ray cluster answers at {address} ({exc.strerror or exc}): {_start_hint(port)}") from None
    if address.startswith("ray://"):
        return                                  # Ray Client: authentication is checked by ray.init
    try:
        from ray._raylet import GcsClient       # private, but it is what tells a bad token from a dead port
        from ray.exceptions import AuthenticationError
    except ImportError:
        return
    try:
        GcsClient(address=f"{host}:{port}").internal_kv_get(b"tuner-probe", None, timeout=PROBE_TIMEOUT)
    except AuthenticationError:
        raise UsageError(f"the Ray cluster at {address} refused this driver (InvalidAuthToken: Ray's token "
                         f"authentication is on): {AUTH_FIX}") from None
    except Exception:                           # noqa: BLE001 - anything else: let ray.init report it
        pass


def _run(runner: TrialRunner, trial: TrialSpec, early_stop: EarlyStop | None) -> TrialResult:
    """The Ray task: one trial, with its own early-stop hook (the driver's stayed behind)."""
    if early_stop is not None:
        runner.early_stop = early_stop
    return runner.run(trial)


class _Relay:
    """A Ray actor between trials on workers and the driver's early-stop hook: workers post their
    trial's progress records and read the verdict; the driver takes the records and posts verdicts."""

    def __init__(self):
        self._progress: dict[str, list] = {}    # key -> latest records not yet judged
        self._stop: set[str] = set()

    def ask(self, key: str, progress: list) -> bool:
        if key not in self._stop:
            self._progress[key] = progress
        return key in self._stop

    def take(self, live: list[str]) -> dict[str, list]:
        """The records posted since the last take, for the trials still live; the rest are forgotten."""
        out = {k: v for k, v in self._progress.items() if k in live}
        self._progress = {}
        self._stop &= set(live)
        return out

    def stop(self, keys: list[str]) -> None:
        self._stop.update(keys)


class RelayedEarlyStop:
    """A trial's early-stop hook on a Ray worker: posts the progress records to the relay and returns the
    driver's verdict so far (a relay round behind). A lost relay never stops a trial."""

    def __init__(self, relay, key: str):
        self.relay, self.key = relay, key

    def __call__(self, progress: list) -> bool:
        import ray
        try:
            return bool(ray.get(self.relay.ask.remote(self.key, list(progress)), timeout=RELAY_TIMEOUT))
        except Exception:                       # noqa: BLE001 - the trial runs on, as without early stop
            return False


class RayExecutor:
    def __init__(self, parallel: int = 1, address: str | None = None, num_cpus: int | None = None):
        self.parallel = parallel
        self.ray = ray = _import_ray(local=address is None)
        self._owns = not ray.is_initialized()   # a connection the caller made is theirs to close
        if self._owns:
            if address:
                check_address(address)
            try:
                if address:
                    ray.init(address=address, log_to_driver=False, logging_level="WARNING")
                else:
                    ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=False,
                             logging_level="WARNING")
            except ConnectionError as exc:
                hint = _start_hint(6379 if address == "auto" else _split(address)[1]) if address else \
                    "see the Ray logs under /tmp/ray"
                raise UsageError(f"cannot connect to Ray at {address or 'a new local Ray'} ({exc}): {hint}; if "
                                 f"the cluster's log says InvalidAuthToken, {AUTH_FIX}") from None
        self.address = address or "local"
        self._task = ray.remote(_run)
        self._lock = threading.Lock()
        self._live: dict = {}                   # ObjectRef -> (Future, early-stop key or None)
        self._shipped: dict[int, tuple] = {}    # id(runner) -> (runner, ObjectRef of it in the object store)
        self._nodes: list[dict] | None = None
        self._closed = False
        self._hooks: dict[str, EarlyStop] = {}  # early-stop key of a live trial -> the driver's hook
        self._keys = itertools.count()
        self._relay = None                      # the _Relay actor and its thread, from the first hooked trial
        self._quit = threading.Event()

    # -- placement ----------------------------------------------------------------------------
    def _node_resources(self, refresh: bool = False) -> list[dict[str, float]]:
        if self._nodes is None or refresh:
            self._nodes = [n["Resources"] for n in self.ray.nodes() if n.get("Alive")]
        return self._nodes

    def _options(self, runner, trial: TrialSpec) -> dict:
        need = trial_resources(runner, trial)
        placed = place(need, self._node_resources()) or place(need, self._node_resources(refresh=True))
        if placed is None:
            nodes = self._node_resources()
            biggest = max(nodes, key=lambda n: (n.get("GPU", 0), n.get("CPU", 0)), default={})
            moved = translate(need, nodes)
            cpu = f" (as {_fmt(moved)} on this cluster without GPUs)" if moved != need else ""
            raise UsageError(
                f"trial {trial.number} ({trial.layout.key()}) needs {_fmt(need)}{cpu} on one node, but the largest "
                f"node of the Ray cluster ({self.address}) has {_fmt(biggest)}: add nodes with enough GPUs "
                f"(`ray start --num-gpus N`; on CPU, --num-cpus N oversubscribes), choose a workload that "
                "fits one node, or run multi-node trials with --runner slurm")
        extra = {k: v for k, v in placed.items() if k not in ("CPU", "GPU")}
        return {"num_cpus": placed.get("CPU", 0.0), "num_gpus": placed.get("GPU", 0.0), "max_retries": 0,
                "resources": extra or None, "name": f"tuner-trial-{trial.study}-{trial.number}"}

    def _ship(self, runner):
        """The runner goes to the object store once; each task receives a reference to it."""
        key = id(runner)
        if key not in self._shipped:
            try:
                self._shipped[key] = (runner, self.ray.put(runner))
            except Exception as exc:            # noqa: BLE001 - cloudpickle raises many types
                raise UsageError(f"runner {runner.name!r} cannot be sent to Ray workers "
                                 f"({type(exc).__name__}: {exc}): use --executor thread") from None
        return self._shipped[key][1]

    # -- the executor interface ---------------------------------------------------------------
    def submit(self, runner: TrialRunner, trial: TrialSpec) -> Future:
        if self._closed:
            raise RuntimeError("RayExecutor.submit after shutdown")
        opts = self._options(runner, trial)
        shipped = self._ship(runner)
        hook, key = runner.early_stop, None
        if hook is not None:
            key = f"{trial.study}/{trial.number}/{next(self._keys)}"
            with self._lock:
                self._hooks[key] = hook
        relayed = RelayedEarlyStop(self._start_relay(), key) if key else None
        ref = self._task.options(**opts).remote(shipped, trial, relayed)
        out: Future = Future()
        out.set_running_or_notify_cancel()
        with self._lock:
            self._live[ref] = (out, key)
        ref.future().add_done_callback(lambda f, ref=ref: self._settle(ref, f))
        return out

    def _settle(self, ref, done: Future) -> None:
        with self._lock:
            out, key = self._live.pop(ref, (None, None))
            self._hooks.pop(key, None)
        if out is None or out.done():
            return
        exc = done.exception() if not done.cancelled() else self.ray.exceptions.TaskCancelledError()
        if exc is None:
            out.set_result(done.result())
        else:
            result = self._as_result(exc)
            out.set_exception(exc) if result is None else out.set_result(result)

    def _as_result(self, exc: BaseException) -> TrialResult | None:
        """Ray's own failures as trial results; None for an exception the runner raised (a bug)."""
        rx = self.ray.exceptions
        if isinstance(exc, rx.TaskCancelledError):
            return TrialResult(Status.INTERRUPTED, message="cancelled through Ray")
        if self._closed:      # shutdown cancelled it: however the task ended (Ray's interrupt can land anywhere)
            return TrialResult(Status.INTERRUPTED, message=f"cancelled through Ray ({type(exc).__name__})")
        if isinstance(exc, rx.RayTaskError):
            return None
        if isinstance(exc, rx.OutOfMemoryError):
            return TrialResult(Status.OOM, message=f"Ray's memory monitor killed the trial: {str(exc)[:500]}")
        if isinstance(exc, rx.RayError):
            return TrialResult(Status.FAILED, retryable=True,
                               message=f"Ray lost the trial ({type(exc).__name__}): {str(exc)[:500]}")
        return None

    # -- early stop ---------------------------------------------------------------------------
    def _start_relay(self):
        """The relay actor (no CPU of its own) and the thread that judges for it, started once."""
        with self._lock:
            if self._relay is None:
                self._relay = self.ray.remote(num_cpus=0, max_restarts=0)(_Relay).remote()
                threading.Thread(target=self._judge_loop, name="tuner-early-stop", daemon=True).start()
            return self._relay

    def _judge_loop(self) -> None:
        while not self._quit.wait(RELAY_S):
            try:
                self._judge()
            except Exception:                   # noqa: BLE001 - a lost relay: trials run to their end
                pass

    def _judge(self) -> None:
        """Ask the driver's hook about every trial whose progress arrived; post the ones to stop."""
        with self._lock:
            hooks = dict(self._hooks)
        if not hooks:
            return
        reports = self.ray.get(self._relay.take.remote(list(hooks)), timeout=RELAY_TIMEOUT)
        stop = [k for k, progress in reports.items() if _verdict(hooks[k], progress)]
        if stop:
            self._relay.stop.remote(stop)

    def shutdown(self) -> None:
        """Cancel running trials (KeyboardInterrupt first, so runners clean up; then kill), disconnect."""
        if self._closed:
            return
        self._closed = True
        ray = self.ray
        self._quit.set()
        with self._lock:
            live = list(self._live)
        if live and ray.is_initialized():
            for ref in live:
                ray.cancel(ref, force=False)
            _, stuck = ray.wait(live, num_returns=len(live), timeout=CANCEL_GRACE)
            for ref in stuck:
                ray.cancel(ref, force=True)
            if stuck:
                ray.wait(stuck, num_returns=len(stuck), timeout=CANCEL_GRACE)
        self._shipped.clear()
        if self._relay is not None and ray.is_initialized():
            ray.kill(self._relay)
        if self._owns and ray.is_initialized():
            ray.shutdown()


def _verdict(hook: EarlyStop, progress: list) -> bool:
    """The driver's hook on a trial's records; its bugs never stop a healthy trial."""
    try:
        return bool(hook(list(progress)))
    except Exception:                           # noqa: BLE001
        return False
