"""What a multi-node search shares (`tuner search --nodes N,2N`, issue 27 item 6), on worlds that share none of the
model's formulas (benchmarks/worlds_ext, issue 30).

Per drawn world: a guided study at N nodes (--budget trials), then at 2N three answers, each scored by the TRUE
samples/s of the layout it recommends / the world's fastest layout at 2N (World.optimum):
- cold: a guided study at 2N alone, --budget trials;
- linked: a guided study at 2N that starts from the N study's trials, as `tuner search --nodes N,2N` hands them
  on (tuner.study.linked_history: the guided searcher's `history`), --budget trials;
- best: `tuner best --nodes 2N` from the N study alone (no trial at 2N: the transfer of ext_search --transfer).
Every study runs through tuner's Driver with the world's runner (2 % log-normal noise) and the guided searcher's
stop rule off. Seeds are drawn at run time (printed; --seed-list reproduces a run).

    python benchmarks/linked_search.py [--seeds 3] [--seed-list 1,2] [--families torchtitan,moe] [--budget 4]
        [--jobs 1]

Prints per world family and workload the median / worst seed of each answer, and the wall time.
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import ext_search  # noqa: E402  (sys.path, thread limits, and the scoring: recommended, fraction, cell)
from ext_search import NOISE, cell, fraction, recommended  # noqa: E402
from worlds_ext import draw_world  # noqa: E402

from tuner.best import best_for_unmeasured  # noqa: E402
from tuner.driver import Driver  # noqa: E402
from tuner.executors import InlineExecutor  # noqa: E402
from tuner.search import make_searcher  # noqa: E402
from tuner.space import load_space  # noqa: E402
from tuner.store import StudyRecord, open_store  # noqa: E402
from tuner.trial import Status  # noqa: E402

ANSWERS = ("cold", "linked", "best")


def study(world, seed: int, budget: int, history: list | None = None, studies: dict | None = None):
    """(the trials that ran, in order; the study's record): a guided study of `world`, starting from `history`."""
    w = world.workload
    space = load_space(world.space) if isinstance(world.space, str) else world.space
    store = open_store("sqlite://")
    name = f"guided-{w.nodes}n-{seed}"
    store.create_study(StudyRecord(name, w.as_dict(), {"name": space.name}, "guided", "world"))
    cands = ext_search.study_candidates(world)
    s = make_searcher("guided", cands, seed=seed, workload=w, stop_threshold=None, history=history or [],
                      history_studies=studies or {}, reserve=ext_search.study_reserve(world, cands))
    Driver(store=store, study=name, workload=w, searcher=s, runner=world.runner(noise=NOISE, seed=seed),
           executor=InlineExecutor(), budget=budget, results_dir=Path(tempfile.gettempdir())).run()
    trials, rec = sorted(store.trials(name), key=lambda t: t.number), store.get_study(name)
    store.close()
    return trials, rec


def evaluate(task: tuple) -> dict:
    family, case, seed, budget = task
    world = draw_world(family, case, seed)
    world2 = world.at_nodes(2 * world.workload.nodes)
    opt2 = world2.optimum()[1]
    at_n, rec = study(world, seed, budget)
    ran = lambda trials: [t for t in trials if t.status != Status.PRUNED]  # noqa: E731
    cold, _ = study(world2, seed, budget)
    linked, _ = study(world2, seed, budget, history=at_n, studies={rec.name: rec})
    space = load_space(world2.space) if isinstance(world2.space, str) else world2.space
    best = best_for_unmeasured(world2.workload, space, at_n, k=1, studies={rec.name: rec})[0]["layout"]
    return {"family": family, "workload": world.label, "seed": seed,
            "at_n": fraction(world, recommended(ran(at_n), budget), world.optimum()[1]),
            "cold": fraction(world2, recommended(ran(cold), budget), opt2),
            "linked": fraction(world2, recommended(ran(linked), budget), opt2), "best": fraction(world2, best, opt2)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=3, help="seeds drawn at run time")
    ap.add_argument("--seed-list", default="", help="comma-separated seeds to reproduce a run")
    ap.add_argument("--families", default="", help="comma-separated world families (default all)")
    ap.add_argument("--budget", type=int, default=4, help="trials per node count")
    ap.add_argument("--jobs", type=int, default=1)
    args = ap.parse_args(argv)
    t0 = time.monotonic()
    ns = argparse.Namespace(seeds=args.seeds, seed_list=args.seed_list, families=args.families, workloads=None,
                            searchers="guided", budget=args.budget, stop_budget=0, transfer=False)
    worlds, seeds = ext_search.tasks_for(ns)
    tasks = [(f, i, sd, args.budget) for _, (f, i, sd, *_rest) in worlds]
    print(f"{len(tasks)} worlds ({len(seeds)} seeds), guided, {args.budget} trials per node count, noise {NOISE}\n"
          f"seeds: {','.join(map(str, seeds))}  (reproduce: --seed-list {','.join(map(str, seeds))})\n", flush=True)
    with multiprocessing.get_context("fork").Pool(args.jobs) as pool:
        results = pool.map(evaluate, tasks, chunksize=1)
    print(f"true speed of the recommended layout / the world's fastest, median / worst seed; at N after {args.budget} "
          f"trials, then at 2N: cold ({args.budget} trials at 2N), linked ({args.budget} at 2N after the N study's), "
          f"best (`tuner best --nodes 2N` from the N study, no trial at 2N)\n")
    print(f"{'family':14} {'workload':32} {'at N':>13} " + " ".join(f"{a:>13}" for a in ANSWERS))
    for fam, wl in dict.fromkeys((r["family"], r["workload"]) for r in results):
        rs = [r for r in results if (r["family"], r["workload"]) == (fam, wl)]
        print(f"{fam:14} {wl:32} {cell([r['at_n'] for r in rs]):>13} " +
              " ".join(f"{cell([r[a] for r in rs]):>13}" for a in ANSWERS))
    for a in ANSWERS:
        print(f"all worlds, {a}: median {statistics.median(r[a] for r in results):.3f}, "
              f"worst {min(r[a] for r in results):.3f}")
    better, worse = (sum(op(r["linked"] - r["cold"]) for r in results) for op in (lambda d: d > 1e-9, lambda d: d < -1e-9))
    print(f"linked above cold in {better} worlds, below in {worse}, of {len(results)}")
    print(f"wall time {time.monotonic() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
