"""The Ray worker pool against a real Ray: a head started on loopback, drivers connecting by address.

Loopback only. Every process that starts or joins Ray here runs with RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0
(without it Ray 2.60 binds to the machine's network address even with --node-ip-address=127.0.0.1)
and the test checks `ray.nodes()` says 127.0.0.1. Authentication: the shared head runs with
RAY_AUTH_MODE=disabled on both sides (Ray 2.60 otherwise turns token auth on and writes ~/.ray/auth_token,
which would change every later Ray on the machine); the auth test starts its own head with a token
given through RAY_AUTH_TOKEN and HOME in a temporary directory, so nothing is written to ~/.ray.

The head is `ray start --head --block` in its own session, stopped by its process id (SIGTERM, which
makes `ray start --block` stop every Ray process it started), not by `ray stop`: `ray stop` kills every
Ray process on the machine, including other users'. About 40 s in all on 2 cores.
"""

from __future__ import annotations

import importlib.util
import ipaddress
import json
import os
import pickle
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from tuner.errors import UsageError
from tuner.executors.ray import _split, place, trial_resources
from tuner.runners import CPU_FRACTION, TrialRunner
from tuner.runners.sim import SimRunner
from tuner.specs import make_workload
from tuner.space import load_space
from tuner.trial import Status, TrialSpec

pytestmark = [pytest.mark.ray, pytest.mark.timeout(300),
              pytest.mark.skipif(importlib.util.find_spec("ray") is None,
                                 reason="ray is not installed: pip install 'tuner[ray]'")]

LOOPBACK_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_AUTH_MODE": "disabled",
                "RAY_USAGE_STATS_ENABLED": "0"}
REPO = Path(__file__).resolve().parents[1]
HEADS: dict[str, int] = {}     # address -> pid of its `ray start --block`


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def ray_head(env: dict, num_cpus: int = 2):
    """`ray start --head` on 127.0.0.1 with its own ports and temp dir; yields the GCS address."""
    port = free_port()
    tmp = tempfile.mkdtemp(prefix="tuner-ray-", dir="/tmp")    # short: Ray's socket paths must fit 107 chars
    log = open(Path(tmp) / "head.log", "w+")
    cmd = ["ray", "start", "--head", "--block", "--node-ip-address=127.0.0.1", f"--port={port}",
           f"--num-cpus={num_cpus}", "--num-gpus=0", "--include-dashboard=false", f"--temp-dir={tmp}",
           f"--ray-client-server-port={free_port()}", f"--dashboard-port={free_port()}",
           f"--dashboard-agent-listen-port={free_port()}", "--disable-usage-stats"]
    proc = subprocess.Popen(cmd, env={**os.environ, **env}, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 90
        while "Ray runtime started" not in Path(log.name).read_text():
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"ray start --head did not come up:\n{Path(log.name).read_text()[-3000:]}")
            time.sleep(0.5)
        HEADS[f"127.0.0.1:{port}"] = proc.pid
        yield f"127.0.0.1:{port}"
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)    # the session this test started, nothing else
            proc.wait()
        log.close()
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture(scope="module")
def head():
    with pytest.MonkeyPatch.context() as mp:
        for k, v in LOOPBACK_ENV.items():
            mp.setenv(k, v)
        if "ray" in sys.modules:                   # imported before the variable was set: same effect
            from ray._private import ray_constants
            mp.setattr(ray_constants, "ENABLE_RAY_CLUSTER", False)
        with ray_head(LOOPBACK_ENV) as address:
            yield address


@pytest.fixture(scope="module")
def workload():
    return make_workload("gpt-1.4b", 1, "frontier")


def cli(args: list[str], env: dict | None = None, timeout: float = 150) -> subprocess.CompletedProcess:
    """`tuner ARGS` in a fresh process (Ray keeps per-process state), as a user would run it."""
    code = "import sys; from tuner.cli import main; main(sys.argv[1:])"
    return subprocess.run([sys.executable, "-c", code, *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **LOOPBACK_ENV, **(env or {})})


# ---- pure parts: no Ray started -------------------------------------------------------------------
def test_resources_come_from_the_layout_not_the_cpus(workload):
    layout = load_space("default").enumerate_layouts(workload)[0]
    trial = TrialSpec("s", 1, layout, workload)

    class Local(TrialRunner):
        def resources(self, trial):
            return {"GPU": trial.layout.gpus, "CPU": 0}

    assert trial_resources(SimRunner(), trial) == {"CPU": CPU_FRACTION}
    assert trial_resources(Local(), trial) == {"GPU": float(layout.gpus)} == {"GPU": 8.0}
    assert trial_resources(TrialRunner(), trial) == {"CPU": 1.0}    # the interface's default
    gpu_nodes = [{"CPU": 64, "GPU": 8}, {"CPU": 64, "GPU": 4}]
    assert place({"GPU": 8}, gpu_nodes) == {"GPU": 8}
    assert place({"GPU": 16}, gpu_nodes) is None                 # one task cannot span two nodes
    assert place({"GPU": 2}, [{"CPU": 2}]) == {"CPU": 2}         # DeepSpeed on CPU: a CPU per rank
    assert place({"GPU": 8}, [{"CPU": 2}]) is None


def test_addresses_are_parsed_or_refused():
    assert _split("127.0.0.1:6379") == ("127.0.0.1", 6379)
    assert _split("ray://head:10001") == ("head", 10001)
    with pytest.raises(UsageError, match="not HOST:PORT"):
        _split("127.0.0.1")


def test_sim_runner_pickles_with_a_fresh_stop_event():
    r = SimRunner(delay=0.5, noise=0.1, seed=3)
    r.cancel()
    copy = pickle.loads(pickle.dumps(r))
    assert (copy.delay, copy.noise, copy.seed) == (0.5, 0.1, 3) and not copy._stop.is_set()


# ---- a real Ray ------------------------------------------------------------------------------------
def assert_loopback_only(pid: int, children: bool = True) -> None:
    """Every socket of the process (and its children) is bound to, and talks to, loopback only."""
    import psutil
    procs = [psutil.Process(pid), *(psutil.Process(pid).children(recursive=True) if children else [])]
    conns = [c for p in procs for c in p.net_connections(kind="inet")]
    addrs = {c.laddr.ip for c in conns} | {c.raddr.ip for c in conns if c.raddr}
    assert conns and all(_loopback(a) for a in addrs), sorted(addrs)


def _loopback(ip: str) -> bool:
    a = ipaddress.ip_address(ip)
    return a.is_loopback or bool(getattr(a, "ipv4_mapped", None) and a.ipv4_mapped.is_loopback)


def test_head_listens_on_loopback_only(head):
    assert_loopback_only(HEADS[head])


def test_dead_address_fails_fast_naming_the_fix(head, monkeypatch):
    import ray

    from tuner.executors.ray import RayExecutor
    dead = f"127.0.0.1:{free_port()}"
    # fast = refused before ray.init, which retries a dead address for about a minute
    monkeypatch.setattr(ray, "init", lambda *a, **k: pytest.fail("ray.init was tried on a dead address"))
    with pytest.raises(UsageError) as err:
        RayExecutor(parallel=2, address=dead)
    assert dead in str(err.value) and "ray start --head" in str(err.value)


def test_driver_api_runs_a_study_on_ray_by_address(head, workload, tmp_path):
    import ray

    from tuner.driver import Driver
    from tuner.executors.ray import RayExecutor
    from tuner.search import make_searcher
    from tuner.store import StudyRecord, open_store

    space = load_space("default")
    store = open_store(f"sqlite:///{tmp_path / 't.db'}")
    store.create_study(StudyRecord(name="ray-api", workload=workload.as_dict(),
                                   space={"name": space.name, "dimensions": space.dimensions,
                                          "constraints": space.constraints},
                                   searcher="random", runner="sim", settings={"budget": 6, "parallel": 2}))
    ex = RayExecutor(parallel=2, address=head)
    try:
        assert {n["NodeManagerAddress"] for n in ray.nodes()} == {"127.0.0.1"}
        assert ray.cluster_resources()["CPU"] == 2
        assert_loopback_only(os.getpid(), children=False)        # this driver too
        driver = Driver(store=store, study="ray-api", workload=workload,
                        searcher=make_searcher("random", space.enumerate_layouts(workload), seed=1,
                                               workload=workload, parallel=2),
                        runner=SimRunner(delay=0.05), executor=ex, budget=6, parallel=2, results_dir=tmp_path)
        outcome = driver.run()

        class Local(TrialRunner):                  # a DeepSpeed trial wants 8 GPUs; this Ray has 2 CPUs
            name = "local"

            def resources(self, trial):
                return {"GPU": trial.layout.gpus}

            def run(self, trial):
                raise AssertionError("must not run")

        layout = space.enumerate_layouts(workload)[0]
        with pytest.raises(UsageError, match=r"needs 8 GPU .*as 8 CPU.* has 2 CPU"):
            ex.submit(Local(), TrialSpec("ray-api", 99, layout, workload))
    finally:
        ex.shutdown()
    assert not ray.is_initialized()
    assert outcome.ran == 6
    rows = [t for t in store.trials("ray-api") if t.status != Status.PRUNED]
    assert len(rows) == 6 and all(t.status == Status.OK and t.peak_fraction > 0 for t in rows)


def test_shutdown_cancels_running_trials(head, workload):
    from tuner.executors.ray import RayExecutor

    layouts = load_space("default").enumerate_layouts(workload)[:2]
    ex = RayExecutor(parallel=2, address=head)
    futs = [ex.submit(SimRunner(delay=60), TrialSpec("c", i, lay, workload)) for i, lay in enumerate(layouts)]
    time.sleep(1.0)
    ex.shutdown()
    # INTERRUPTED, not OK: the trials were cut (each would otherwise wait 60 s and succeed)
    assert [f.result(timeout=120).status for f in futs] == [Status.INTERRUPTED] * 2


def test_cli_search_on_ray_by_address(head, tmp_path):
    db = f"sqlite:///{tmp_path / 'cli.db'}"
    p = cli(["search", "--model", "1.4b", "--nodes", "1", "--budget", "6", "--parallel", "2", "--sim-delay",
             "0.05", "--searcher", "random", "--executor", "ray", "--ray-address", head, "--study", "ray-cli", "--db", db,
             "--results-dir", str(tmp_path), "--format", "json"])
    assert p.returncode == 0, p.stderr[-3000:]
    out = json.loads(p.stdout)
    assert out["ran"] == 6 and out["top"]
    from tuner.store import open_store
    trials = [t for t in open_store(db).trials("ray-cli") if t.status != Status.PRUNED]
    assert len(trials) == 6 and all(t.status == Status.OK for t in trials)


def test_cli_bad_address_is_one_line_with_the_fix(tmp_path):
    dead = f"127.0.0.1:{free_port()}"
    p = cli(["search", "--model", "1.4b", "--nodes", "1", "--budget", "2", "--executor", "ray",
             "--ray-address", dead, "--db", f"sqlite:///{tmp_path / 'bad.db'}"], timeout=60)
    assert p.returncode == 2, p.stderr
    assert f"no Ray cluster answers at {dead}" in p.stderr and "ray start --head" in p.stderr
    assert "Traceback" not in p.stderr


def test_token_auth_mismatch_says_how_to_fix_it(tmp_path):
    """Ray 2.60's InvalidAuthToken: the driver without the token is told to set it or disable auth."""
    token = "0123456789abcdef0123456789abcdef"
    home = tempfile.mkdtemp(prefix="tuner-rayhome-", dir="/tmp")
    env = {**LOOPBACK_ENV, "HOME": home, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token}
    with ray_head(env, num_cpus=1) as address:
        assert_loopback_only(HEADS[address])
        p = cli(["search", "--model", "1.4b", "--nodes", "1", "--budget", "1", "--searcher", "random", "--executor", "ray",
                 "--ray-address", address, "--db", f"sqlite:///{tmp_path / 'auth.db'}"],
                env={"HOME": home}, timeout=60)
        assert p.returncode == 2, p.stderr
        assert "InvalidAuthToken" in p.stderr and "RAY_AUTH_TOKEN" in p.stderr and "RAY_AUTH_MODE=disabled" in p.stderr
        ok = cli(["search", "--model", "1.4b", "--nodes", "1", "--budget", "1", "--searcher", "random", "--executor", "ray",
                  "--ray-address", address, "--db", f"sqlite:///{tmp_path / 'auth.db'}", "--study", "auth-ok"],
                 env={"HOME": home, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token}, timeout=90)
        assert ok.returncode == 0, ok.stderr[-3000:]
    assert not (Path(home) / ".ray" / "auth_token").exists()
    shutil.rmtree(home, ignore_errors=True)


LOCAL_POOL = """
import json, psutil
from tuner.executors.ray import RayExecutor
from tuner.runners.sim import SimRunner
from tuner.space import load_space
from tuner.specs import make_workload
from tuner.trial import TrialSpec
import ray
w = make_workload("gpt-1.4b", 1, "frontier")
ex = RayExecutor(parallel=1, num_cpus=1)
nodes = {n["NodeManagerAddress"] for n in ray.nodes()}
result = ex.submit(SimRunner(), TrialSpec("local", 1, load_space().enumerate_layouts(w)[0], w)).result(60)
me = psutil.Process()
conns = [c for p in (me, *me.children(recursive=True)) for c in p.net_connections("inet")]
ips = sorted({c.laddr.ip for c in conns} | {c.raddr.ip for c in conns if c.raddr})
ex.shutdown()
print(json.dumps({"nodes": sorted(nodes), "ips": ips, "status": result.status.value,
                  "connected": ray.is_initialized()}))
"""


def test_without_an_address_a_private_ray_starts_on_loopback():
    p = subprocess.run([sys.executable, "-c", LOCAL_POOL], cwd=REPO, capture_output=True, text=True, timeout=120,
                       env={**os.environ, **LOOPBACK_ENV})
    assert p.returncode == 0, p.stderr[-3000:]
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["nodes"] == ["127.0.0.1"] and out["ips"] and all(_loopback(ip) for ip in out["ips"]), out
    assert out["status"] == "ok" and out["connected"] is False


def test_ctrl_c_interrupts_the_study_and_frees_the_cluster(head, tmp_path):
    import ray

    from tuner.store import open_store
    db = f"sqlite:///{tmp_path / 'int.db'}"
    code = "import sys; from tuner.cli import main; main(sys.argv[1:])"
    p = subprocess.Popen([sys.executable, "-c", code, "search", "--model", "1.4b", "--nodes", "1", "--budget", "4",
                          "--parallel", "2", "--sim-delay", "60", "--searcher", "random", "--executor", "ray",
                          "--ray-address", head, "--db", db, "--study", "int"], cwd=REPO, text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, **LOOPBACK_ENV})
    deadline = time.monotonic() + 60

    def running() -> int:
        try:
            return sum(t.status == Status.RUNNING for t in open_store(db).trials("int"))
        except UsageError:   # the store or the study is not there yet
            return 0

    while running() < 2:
        assert time.monotonic() < deadline and p.poll() is None, p.stderr.read() if p.poll() is not None else ""
        time.sleep(0.5)
    time.sleep(2)                                   # the tasks reach Ray's workers
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 130 and "tuner resume int" in err, err[-2000:]
    assert {t.status for t in open_store(db).trials("int")} == {Status.INTERRUPTED}
    ray.init(address=head, logging_level="WARNING")
    try:
        deadline = time.monotonic() + 20             # Ray frees a cancelled task's CPUs within a heartbeat
        while ray.available_resources().get("CPU") != ray.cluster_resources()["CPU"]:
            assert time.monotonic() < deadline, ray.available_resources()
            time.sleep(0.5)
    finally:
        ray.shutdown()
