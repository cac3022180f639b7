"""Per-trial overhead of the local runner: real DeepSpeed trials of the tiny GPT on 2 CPU ranks.

Prints, per trial: launch to first step (from run() until the harness appends its first progress
record, i.e. torchrun + imports + DeepSpeed init + one warm-up iteration), the timed steps, the total,
the overhead (total minus the timed steps: what a trial costs beyond its measurement), and exit
(from the result file being written until run() returns: harness teardown and launcher shutdown).

    python benchmarks/trial_overhead.py [--trials 3] [--gpus 2] [--steps 3] [--warmup 1]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tuner.layout import Layout  # noqa: E402
from tuner.runners import make_runner  # noqa: E402
from tuner.specs import load_cluster, make_workload  # noqa: E402
from tuner.trial import TrialSpec  # noqa: E402

LAYOUTS = [dict(tp=1, pp=1, dp=2, micro_batch=2, zero_stage=1), dict(tp=2, pp=1, dp=1, micro_batch=2, zero_stage=1),
           dict(tp=1, pp=2, dp=1, micro_batch=2, zero_stage=0), dict(tp=1, pp=1, dp=2, micro_batch=4, zero_stage=2)]


def first_progress(path: Path, t0: float, out: dict, done: threading.Event) -> None:
    while not done.is_set():
        if path.exists() and path.stat().st_size > 0:
            out["first_step_s"] = time.monotonic() - t0
            return
        time.sleep(0.02)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--gpus", type=int, default=2)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    a = ap.parse_args()
    cluster = dataclasses.replace(load_cluster("frontier"), name="bench", gpus_per_node=a.gpus)
    workload = make_workload("tiny", nodes=1, cluster=cluster)
    rows = []
    with tempfile.TemporaryDirectory(prefix="tuner-overhead-") as tmp:
        runner = make_runner("local", gpus=a.gpus, results_dir=Path(tmp), steps=a.steps, warmup=a.warmup,
                             trial_timeout=600)
        print(f"local runner, tiny GPT, {a.gpus} ranks on {runner.device}, {a.warmup} warm-up + {a.steps} "
              f"timed steps, launcher: {' '.join(runner.argv[-8:])}")
        print(f"{'layout':<26}{'status':<8}{'launch->1st step':>17}{'timed steps':>13}{'total':>8}{'overhead':>10}{'exit':>8}")
        for i in range(a.trials):
            lay = Layout(**{**LAYOUTS[i % len(LAYOUTS)], "dp": LAYOUTS[i % len(LAYOUTS)]["dp"] * a.gpus // 2})
            trial = TrialSpec("overhead", i, lay, workload)
            d = Path(tmp) / "trials" / "overhead" / str(i)
            probe, done = {}, threading.Event()
            t0, w0 = time.monotonic(), time.time()
            th = threading.Thread(target=first_progress, args=(d / "progress.jsonl", t0, probe, done), daemon=True)
            th.start()
            r = runner.run(trial)
            total = time.monotonic() - t0
            done.set()
            res = json.loads((d / "result.json").read_text()) if (d / "result.json").exists() else {}
            result_at = (d / "result.json").stat().st_mtime - w0 if res else float("nan")
            timed = sum(res.get("step_times", [])[res.get("warmup_steps", a.warmup):])
            row = {"layout": lay.key(), "status": r.status.value, "first": probe.get("first_step_s", float("nan")),
                   "timed": timed, "total": total, "overhead": total - timed, "exit": total - result_at}
            rows.append(row)
            print(f"{row['layout']:<26}{row['status']:<8}{row['first']:>16.2f}s{timed:>12.2f}s{total:>7.1f}s"
                  f"{row['overhead']:>9.1f}s{row['exit']:>7.1f}s" + ("" if r.status.value == "ok" else f"  {r.message[:80]}"))
    ok = [x for x in rows if x["status"] == "ok"]
    if ok:
        print(f"median over {len(ok)} ok trials: launch to first step {statistics.median(x['first'] for x in ok):.2f} s, "
              f"per-trial overhead {statistics.median(x['overhead'] for x in ok):.1f} s, "
              f"timed steps {statistics.median(x['timed'] for x in ok):.2f} s, result to exit "
              f"{statistics.median(x['exit'] for x in ok):.1f} s")


if __name__ == "__main__":
    main()
