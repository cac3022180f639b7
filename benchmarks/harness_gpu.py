"""Real harness trials on one CUDA GPU, and tuner's predictions of them: measured memory, p_fit and speed on a GPU.

On a machine with one CUDA GPU, torch and deepspeed (the repository on PYTHONPATH):
    python benchmarks/harness_gpu.py run --out DIR [--set first|second] [--budget-s 330] [--trial-timeout 150]
runs TRIALS (or SECOND) in order, one at a time, as the local runner launches a trial (`torchrun --standalone --nproc_per_node 1
-m tuner.runners.harness.train`, the command-runner protocol's trial.json and TUNER_* variables), and appends each
result to DIR/harness_gpu.jsonl as it ends: the trial (model preset, layout, global batch), the harness's result
(status; samples/s, Megatron and model TFLOP/s, peak allocated and reserved bytes, the device's use after the steps)
and the machine (GPU, driver, torch, deepspeed). No trial starts after --budget-s.
Anywhere:
    python benchmarks/harness_gpu.py compare [FILE ...]    (default: benchmarks/data/harness_measured_h200.jsonl)
prints each row against tuner's prediction of its layout on the `cluster` the row names, as one GPU, for the
harness's stack (megatron-deepspeed): the memory the run needed (tuner.perfmodel.fit.run_need_gb: its reserved or
allocated peak plus the file's memory_reserved_gb) over the predicted memory, the device's use beyond PyTorch's
reserved bytes against that reserve, the stated p_fit against whether it ran (out of memory or not), and samples/s
and MFU measured over predicted. Rows are measurements only; nothing here is chosen on them. What saw which rows: the
first set (data/harness_measured_h200.jsonl) led to DeepSpeed's optimizer-step copies (7f44d06; their byte counts are
DeepSpeed's code, no constant fitted); the second (data/harness_measured_h200_second.jsonl) was committed before that
change and no choice has seen it: the held-out set.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tuner.layout import Layout  # noqa: E402
from tuner.perfmodel import predict  # noqa: E402
from tuner.perfmodel.fit import run_need_gb  # noqa: E402
from tuner.runners.process import kill_leftovers  # noqa: E402
from tuner.specs import Workload, load_cluster, load_model  # noqa: E402
from tuner.trial import TrialSpec  # noqa: E402

DATA = ROOT / "benchmarks" / "data" / "harness_measured_h200.jsonl"
FRAMEWORK = "megatron-deepspeed"      # the harness: Megatron-style layers on DeepSpeed's engine
# (model preset, micro-batch, recompute, ZeRO stage, global batch): one GPU, so tp = pp = dp = 1. The 7-8B rows
# sit near the H200's memory, where p_fit says something: they come first after one cheap row.
TRIALS = [
    ("gpt-1.4b", 4, "none", 0, 16), ("mpt-7b", 1, "none", 0, 4), ("mpt-7b", 2, "none", 0, 4),
    ("mpt-7b", 4, "none", 0, 8), ("llama2-7b", 1, "none", 0, 4), ("llama2-7b", 2, "full", 0, 4),
    ("llama3-8b", 1, "full", 0, 2), ("llama3-8b", 1, "none", 0, 2), ("mpt-7b", 4, "full", 0, 8),
    ("gpt-1.4b", 8, "none", 0, 16), ("gpt-1.4b", 8, "full", 0, 16), ("mpt-3b", 4, "none", 0, 16),
    ("mpt-3b", 8, "full", 0, 16), ("gpt-1.4b", 4, "selective", 1, 16),
]
# The second set, committed before any constant was chosen on the first's rows (which showed every 7-8B layout at
# ZeRO 0 out of memory): other models and layouts, ZeRO 1 and 2 (DeepSpeed's ZeRO optimizer at dp 1) among them.
SECOND = [
    ("mpt-7b", 1, "full", 1, 4), ("llama2-7b", 1, "full", 1, 4), ("mpt-3b", 8, "full", 0, 16),
    ("gpt-1.4b", 4, "selective", 1, 16), ("mpt-7b", 1, "full", 2, 4), ("mpt-1b", 8, "none", 0, 32),
    ("mpt-3b", 2, "none", 1, 16), ("gpt-1.4b", 2, "full", 0, 16), ("llama3-8b", 1, "full", 1, 2),
    ("mpt-3b", 4, "full", 2, 16),
]
SETS = {"first": TRIALS, "second": SECOND}


def workload_of(model: str, cluster: str, global_batch: int) -> Workload:
    """The row's workload: the cluster file's GPU as a one-GPU node (the harness ran one rank)."""
    one_gpu = dataclasses.replace(load_cluster(cluster), gpus_per_node=1)
    return Workload(load_model(model), one_gpu, 1, global_batch, framework=FRAMEWORK)


def layout_of(mb: int, recompute: str, zero: int) -> Layout:
    return Layout(tp=1, pp=1, dp=1, micro_batch=mb, zero_stage=zero, recompute=recompute)


def machine() -> dict:
    import torch
    out = {"torch": torch.__version__, "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"}
    try:
        import deepspeed
        out["deepspeed"] = deepspeed.__version__
    except ImportError:
        out["deepspeed"] = "missing"
    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=driver_version,memory.total", "--format=csv,noheader"],
                             capture_output=True, text=True, check=False)
        out["nvidia_smi"] = smi.stdout.strip()
    except OSError:
        out["nvidia_smi"] = "none"
    return out


def run_one(trial: tuple, cluster: str, number: int, base: Path, timeout: float) -> dict:
    """One trial through the harness, as the local runner starts it; its row."""
    model, mb, recompute, zero, gb = trial
    w, lay = workload_of(model, cluster, gb), layout_of(mb, recompute, zero)
    d = base / f"{number:02d}-{lay.key()}-{model}"
    d.mkdir(parents=True)
    spec = TrialSpec("harness-gpu", number, lay, w, d)            # the protocol's trial.json and TUNER_* variables
    (d / "trial.json").write_text(json.dumps(spec.as_json(), indent=2))
    env = {**os.environ, **spec.env(d / "result.json"), "TUNER_WARMUP_STEPS": os.environ.get("TUNER_WARMUP_STEPS", "2"),
           "TUNER_STEPS": os.environ.get("TUNER_STEPS", "3")}
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "1",
            "-m", "tuner.runners.harness.train"]
    t0 = time.time()
    tail, code = launch(argv, env, d, timeout)
    res_path = d / "result.json"
    result = json.loads(res_path.read_text()) if res_path.exists() else {"status": "timeout" if code is None
                                                                          else "failed", "message": tail}
    for k in ("ds_config", "layout"):
        result.pop(k, None)
    row = {"model": model, "cluster": cluster, "global_batch": gb, "layout": lay.as_dict(), "key": lay.key(),
           "wall_s": round(time.time() - t0, 1), "exit": code,
           "adam": "torch" if os.environ.get("TUNER_TORCH_ADAM") == "1" else "deepspeed FusedAdam", **result}
    if result.get("status") != "ok":
        row["log_tail"] = tail
    return row


def launch(argv: list, env: dict, d: Path, timeout: float, cwd: Path = ROOT) -> tuple[str, int | None]:
    """Run one trial's command (env carries TUNER_TRIAL_DIR = d): the tail of its output and its exit code, None when
    it ran past `timeout`. Then, and after any end, every process carrying the trial's TUNER_TRIAL_DIR is killed
    (tuner.runners.process.kill_leftovers): torchrun's worker runs in a session of its own, so killing torchrun
    alone left it holding the GPU under the next trials."""
    proc = subprocess.Popen(argv, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    (d / "pgid").write_text(str(proc.pid))          # marks a started trial, as the command runner's do
    try:
        out, code = proc.communicate(timeout=timeout)[0], proc.returncode
    except subprocess.TimeoutExpired:
        kill_leftovers([d])
        out, code = f"timed out after {timeout} s: {proc.communicate()[0][-1200:]}", None
    kill_leftovers([d])                             # what outlived torchrun
    return out[-1500:], code


def cmd_run(args) -> int:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    dest, info = out / "harness_gpu.jsonl", machine()
    print(json.dumps(info), flush=True)
    base, start = Path(tempfile.mkdtemp(prefix="harness-gpu-")), time.time()
    trials = SETS[args.set]
    for i, trial in enumerate(trials):
        if time.time() - start > args.budget_s:
            print(f"budget spent: {len(trials) - i} trial(s) not started", flush=True)
            break
        row = {**run_one(trial, args.cluster, i, base, args.trial_timeout), "machine": info,
               "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        with open(dest, "a") as f:
            f.write(json.dumps(row, default=str) + "\n")
        print(f"{i:2d} {row['model']:10s} {row['key']:32s} {row.get('status')} {row['wall_s']} s "
              f"samples/s {row.get('samples_per_second')} peak {row.get('peak_memory_gb')} "
              f"reserved {row.get('peak_reserved_gb')} used {row.get('device_used_gb')}", flush=True)
    return 0


def compared(row: dict) -> dict:
    """One measured row against its prediction."""
    w = workload_of(row["model"], row["cluster"], row["global_batch"])
    lay = Layout.from_dict(row["layout"])
    pr = predict(lay, w)
    out = {"row": f"{row['model']} {lay.key()}", "status": row["status"], "pred_gb": pr.memory_gb, "p_fit": pr.p_fit}
    if row["status"] == "ok":
        reserve = w.cluster.memory_reserved_gb
        need = run_need_gb(row["peak_memory_gb"], reserve, row.get("peak_reserved_gb"))
        out.update(need_gb=need, mem_ratio=need / pr.memory_gb, speed_ratio=row["samples_per_second"]
                   / pr.samples_per_second, alloc_ratio=row["peak_memory_gb"] / (pr.memory_gb - reserve),
                   frag=row.get("peak_reserved_gb", math.nan) / row["peak_memory_gb"])
        out.update(mfu=row["model_tflops_per_gpu"] / w.cluster.peak_tflops, pred_mfu=pr.mfu,
                   outside=row.get("device_used_gb", math.nan) - row.get("reserved_now_gb", math.nan))
    return out


def cmd_compare(args) -> int:
    rows = [json.loads(line) for f in (args.files or [DATA]) for line in Path(f).read_text().splitlines() if line]
    done = [r for r in rows if r.get("status") in ("ok", "oom")]
    print(f"{len(rows)} rows, {len(done)} ran to ok or oom ({', '.join(sorted({r['machine']['gpu'] for r in rows}))})")
    print(f"{'row':44s} {'status':6s} {'pred GB':>8s} {'p_fit':>6s} {'need GB':>8s} {'need/pred':>9s} "
          f"{'alloc/pred':>10s} {'reserved/alloc':>14s} {'beyond PyTorch GB':>17s} {'speed m/p':>9s} {'MFU':>6s} "
          f"{'pred MFU':>8s}")
    cs = [compared(r) for r in done]
    for c in cs:
        print(f"{c['row']:44s} {c['status']:6s} {c['pred_gb']:8.1f} {c['p_fit']:6.3f} "
              + (f"{c['need_gb']:8.1f} {c['mem_ratio']:9.3f} {c['alloc_ratio']:10.3f} {c['frag']:14.3f} "
                 f"{c['outside']:17.2f} {c['speed_ratio']:9.3f} "
                 f"{c['mfu']:6.3f} {c['pred_mfu']:8.3f}" if c["status"] == "ok" else ""))
    ok = [c for c in cs if c["status"] == "ok"]
    if ok:
        mem = [abs(math.log(c["mem_ratio"])) for c in ok]
        speed = [abs(math.log(c["speed_ratio"])) for c in ok]
        print(f"memory need / predicted: median |log| {statistics.median(mem):.3f}, worst {max(mem):.3f} "
              f"(signed median {statistics.median(c['mem_ratio'] for c in ok):.3f}) on {len(ok)} rows")
        alloc = [abs(math.log(c["alloc_ratio"])) for c in ok]
        print(f"allocated peak / predicted less the reserve: median |log| {statistics.median(alloc):.3f}, worst "
              f"{max(alloc):.3f}; reserved / allocated peak median {statistics.median(c['frag'] for c in ok):.3f}")
        print(f"speed measured / predicted: median |log| {statistics.median(speed):.3f}, worst {max(speed):.3f} "
              f"(signed median {statistics.median(c['speed_ratio'] for c in ok):.3f})")
        print(f"device use beyond PyTorch's reserved bytes: median {statistics.median(c['outside'] for c in ok):.2f}"
              f" GB (the cluster file's memory_reserved_gb: {load_cluster(done[0]['cluster']).memory_reserved_gb})")
    brier = [(c["p_fit"] - (c["status"] == "ok")) ** 2 for c in cs]
    if brier:
        print(f"p_fit: Brier score {statistics.mean(brier):.3f} on {len(cs)} rows; stated mean "
              f"{statistics.mean(c['p_fit'] for c in cs):.3f}, ran {sum(c['status'] == 'ok' for c in cs)} of {len(cs)}")
    return 0


def run_or_compare(argv, doc: str, sets: dict, trial_timeout: float, run, compare, **run_options) -> int:
    """The `run` / `compare` command line of this benchmark and harness_cpu_memory.py: run's --out, --set (of `sets`),
    --trial-timeout and `run_options` (name -> (type, default)); compare's files."""
    p = argparse.ArgumentParser(description=doc.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--out", required=True)
    r.add_argument("--set", choices=sorted(sets), default="first", help="which list of trials")
    r.add_argument("--trial-timeout", type=float, default=trial_timeout)
    for name, (kind, default) in run_options.items():
        r.add_argument(name, type=kind, default=default)
    sub.add_parser("compare").add_argument("files", nargs="*")
    args = p.parse_args(argv)
    return run(args) if args.cmd == "run" else compare(args)


def main(argv=None) -> int:
    return run_or_compare(argv, __doc__, SETS, 150.0, cmd_run, cmd_compare, **{"--cluster": (str, "h200"),
                                                                                 "--budget-s": (float, 330.0)})


if __name__ == "__main__":
    sys.exit(main())
