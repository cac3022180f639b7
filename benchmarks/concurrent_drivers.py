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

from tuner import study as tuner_study
from tuner.space import load_space
from tuner.specs import make_workload
from tuner.store import open_store

STUDY = f"bench-concurrent-{int(time.time())}"


def one_driver(db: str, study: str) -> int:
    """One more driver joining the study, as `tuner resume STUDY --join` does (the study's budget is shared)."""
    store = open_store(db)
    return tuner_study.resume(store, study, mode="join").outcome.ran


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
    w = make_workload("175b", 256)
    tuner_study.create(store, tuner_study.new_record(STUDY, w, load_space(), searcher="random", runner="sim",
                                                     budget=args.budget * args.drivers,
                                                     runner_options={"sim_delay": args.delay}))
    t0 = time.perf_counter()
    with mp.get_context("spawn").Pool(args.drivers) as pool:
        ran = pool.starmap(one_driver, [(db, STUDY)] * args.drivers)
    secs = time.perf_counter() - t0
    trials = store.trials(STUDY)
    dupes = sum(n - 1 for n in Counter(t.layout.key() for t in trials).values() if n > 1)
    measured = [t for t in trials if t.status.value != "pruned"]
    print(f"store: {store.url}")
    print(f"{args.drivers} drivers x simulator, 175B on 256 nodes, one study budget of {args.budget * args.drivers}")
    print(f"trials run per driver: {ran}; stored: {len(trials)} ({len(measured)} run, {len(trials) - len(measured)} pruned)")
    print(f"wall {secs:.2f} s (process start included) -> {len(measured) / secs:.1f} trials/s, "
          f"{len(trials) / secs:.1f} stored/s; duplicates: {dupes}")


if __name__ == "__main__":
    main()
