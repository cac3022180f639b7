"""Per-trial overhead of the Ray pool against the thread pool, with the simulator runner.

    RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 RAY_AUTH_MODE=disabled python benchmarks/ray_overhead.py [--address ADDR]

Without --address it starts a private Ray on loopback (2 CPUs) and times only the study, not Ray's start.
Overhead per trial = (wall time - budget * delay / parallel) / budget: what the pool adds to each trial
(placement, shipping the trial and result, store writes, the searcher).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from tuner.driver import Driver
from tuner.executors import make_executor
from tuner.runners.sim import SimRunner
from tuner.search import make_searcher
from tuner.space import load_space
from tuner.specs import make_workload
from tuner.store import StudyRecord, open_store


def run(executor, label: str, budget: int, parallel: int, delay: float, db: str) -> float:
    w = make_workload("gpt-1.4b", 1, "frontier")
    sp = load_space()
    store = open_store(db)
    name = f"bench-{label}-{parallel}-{delay}"
    store.create_study(StudyRecord(name=name, workload=w.as_dict(), space={"name": sp.name, "dimensions": sp.dimensions,
                                   "constraints": sp.constraints}, searcher="random", runner="sim",
                                   settings={"budget": budget}))
    d = Driver(store=store, study=name, workload=w,
               searcher=make_searcher("random", sp.enumerate_layouts(w), seed=1, workload=w, parallel=parallel),
               runner=SimRunner(delay=delay, seed=1), executor=executor, budget=budget, parallel=parallel,
               prune=False)
    t0 = time.perf_counter()
    out = d.run()
    secs = time.perf_counter() - t0
    assert out.ran == budget, out
    return secs


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--address", default=None, help="Ray address (default: a private local Ray, 2 CPUs)")
    ap.add_argument("--budget", type=int, default=40)
    args = ap.parse_args()
    t0 = time.perf_counter()
    ray_ex = make_executor("ray", 2, address=args.address, **({} if args.address else {"num_cpus": 2}))
    print(f"Ray {'connect' if args.address else 'start'}: {time.perf_counter() - t0:.1f} s (not counted below)")
    # one warm-up trial each, so Ray's worker processes exist before timing (a real pool is warm too)
    print(f"{'pool':>6} {'parallel':>8} {'delay s':>7} {'trials':>6} {'seconds':>8} {'overhead/trial ms':>17}")
    with tempfile.TemporaryDirectory() as tmp:
        db = f"sqlite:///{Path(tmp) / 'bench.db'}"
        for parallel in (1, 2):
            run(ray_ex, "warm", parallel, parallel, 0.0, db)
            for delay in (0.0, 0.1):
                for label, ex in (("thread", make_executor("thread", parallel)), ("ray", ray_ex)):
                    secs = run(ex, label, args.budget, parallel, delay, db)
                    if label == "thread":
                        ex.shutdown()
                    ideal = args.budget * delay / parallel
                    print(f"{label:>6} {parallel:>8} {delay:>7} {args.budget:>6} {secs:>8.2f} "
                          f"{1000 * (secs - ideal) / args.budget:>17.1f}")
    ray_ex.shutdown()


if __name__ == "__main__":
    main()
