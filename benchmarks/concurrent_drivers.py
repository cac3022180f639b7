"""Several drivers on one study in a shared store: total trials per second and duplicates (must be 0).

    python benchmarks/concurrent_drivers.py --db postgresql+psycopg://tuner:tuner@127.0.0.1:5432/tuner
    python benchmarks/concurrent_drivers.py            # SQLite file in a temp dir

Each driver is its own process (as on separate login nodes), joins the same study and claims layouts
transactionally; the store refuses a second claim of a layout.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import tempfile
import time
from collections import Counter

from tuner.driver import Driver
from tuner.executors import make_executor
from tuner.runners import make_runner
from tuner.search import make_searcher
from tuner.space import load_space
from tuner.specs import Workload, make_workload
from tuner.store import StudyRecord, open_store

STUDY = f"bench-concurrent-{int(time.time())}"


def one_driver(db: str, study: str, seed: int, budget: int, delay: float) -> int:
    store = open_store(db)
    rec = store.get_study(study)
    w, sp = Workload.from_dict(rec.workload), load_space()
    d = Driver(store=store, study=study, workload=w, space=sp,
               searcher=make_searcher("random", sp.enumerate_layouts(w), seed=seed),
               runner=make_runner("sim", seed=0, delay=delay), executor=make_executor("thread", 1),
               budget=budget, parallel=1)
    return d.run().ran


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--db", default=os.environ.get("TUNER_TEST_PG_URL"))
    ap.add_argument("--drivers", type=int, default=4)
    ap.add_argument("--budget", type=int, default=40, help="per driver")
    ap.add_argument("--delay", type=float, default=0.0, help="simulated seconds per trial")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp()
    db = args.db or f"sqlite:///{tmp}/bench.db"
    store = open_store(db)
    if STUDY in store.study_names():
        raise SystemExit(f"study {STUDY} exists in {store.url}: use a fresh database")
    w, sp = make_workload("175b", 256), load_space()
    store.create_study(StudyRecord(name=STUDY, workload=w.as_dict(), space={"name": sp.name, "dimensions": sp.dimensions,
                                   "constraints": sp.constraints}, searcher="random", runner="sim", settings={}))
    t0 = time.perf_counter()
    with mp.get_context("spawn").Pool(args.drivers) as pool:
        ran = pool.starmap(one_driver, [(db, STUDY, seed, args.budget, args.delay) for seed in range(args.drivers)])
    secs = time.perf_counter() - t0
    trials = store.trials(STUDY)
    dupes = sum(n - 1 for n in Counter(t.layout.key() for t in trials).values() if n > 1)
    measured = [t for t in trials if t.status.value != "pruned"]
    print(f"store: {store.url}")
    print(f"{args.drivers} drivers x simulator, 175B on 256 nodes, {args.budget} trials per driver")
    print(f"trials run per driver: {ran}; stored: {len(trials)} ({len(measured)} run, {len(trials) - len(measured)} pruned)")
    print(f"wall {secs:.2f} s (process start included) -> {len(measured) / secs:.1f} trials/s, "
          f"{len(trials) / secs:.1f} stored/s; duplicates: {dupes}")


if __name__ == "__main__":
    main()
