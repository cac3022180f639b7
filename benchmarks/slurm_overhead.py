"""Submit-to-start overhead of the Slurm runner on the local one-node Slurm (`.ci/start-slurm.sh`).

Runs N trivial 2-rank command trials one after another through SlurmRunner and prints, per trial,
run() called -> rank 0 started (submission, scheduling, srun launch) and rank 0 done -> run()
returned (squeue polling, result read), with medians, the total per trial and the squeue calls made.

    python benchmarks/slurm_overhead.py [--trials 10] [--poll 0.5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from tuner.layout import Layout
from tuner.runners import make_runner
from tuner.specs import load_cluster, make_workload
from tuner.trial import Status, TrialSpec

STAMP = ("import json, os, time\nt = time.time()\n"
         "if os.environ['RANK'] == '0':\n"
         "    json.dump({'status': 'ok', 'samples_per_second': 1.0, 'message': json.dumps({'start': t, 'end': time.time()})},"
         " open(os.environ['TUNER_RESULT_JSON'], 'w'))\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=10)
    ap.add_argument("--poll", type=float, default=0.5, help="squeue poll interval, seconds")
    a = ap.parse_args()
    cluster = load_cluster("local-slurm")
    w = make_workload("tiny", 1, cluster, 16)
    lay = Layout(tp=1, pp=1, dp=2, micro_batch=2)
    with tempfile.TemporaryDirectory() as tmp:
        r = make_runner("slurm", cluster=cluster, template="command", command=[sys.executable, "-c", STAMP],
                        results_dir=Path(tmp), poll_interval=a.poll)
        rows = []
        for i in range(a.trials):
            t0 = time.time()
            res = r.run(TrialSpec("overhead", i, lay, w))
            t1 = time.time()
            if res.status != Status.OK:
                print(f"trial {i}: {res.status}: {res.message}")
                return 1
            stamp = json.loads((Path(tmp) / "trials/overhead" / str(i) / "result.json").read_text())["message"]
            s = json.loads(stamp)
            rows.append((s["start"] - t0, t1 - s["end"], t1 - t0))
            print(f"trial {i:2d}: submit->start {rows[-1][0]:.2f} s   done->returned {rows[-1][1]:.2f} s   "
                  f"total {rows[-1][2]:.2f} s")
    med = [statistics.median(c) for c in zip(*rows)]
    print(f"\n{a.trials} trials, 2 ranks each, poll interval {a.poll} s, {r.squeue_calls} squeue calls")
    print(f"median submit->start {med[0]:.2f} s (max {max(x[0] for x in rows):.2f}), "
          f"done->returned {med[1]:.2f} s, total per trial {med[2]:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
