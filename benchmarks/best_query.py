"""Store benchmark: `best()` on 100,000 trials (target <= 100 ms) and claim+finish throughput.

    python benchmarks/best_query.py [--trials 100000] [--studies 20] [--db URL]

Fills a fresh SQLite store (a temporary file unless --db is given) with trials spread over studies of
four workloads, 70 % of them ok, then times best() and the driver's per-trial writes.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

from sqlalchemy import select

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tuner.layout import Layout  # noqa: E402
from tuner.specs import make_workload  # noqa: E402
from tuner.store import StudyRecord, open_store  # noqa: E402
from tuner.store.models import StudyRow, TrialRow, utcnow  # noqa: E402
from tuner.trial import Status, TrialResult  # noqa: E402

WORKLOADS = [("175b", 128), ("175b", 64), ("22b", 128), ("1t", 512)]
STATUSES = [Status.OK] * 7 + [Status.OOM, Status.FAILED, Status.PRUNED]


def fill(store, trials: int, studies: int, rng: random.Random) -> None:
    per_study = trials // studies
    for i in range(studies):
        model, nodes = WORKLOADS[i % len(WORKLOADS)]
        name = f"bench-{i}"
        store.create_study(StudyRecord(name=name, workload=make_workload(model, nodes).as_dict(), space={},
                                       searcher="random", runner="sim"))
        with store.engine.begin() as conn:
            sid = conn.execute(select(StudyRow.id).where(StudyRow.name == name)).scalar()
            rows = []
            for n in range(1, per_study + 1):
                status = rng.choice(STATUSES)
                peak = rng.uniform(0.1, 0.6) if status == Status.OK else None
                layout = Layout(tp=2 ** (n % 4), pp=2 ** (n % 5), dp=1, micro_batch=n)
                rows.append(dict(study_id=sid, number=n, layout_key=layout.key(), **layout.as_dict(),
                                 status=status.value, tflops_per_gpu=peak and peak * 191.5, peak_fraction=peak,
                                 samples_per_second=peak and peak * 10, peak_memory_gb=40.0,
                                 predicted_tflops_per_gpu=100.0, predicted_peak_fraction=0.5,
                                 predicted_memory_gb=40.0, predicted_step_time_s=10.0, message="",
                                 log_path=None, runner="sim", started_at=utcnow(), ended_at=utcnow(),
                                 attempts=1, extra={}))
            conn.execute(TrialRow.__table__.insert(), rows)


def timed(fn, repeat: int) -> tuple[float, float]:
    fn()   # warm the page cache and the study lookup
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times), max(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=100_000)
    ap.add_argument("--studies", type=int, default=20)
    ap.add_argument("--writes", type=int, default=2000, help="trials for the claim+finish figure")
    ap.add_argument("--db", help="store URL (default: a temporary SQLite file)")
    args = ap.parse_args()
    tmp = tempfile.TemporaryDirectory()
    url = args.db or f"sqlite:///{tmp.name}/bench.db"
    rng = random.Random(0)
    store = open_store(url)

    t0 = time.perf_counter()
    fill(store, args.trials, args.studies, rng)
    print(f"store: {store.url}")
    print(f"filled {args.trials} trials in {args.studies} studies in {time.perf_counter() - t0:.1f} s")

    for label, call in [("best k=1", lambda: store.best("gpt-175b", "frontier", 128)),
                        ("best k=10", lambda: store.best("gpt-175b", "frontier", 128, k=10)),
                        ("best k=1 --study", lambda: store.best("gpt-175b", "frontier", 128, study="bench-4")),
                        ("best k=1, no match", lambda: store.best("gpt-175b", "frontier", 3))]:
        median, worst = timed(call, 20)
        verdict = "ok" if median <= 100 else "OVER TARGET"
        print(f"{label:<20} median {median:7.2f} ms  max {worst:7.2f} ms  (target <= 100 ms: {verdict})")

    store.create_study(StudyRecord(name="bench-writes", workload=make_workload("175b", 128).as_dict(), space={},
                                   searcher="random", runner="sim"))
    layouts = [Layout(tp=8, pp=16, dp=1, micro_batch=n) for n in range(1, args.writes + 1)]
    t0 = time.perf_counter()
    for layout in layouts:
        n = store.claim_trial("bench-writes", layout, None, "sim")
        store.finish_trial("bench-writes", n, TrialResult(Status.OK, 90.0, 0.47, 3.0, 40.0))
    dt = time.perf_counter() - t0
    print(f"claim+finish: {args.writes} trials in {dt:.2f} s = {args.writes / dt:.0f} trials/s "
          f"({dt / args.writes * 1000:.2f} ms per trial)")
    store.close()
    tmp.cleanup()


if __name__ == "__main__":
    main()
