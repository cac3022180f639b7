"""Driver overhead: trials per second end to end with the simulator (store writes included).

    python benchmarks/driver_overhead.py [--budget 200]

Target (issue 3): >= 50 trials/s with the random searcher; the same figure is printed for the others.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from tuner.driver import Driver
from tuner.executors import make_executor
from tuner.runners import make_runner
from tuner.search import make_searcher
from tuner.space import load_space
from tuner.specs import make_workload
from tuner.store import StudyRecord, open_store


def run(searcher: str, budget: int, parallel: int, db: str) -> tuple[float, int, int]:
    w = make_workload("175b", 128)
    sp = load_space()
    store = open_store(db)
    name = f"bench-{searcher}-{parallel}"
    store.create_study(StudyRecord(name=name, workload=w.as_dict(), space={"name": sp.name, "dimensions": sp.dimensions,
                                   "constraints": sp.constraints}, searcher=searcher, runner="sim",
                                   settings={"budget": budget}))
    t0 = time.perf_counter()
    cands = sp.enumerate_layouts(w)
    d = Driver(store=store, study=name, workload=w, searcher=make_searcher(searcher, cands, seed=1),
               runner=make_runner("sim", noise=0.02, seed=1), executor=make_executor("thread", parallel),
               budget=budget, parallel=parallel)
    out = d.run()
    return time.perf_counter() - t0, out.ran, out.pruned


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--budget", type=int, default=200)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        db = f"sqlite:///{Path(tmp) / 'bench.db'}"
        print(f"175B on 128 Frontier nodes, simulator runner, SQLite file store, budget {args.budget}")
        print(f"{'searcher':>8} {'parallel':>8} {'ran':>5} {'pruned':>6} {'seconds':>8} {'trials/s':>9} {'stored/s':>9}")
        for searcher, parallel in (("random", 1), ("random", 4), ("grid", 1), ("guided", 1), ("guided", 4),
                                   ("tpe", 1), ("cbo", 1), ("cbo", 4)):
            if searcher == "cbo":
                import deephyper  # noqa: F401  (import time is not driver overhead)
            secs, ran, pruned = run(searcher, args.budget, parallel, db)
            print(f"{searcher:>8} {parallel:>8} {ran:>5} {pruned:>6} {secs:>8.2f} {ran / secs:>9.1f} "
                  f"{(ran + pruned) / secs:>9.1f}")


if __name__ == "__main__":
    main()
