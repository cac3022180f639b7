"""How long `tuner plan` takes for the largest shipped workloads, against the CLI's own start-up (`tuner --help`).

    python benchmarks/plan_speed.py [--runs 3] [--warmup 1] [--cases qwen,deepseek]

Each command runs as its own process: `--warmup` runs not counted, then `--runs` counted; prints wall seconds
and CPU seconds (user + system, the operating system's accounting of each finished run) as min / median /
max, the median's multiple of the start-up's median, and the layouts the plan ranked. On a shared machine
quote the CPU seconds beside the wall ones: CPU seconds do not depend on what else runs. Issue 25 item 6 asks
for plan within a few times the start-up.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from scale_speed import spread, timed  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CASES = {   # name -> tuner's arguments
    "start-up": ["--help"],
    "qwen": ["plan", "--model", "qwen3-235b-a22b", "--cluster", "h100", "--nodes", "32"],
    "deepseek": ["plan", "--model", "deepseek-v3", "--cluster", "h100", "--nodes", "128"],
    "mixtral": ["plan", "--model", "mixtral-8x22b", "--cluster", "h100", "--nodes", "32"],
    "405b": ["plan", "--model", "llama3-405b", "--cluster", "h100", "--nodes", "128"],
}


def run_once(args: list[str]) -> tuple[float, float, str]:
    """(wall s, CPU s, the plan's counts) of one `tuner ...` process."""
    path = str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")
    wall, cpu, out = timed(args, env={**os.environ, "PYTHONPATH": path})
    counts = re.search(r"^(\d+) valid .*? layouts, (\d+) may fit", out, re.M)
    return wall, cpu, f"{counts[1]} layouts, {counts[2]} may fit" if counts else ""


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--cases", default="qwen,deepseek,mixtral,405b", help=f"of {', '.join(CASES)} (start-up always)")
    a = ap.parse_args(argv)
    names = ["start-up"] + [c for c in a.cases.split(",") if c and c != "start-up"]
    bad = [c for c in names if c not in CASES]
    if bad:
        raise SystemExit(f"--cases: unknown {', '.join(bad)}; choose from {', '.join(CASES)}")
    print(f"{os.cpu_count()} CPUs; {a.warmup} warm-up and {a.runs} counted run(s) each; seconds as min / median / max")
    print(f"{'command':70s} {'wall s':>20s} {'CPU s':>20s} {'x start-up (wall, CPU)':>24s}")
    base = None
    for name in names:
        for _ in range(a.warmup):
            run_once(CASES[name])
        got = [run_once(CASES[name]) for _ in range(a.runs)]
        wall, cpu = statistics.median(g[0] for g in got), statistics.median(g[1] for g in got)
        base = base or (wall, cpu)
        ratio = f"{wall / base[0]:6.1f} {cpu / base[1]:6.1f}"
        print(f"{'tuner ' + ' '.join(CASES[name]):70s} {spread([g[0] for g in got], 2):>20s} "
              f"{spread([g[1] for g in got], 2):>20s} {ratio:>24s}  {got[0][2]}")


if __name__ == "__main__":
    main()
