"""How long `tuner scale` takes to answer: the issue's three questions, each as a whole process.

    python benchmarks/scale_speed.py [--runs 3] [--warmup 1] [--jobs N]

Each case runs `tuner scale ... --format json` as its own process: `--warmup` runs not counted, then `--runs`
counted; prints wall seconds and CPU seconds (user + system of the process and its worker processes, from
the operating system's accounting of each finished run) as min / median / max, and how many points each
answered. On a shared machine quote the median; CPU seconds do not depend on what else runs (wall seconds
do), and wall ~ CPU / min(CPUs, points) on an idle machine. No store is read (an empty one).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CASES = {   # name -> the arguments of `tuner scale`
    "GPT-3 175B on frontier, 16-512 nodes, 300B tokens": [
        "--model", "175b", "--cluster", "frontier", "--nodes", "16:512", "--tokens", "3e11", "--price", "1.8"],
    "Llama 3 405B on h100, 64-1024 nodes, 15.6T tokens": [
        "--model", "llama3-405b", "--cluster", "h100", "--nodes", "64:1024", "--tokens", "15.6e12", "--price", "2.5"],
    "Mixtral 8x7B (MoE) on h100 and h200, 8-64 nodes, 1T tokens": [
        "--model", "mixtral-8x7b", "--cluster", "h100,h200", "--nodes", "8:64", "--tokens", "1e12",
        "--price", "h100=2.5,h200=3.5"],
}


def timed(args: list[str], **run) -> tuple[float, float, str]:
    """(wall s, CPU s of it and the processes it waited for, stdout) of one `tuner ARGS` process; exits
    naming the command where it fails."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "tuner", *args], capture_output=True, text=True, **run)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode:
        raise SystemExit(f"tuner {' '.join(args)} failed: {done.stderr.strip()[-500:]}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), done.stdout


def run_once(args: list[str], env: dict) -> tuple[float, float, int, int]:
    """(wall s, CPU s, points answered, points) of one `tuner scale` process."""
    wall, cpu, out = timed(["scale", *args, "--format", "json"], env=env, cwd=env["SCALE_BENCH_DIR"])
    rows = json.loads(out)
    return wall, cpu, sum(r["status"] == "ok" for r in rows), len(rows)


def spread(xs: list[float], digits: int = 1) -> str:
    return " ".join(f"{x:6.{digits}f}" for x in (min(xs), statistics.median(xs), max(xs)))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--jobs", type=int, default=None, help="tuner scale --jobs (default: its own, the CPUs)")
    a = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "TUNER_DB": f"sqlite:///{tmp}/empty.db", "SCALE_BENCH_DIR": tmp,
               "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
        print(f"{os.cpu_count()} CPUs; {a.warmup} warm-up and {a.runs} counted run(s) per case; seconds as "
              "min / median / max")
        print(f"{'case':62s} {'wall s':>20s} {'CPU s':>20s}  points")
        for name, args in CASES.items():
            args = args + (["--jobs", str(a.jobs)] if a.jobs else [])
            for _ in range(a.warmup):
                run_once(args, env)
            got = [run_once(args, env) for _ in range(a.runs)]
            print(f"{name:62s} {spread([g[0] for g in got]):>20s} {spread([g[1] for g in got]):>20s}  "
                  f"{got[0][2]} of {got[0][3]}")
            print(f"    tuner scale {' '.join(args)}")


if __name__ == "__main__":
    main()
