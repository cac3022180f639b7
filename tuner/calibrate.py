"""`tuner calibrate`: measure this machine and write a cluster file the performance model can use.

G ranks (processes, spawned with torch.multiprocessing, talking over 127.0.0.1 only) run at once, as
the G ranks of a local trial do: on CPU one thread each (fp32, gloo), on GPUs one device each (bf16,
nccl). Each rank measures
- matmul TFLOPS at a few sizes: peak_tflops is the best sustained rate (mean over ranks of each
  rank's best); matmul_efficiency / gemm_knee_gflop place the sizes on eta(F) = eff * F / (F + knee);
- attention TFLOPS (causal scaled_dot_product_attention, Megatron's 4*b*s^2*h count): attention_efficiency;
- memory bandwidth (a large tensor copy, read + write): hbm_bandwidth_gbps;
- all-reduce time of a large and a small tensor: intra_node_bandwidth_gbps (ring bus bandwidth,
  2(G-1)/G * bytes / time) and latency_us (small all-reduce time / 2(G-1) steps).
The measured figures are sustained rates, so network_efficiency and memory_bandwidth_efficiency are
written as 1.0. One machine is one node: inter_node_bandwidth_gbps repeats the intra-node figure.

Then the framework overhead the kernels above do not see (Python, the DeepSpeed engine, collective
synchronisation): the bundled harness trains the `tiny` GPT through the local runner (G ranks, as a
trial does) with a data-parallel layout (dp = G) and a tensor-parallel one (tp = G), each at two
global batches that differ only in the number of micro-batches per step (m = 1 and m = 4). The
performance model, with the constants measured above and no overhead, predicts each run's step time
P0; the measured post-warm-up step time T is then fitted as

    T = P0 + k * microbatch_overhead + step_overhead,    k = m + p - 1 micro-batch slots

(docs/reference/formulas.md: "fit it from two runs that differ only in the number of micro-batches"):
the m = 4 run against the m = 1 run gives the cost per micro-batch, what is left at m = 1 the fixed
cost per iteration. --quick runs the data-parallel pair only, with fewer steps.

The pure parts (fit_gemm, cluster_from_measurements, overhead_points, fit_overhead, render_toml)
live in tuner/calibrate_fit.py and are unit-tested; here `measure` starts the ranks,
`measure_overhead` the harness runs, and `calibrate(out, gpus)` is what the CLI calls. It writes a
user file, by default ./workloads/clusters/<host>.toml (the cluster named after this host), and
refuses before measuring anything to write over a shipped preset.
"""

from __future__ import annotations

import json
import os
import re
import socket
import statistics
import tempfile
import time
from pathlib import Path

from tuner.calibrate_fit import HEADER, cluster_from_measurements, render_toml, with_overhead
from tuner.errors import MissingExtra, UsageError
from tuner.presets import read_toml, shipped_preset_at, shipped_presets
from tuner.specs import ClusterSpec

CPU_SIZES = (128, 256, 512, 1024)
CUDA_SIZES = (1024, 2048, 4096, 8192)
OVERHEAD_MODEL = "tiny"           # all overhead, little compute: the harness runs that fit the overheads
OVERHEAD_MICRO_BATCH = 4
OVERHEAD_M = (1, 4)               # micro-batches per step of the two runs of each layout
OVERHEAD_TIMEOUT_S = 90.0         # per harness run; a run that fails leaves the defaults


# ---- measurement (runs inside each rank) ----------------------------------------------------
def _sync(device):
    import torch
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _rate(fn, device, work: float, min_time: float) -> float:
    """`work` units per second of fn(), sustained over at least `min_time` seconds after a warm-up."""
    fn()
    _sync(device)
    reps, t0 = 0, time.perf_counter()
    while True:
        fn()
        reps += 1
        if reps % 4 == 0 or min_time == 0:
            _sync(device)
            dt = time.perf_counter() - t0
            if dt >= min_time:
                return work * reps / dt


def measure_matmul(device, dtype, sizes, min_time: float = 0.25) -> list[tuple[int, float]]:
    """[(n, TFLOPS)] of n x n matmuls."""
    import torch
    out = []
    for n in sizes:
        a, b = torch.randn(n, n, device=device, dtype=dtype), torch.randn(n, n, device=device, dtype=dtype)
        out.append((n, _rate(lambda: torch.mm(a, b), device, 2.0 * n ** 3, min_time) / 1e12))
    return out


def measure_attention(device, dtype, min_time: float = 0.25) -> float:
    """TFLOPS of causal SDPA forward, counted as Megatron does (4*b*s^2*h)."""
    import torch
    import torch.nn.functional as F
    b, heads, s, d = (4, 8, 256, 64) if device.type == "cpu" else (8, 32, 2048, 128)
    q, k, v = (torch.randn(b, heads, s, d, device=device, dtype=dtype) for _ in range(3))
    return _rate(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True), device,
                 4.0 * b * s * s * heads * d, min_time) / 1e12


def _flash_kernel(device, dtype) -> bool:
    """Whether causal SDPA picks a fused (flash) kernel here, so the s^2 scores are never stored."""
    import torch
    try:
        q = torch.randn(1, 2, 64, 16, device=device, dtype=dtype)
        return int(torch._fused_sdp_choice(q, q, q, is_causal=True)) != 0   # 0 is the math kernel
    except Exception:       # a private API: if it moves, assume the fused kernel (torch >= 2.2)
        return True


def measure_copy(device, nbytes: int, min_time: float = 0.25) -> float:
    """GB/s of a tensor copy (bytes read + written)."""
    import torch
    src = torch.empty(nbytes // 4, device=device, dtype=torch.float32).fill_(1.0)
    dst = torch.empty_like(src)
    return _rate(lambda: dst.copy_(src), device, 2.0 * nbytes, min_time) / 1e9


def measure_allreduce(device, nbytes: int, iters: int) -> float:
    """Seconds per all-reduce of `nbytes` (median of `iters`, after a warm-up) over the default group."""
    import torch
    import torch.distributed as dist
    t = torch.ones(max(1, nbytes // 4), device=device, dtype=torch.float32)
    dist.all_reduce(t)
    times = []
    for _ in range(iters):
        _sync(device)
        dist.barrier()
        t0 = time.perf_counter()
        dist.all_reduce(t)
        _sync(device)
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def _rank(rank: int, world: int, port: int, device_kind: str, out_dir: str, quick: bool) -> None:
    import psutil
    import torch
    import torch.distributed as dist
    cuda = device_kind == "cuda"
    if cuda:
        torch.cuda.set_device(rank)
        device, dtype = torch.device("cuda", rank), torch.bfloat16
    else:
        torch.set_num_threads(1)
        device, dtype = torch.device("cpu"), torch.float32
    baseline_gb = psutil.Process().memory_info().rss / 1e9
    mt = 0.1 if quick else 0.25
    if world > 1:
        dist.init_process_group("nccl" if cuda else "gloo", init_method=f"tcp://127.0.0.1:{port}",
                                rank=rank, world_size=world)
        dist.barrier()
    r = {"rank": rank, "baseline_gb": baseline_gb,
         "matmul": measure_matmul(device, dtype, CUDA_SIZES if cuda else CPU_SIZES, mt),
         "attention_tflops": measure_attention(device, dtype, mt), "flash_attention": _flash_kernel(device, dtype),
         "copy_gbps": measure_copy(device, (1 << 30) if cuda else (64 << 20), mt)}
    if world > 1:
        big = (256 << 20) if cuda else (16 << 20)
        r["allreduce_big_s"] = measure_allreduce(device, big, 5 if quick else 10)
        r["allreduce_small_s"] = measure_allreduce(device, 4, 20 if quick else 50)
        dist.destroy_process_group()
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(r))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def measure(gpus: int, device: str = "auto", quick: bool = False) -> dict:
    """Spawn `gpus` ranks on 127.0.0.1 and gather their measurements."""
    try:
        import torch
        import torch.multiprocessing as mp
    except ImportError:
        raise MissingExtra("torch", "deepspeed") from None
    n_cuda = torch.cuda.device_count() if torch.cuda.is_available() else 0
    kind = ("cuda" if n_cuda >= gpus else "cpu") if device == "auto" else device
    if kind not in ("cpu", "cuda"):
        raise UsageError(f"unknown device '{device}'; devices: auto, cpu, cuda")
    if kind == "cuda" and n_cuda < gpus:
        raise UsageError(f"--gpus {gpus} but {n_cuda} CUDA device(s) are visible: lower --gpus")
    # loopback only, for both gloo and nccl; fewer threads than ranks would only measure contention
    env = {"GLOO_SOCKET_IFNAME": "lo", "NCCL_SOCKET_IFNAME": "lo", "MASTER_ADDR": "127.0.0.1",
           "OMP_NUM_THREADS": "1" if kind == "cpu" else os.environ.get("OMP_NUM_THREADS", "4")}
    saved = {k: os.environ.get(k) for k in env}
    t0 = time.perf_counter()
    os.environ.update(env)
    try:
        with tempfile.TemporaryDirectory(prefix="tuner-calibrate-") as tmp:
            mp.spawn(_rank, args=(gpus, _free_port(), kind, tmp, quick), nprocs=gpus, join=True)
            ranks = [json.loads(Path(tmp, f"rank{i}.json").read_text()) for i in range(gpus)]
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    if kind == "cuda":
        memory_gb = torch.cuda.get_device_properties(0).total_memory / 1e9
    else:
        from tuner.runners.local import default_memory_gb
        memory_gb = default_memory_gb() / gpus        # what the local runner lets a rank use
    return {"ranks": ranks, "gpus": gpus, "device": kind, "dtype": "bf16" if kind == "cuda" else "fp32",
            "backend": "nccl" if kind == "cuda" else "gloo", "memory_gb": memory_gb,
            "allreduce_big_bytes": (256 << 20) if kind == "cuda" else (16 << 20),
            "host": socket.gethostname(), "torch": torch.__version__, "seconds": time.perf_counter() - t0}


def overhead_layouts(gpus: int, quick: bool = False) -> list:
    """The layouts the overhead runs train: dp = G, and tp = G unless quick or G = 1 (no ZeRO, no
    recompute: the plain step the overheads add to)."""
    from tuner.layout import Layout
    lays = [Layout(tp=1, pp=1, dp=gpus, micro_batch=OVERHEAD_MICRO_BATCH, zero_stage=0, recompute="none")]
    if gpus > 1 and not quick:
        lays.append(Layout(tp=gpus, pp=1, dp=1, micro_batch=OVERHEAD_MICRO_BATCH, zero_stage=0, recompute="none"))
    return lays


def measure_overhead(cluster: dict, gpus: int, device: str, quick: bool = False,
                     trial_timeout: float = OVERHEAD_TIMEOUT_S) -> dict:
    """Train the `tiny` GPT with the bundled harness through the local runner (G ranks) for each
    overhead layout at m = 1 and m = 4 micro-batches per step. Returns {"model", "runs": [{"layout",
    "m", "global_batch", "step_s" (median of the timed steps), "step_times"}], "seconds"}, or with
    "error" (and no runs) when a run fails: the caller then keeps the defaults. Each run may take
    `trial_timeout` seconds, the first one DeepSpeed's CPU op build included (--trial-timeout)."""
    from tuner.runners.local import LocalRunner
    from tuner.specs import Workload, load_model
    from tuner.trial import Status, TrialSpec
    t0 = time.perf_counter()
    model = load_model(OVERHEAD_MODEL)
    spec = ClusterSpec.from_dict(cluster)
    warmup, steps = (1, 3) if quick else (2, 6)
    runs = []
    with tempfile.TemporaryDirectory(prefix="tuner-calibrate-") as tmp:
        runner = LocalRunner(gpus=gpus, trial_timeout=trial_timeout, results_dir=tmp, device=device,
                             steps=steps, warmup=warmup)
        for i, lay in enumerate(overhead_layouts(gpus, quick)):
            for m in OVERHEAD_M:
                gb = lay.micro_batch * lay.dp * m
                d = Path(tmp, f"run{i}-m{m}")
                res = runner.run(TrialSpec("calibrate", len(runs), lay, Workload(model, spec, 1, gb), trial_dir=d))
                if res.status != Status.OK:
                    return {"model": OVERHEAD_MODEL, "runs": [], "seconds": time.perf_counter() - t0,
                            "error": f"{lay.key()} m={m}: {res.status} {res.message}".strip()}
                times = json.loads((d / "result.json").read_text())["step_times"][warmup:]
                runs.append({"layout": lay.as_dict(), "m": m, "global_batch": gb,
                             "step_s": statistics.median(times), "step_times": times})
    return {"model": OVERHEAD_MODEL, "runs": runs, "seconds": time.perf_counter() - t0}


CLUSTER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
LOCAL_CLUSTERS = Path("workloads") / "clusters"    # where `--cluster NAME` looks first (tuner.specs)


def default_name(host: str | None = None) -> str:
    """This host's name as a cluster name: its first label, lower case, anything but letters, digits,
    '-' and '_' made '-'; a host named like a shipped cluster preset (`local`, `frontier`) gets
    '-measured', so the measured file never shadows the preset."""
    host = socket.gethostname() if host is None else host
    name = re.sub(r"[^a-z0-9_-]+", "-", host.split(".")[0].lower()).strip("-_") or "this-host"
    return f"{name}-measured" if name in shipped_presets("clusters") else name


def resolve_target(out: Path | str | None, name: str | None) -> tuple[Path, str]:
    """(the file to write, the cluster's name): --name defaults to this host's name (`default_name`),
    --out to ./workloads/clusters/<name>.toml."""
    name = default_name() if name is None else name
    if not isinstance(name, str) or not CLUSTER_NAME.fullmatch(name):
        raise UsageError(f"--name must be letters, digits, '.', '_' or '-', starting with a letter or digit "
                         f"(got {name!r})")
    return (LOCAL_CLUSTERS / f"{name}.toml" if out is None else Path(out)), name


def check_target(out: Path, force: bool = False) -> None:
    """The refusals that come before any measurement: a shipped preset (both paths resolved, so links
    and '..' do not get round it; --force does not either), or an existing file without --force.
    In the repository root ./workloads/clusters/ is the presets' folder: a file calibrate wrote there
    (its first line is HEADER) is the user's, not a preset, and --force refreshes it."""
    preset = shipped_preset_at(out)
    if preset is not None and not _written_by_calibrate(out):
        raise UsageError(f"{out} is the shipped {preset}: calibrate never writes over a preset; choose "
                         f"another --out (default {LOCAL_CLUSTERS / (default_name() + '.toml')})")
    if out.exists() and not force:
        raise UsageError(f"{out} exists: pass --force to overwrite it, or choose another --out")


def _written_by_calibrate(path: Path) -> bool:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.readline().startswith(HEADER)
    except OSError:
        return False


def cluster_option(out: Path) -> str:
    """The `--cluster` value that finds `out` from the working directory: its name when it lies in
    ./workloads/clusters/ (looked up there first), else its absolute path."""
    if out.suffix == ".toml" and out.resolve().parent == LOCAL_CLUSTERS.resolve():
        return out.stem
    return str(out.resolve())


def calibrate(out: Path | str | None = None, gpus: int = 1, force: bool = False,
              device: str = "auto", name: str | None = None, quick: bool = False,
              trial_timeout: float = OVERHEAD_TIMEOUT_S) -> dict:
    """Measure this machine with `gpus` ranks and write the cluster file `out` (default
    ./workloads/clusters/<name>.toml; `name` defaults to this host's name). Never a shipped preset.
    Returns {"path", "cluster" (the dict written), "cluster_option" (the --cluster value that finds
    it from here), "measurements", "seconds"}."""
    out, name = resolve_target(out, name)
    if not isinstance(gpus, int) or gpus < 1:
        raise UsageError(f"--gpus must be an integer >= 1 (got {gpus!r})")
    check_target(out, force)
    m = measure(gpus, device, quick)
    cluster = cluster_from_measurements(m, gpus, name)
    m["overhead"] = measure_overhead(cluster, gpus, m["device"], quick, trial_timeout)
    m["overhead"]["latency_tight_us"] = cluster["latency_us"]
    m["seconds"] += m["overhead"]["seconds"]
    cluster = with_overhead(cluster, m["overhead"])
    text = render_toml(cluster, m)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(text)
    ClusterSpec.from_dict(read_toml(tmp), str(out))      # what we write must load
    os.replace(tmp, out)
    return {"path": str(out), "cluster": cluster, "cluster_option": cluster_option(out), "measurements": m,
            "seconds": m["seconds"]}
