"""Search efficiency on worlds the model did not write: how fast is the layout each searcher recommends?

The worlds (benchmarks/indep_worlds.py) have physics written independently of tuner.perfmodel, drawn
per seed in three families (compute-bound, network-bound, host-bound) over four workloads. Seeds are
drawn at run time (printed; `--seed-list` reproduces a run), never hand-picked. Every search runs
through the real Driver (default pruning, in-memory SQLite store, budget 12; guided without its stop
rule, which benchmarks/stop_calibration.py measures).

"Recommended after k trials" is the layout with the highest measured samples/s among the first k trials
that ran (pruned layouts are not trials; only status ok counts). Its score is its TRUE samples/s divided
by the world's fastest over every layout that really runs, including those the model would prune.

Transfer: a 10-trial guided study at N nodes, then the layout `tuner best --nodes 2N` answers from that
study (tuner.best.best_for_unmeasured), scored against the world at 2N (same physics, same seed).

`--modern` runs the worlds of today's dimensions instead (indep_worlds.MODERN: Llama 3 on H100, bf16 and
FP8, over the default space with sequence and context parallelism, interleaving, selective recompute).

    python benchmarks/search_efficiency.py [--seeds 10] [--seed-list 1,2,3] [--quick] [--jobs 2] [--modern]

Prints, per world, the model's rank of the optimum and how the model's memory verdicts disagree with
the world; per family and searcher the median and the worst seed after 6, 8, 10 and 12 trials; the transfer
figures; per world guided after 10 and the transfer beside their bounds (the truly fastest trial guided ran; the truly
fastest layout `best` answers from at 2N, fit_reliability.rule_bound); the wall time.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import secrets
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):   # one BLAS thread per process:
    os.environ.setdefault(_var, "1")                                         # --jobs processes share the cores

from fit_reliability import (BOUNDS_NOTE, best_at, measured_ok, print_reliability, print_riskier,  # noqa: E402
                             riskier, verdict, without_offload)
from indep_worlds import FAMILIES, MODERN, WORKLOADS, World, draw_world  # noqa: E402

from tuner.driver import Driver  # noqa: E402
from tuner.executors import InlineExecutor  # noqa: E402
from tuner.perfmodel import RECOMMEND_AT, rank  # noqa: E402
from tuner.search import make_searcher  # noqa: E402
from tuner.space import load_space  # noqa: E402
from tuner.specs import make_workload  # noqa: E402
from tuner.store import StudyRecord, open_store  # noqa: E402
from tuner.trial import Status  # noqa: E402

SEARCHERS = ("guided", "cbo", "tpe", "random", "grid")
AFTER = (6, 8, 10, 12)    # 10: the budget of issue 30's target
BUDGET = 12
TRANSFER_BUDGET = 10
NOISE = 0.02
FAR = 20        # a world whose optimum the model ranks beyond this is one the model alone would miss


def run_study(world: World, searcher: str, seed: int, budget: int, transfer_nodes: int | None = None, runs=None,
              fraction=None):
    """(trials that ran, in order; `tuner best`'s answer for transfer_nodes, or None). `runs(layout)`: whether the
    world at transfer_nodes runs a layout; given, the answer's "fit_pairs" are (stated p_fit, ran) of every layout
    `best` weighs there; `fraction(layout)`: its true speed there / the fastest, for the answer's "bound"
    (fit_reliability.best_at)."""
    w, space = world.workload, without_offload(load_space(world.space))
    store = open_store("sqlite://")
    name = f"{searcher}-{seed}"
    runner = world.runner(noise=NOISE, seed=seed)
    store.create_study(StudyRecord(name, w.as_dict(), {"name": space.name}, searcher, runner.name))
    options = {"stop_threshold": None} if searcher == "guided" else {}
    s = make_searcher(searcher, world.candidates, seed=seed, workload=w, **options)
    Driver(store=store, study=name, workload=w, searcher=s, runner=runner, executor=InlineExecutor(),
           budget=budget, results_dir=Path(tempfile.gettempdir())).run()
    trials = sorted(store.trials(name), key=lambda t: t.number)
    best = None
    if transfer_nodes:
        w2 = make_workload(w.model, transfer_nodes, w.cluster, precision=w.precision)
        best = best_at(w2, space, trials, {name: store.get_study(name)}, runs, fraction)
    store.close()
    return [t for t in trials if t.status != Status.PRUNED], best


def recommended(trials: list, k: int):
    """The layout with the highest measured samples/s among the first k trials that ran (None: none ok)."""
    ok = measured_ok(trials, k)
    return max(ok, key=lambda t: t.samples_per_second).layout if ok else None


def true_fraction(world: World, layout, opt: float) -> float:
    if layout is None:
        return 0.0
    v = world.truth(layout)[0]
    return (v or 0.0) / opt


def model_facts(world: World, opt_layout) -> dict:
    """What the tuner's model says about this world: the rank of its optimum, memory disagreements."""
    preds = rank(world.candidates, world.workload)
    order = [p.layout for p in preds]
    runs = {p.layout: world.truth(p.layout)[0] is not None for p in preds}
    top_v = world.truth(order[0])[0] or 0.0
    return {"rank": order.index(opt_layout) + 1, "candidates": len(preds), "runs": sum(runs.values()),
            "oom_fit": sum(p.p_fit >= RECOMMEND_AT and not runs[p.layout] for p in preds),
            "run_pruned": sum(runs[p.layout] and not p.fits for p in preds),
            "opt_pruned": not next(p.fits for p in preds if p.layout == opt_layout),
            "model_top": top_v / world.truth(opt_layout)[0]}


def evaluate(task: tuple) -> dict:
    """Every searcher and the transfer case on one drawn world."""
    order, (family, (model, nodes, *where), seed, searchers) = task      # where: (cluster, precision) or ()
    world = draw_world(family, model, nodes, seed, *where)
    opt_layout, opt = world.optimum()
    label = f"{model}@{nodes}n" + ("" if not where or where[1] == "bf16" else f"-{where[1]}")
    out = {"order": order, "family": family, "workload": label, "seed": seed,
           **model_facts(world, opt_layout), "scores": {}}
    for s in searchers:
        trials, _ = run_study(world, s, seed, BUDGET)
        out["scores"][s] = [true_fraction(world, recommended(trials, k), opt) for k in AFTER]
        if s == "guided":     # the truly fastest trial it ran in issue 30's budget: the noise's bound
            out["ran_best"] = max((true_fraction(world, t.layout, opt) for t in measured_ok(trials, TRANSFER_BUDGET)),
                                  default=0.0)
    world2 = draw_world(family, model, 2 * nodes, seed, *where)
    opt2 = world2.optimum()[1]
    _, answer = run_study(world, "guided", seed, TRANSFER_BUDGET, transfer_nodes=2 * nodes,
                          runs=lambda lay: world2.truth(lay)[0] is not None,
                          fraction=lambda lay: true_fraction(world2, lay, opt2))
    out["fit_pairs"] = answer["fit_pairs"]
    out["transfer"], out["transfer_bound"] = true_fraction(world2, answer["layout"], opt2), answer["bound"]
    out["transfer_oom"] = world2.truth(answer["layout"])[0] is None
    out["transfer_p_fit"] = answer["p_fit"]
    out.update(riskier(answer, lambda lay: true_fraction(world2, lay, opt2)))     # what one trial would decide
    return out


def cell(values: list[float]) -> str:
    return f"{statistics.median(values):.3f} / {min(values):.3f}"


def print_worlds(results: list[dict]) -> None:
    print("worlds: the model's rank of each seed's optimum (* = the model prunes it), layouts the model says fit that "
          "OOM, layouts it prunes that run, the model's top pick's true speed / optimum (median)\n")
    head = (f"{'family':14} {'workload':10} {'cands':>5} {'runs':>5} {'oom|fit':>7} {'run|pruned':>10} {'top/opt':>7}"
            "  ranks")
    print(head)
    print("-" * len(head))
    for fam in FAMILIES:
        for wl in dict.fromkeys(r["workload"] for r in results if r["family"] == fam):
            rs = [r for r in results if r["family"] == fam and r["workload"] == wl]
            ranks = " ".join(f"{r['rank']}{'*' if r['opt_pruned'] else ''}" for r in rs)
            med = lambda k: statistics.median(r[k] for r in rs)  # noqa: E731
            print(f"{fam:14} {wl:10} {rs[0]['candidates']:5d} {med('runs'):5g} {med('oom_fit'):7g} "
                  f"{med('run_pruned'):10g} {med('model_top'):7.3f}  {ranks}")
    far = sum(r["rank"] > FAR for r in results)
    print(f"\n{far} of {len(results)} worlds have their optimum ranked beyond {FAR} by the model; "
          f"{sum(r['oom_fit'] > 0 for r in results)} have an OOM among layouts the model would recommend "
          f"unmeasured (p_fit >= {RECOMMEND_AT}), "
          f"{sum(r['run_pruned'] > 0 for r in results)} a running layout the model prunes\n")


def print_scores(results: list[dict], searchers: list[str]) -> None:
    print("true speed of the recommended layout / the world's fastest, median / worst seed\n")
    head = f"{'family':14} {'searcher':8} " + " ".join(f"{f'after {k}':>15}" for k in AFTER)
    print(head)
    print("-" * len(head))
    for fam in FAMILIES:
        rs = [r for r in results if r["family"] == fam]
        if not rs:
            continue
        for s in searchers:
            cols = [cell([r["scores"][s][i] for r in rs]) for i in range(len(AFTER))]
            print(f"{fam:14} {s:8} " + " ".join(f"{c:>15}" for c in cols))
        ooms = sum(r["transfer_oom"] for r in rs)
        print(f"{fam:14} {'transfer':8} {cell([r['transfer'] for r in rs]):>15}  (guided {TRANSFER_BUDGET} trials "
              f"at N -> best at 2N: true / fastest at 2N; OOM at 2N in {ooms} of {len(rs)})")
    per_world(results, searchers)
    stated = [r["transfer_p_fit"] for r in results]
    if stated:     # p_fit is printed to users as a probability: the realised fit rate must match it
        print(f"\ntransfer picks' stated p_fit: mean {sum(stated) / len(stated):.3f}, lowest {min(stated):.3f}; "
              f"realised fit rate {1 - sum(r['transfer_oom'] for r in results) / len(results):.3f} of {len(results)}")
        print_riskier(results)
        print_reliability([r["fit_pairs"] for r in results])
    print()


def per_world(results: list[dict], searchers: list[str]) -> None:
    """Issue 30's targets are per world: each searcher after 10 trials and the transfer to 2N, median / worst seed, for
    every (family, workload) -- a family's line above pools its four workloads."""
    k = AFTER.index(TRANSFER_BUDGET)
    ran = all("ran_best" in r for r in results)
    head = (f"\n{'family':14} {'workload':10} " + " ".join(f"{s + ' @10':>15}" for s in searchers)
            + (f" {'ran, fastest':>15}" if ran else "") + f" {'transfer 2N':>15} {'2N, bound':>15}")
    print(head + "\n" + "-" * (len(head) - 1))
    for fam in FAMILIES:
        for wl in dict.fromkeys(r["workload"] for r in results if r["family"] == fam):
            rs = [r for r in results if r["family"] == fam and r["workload"] == wl]
            cols = ([cell([r["scores"][s][k] for r in rs]) for s in searchers]
                    + ([cell([r["ran_best"] for r in rs])] if ran else [])
                    + [cell([r["transfer"] for r in rs]), cell([r["transfer_bound"] for r in rs])])
            print(f"{fam:14} {wl:10} " + " ".join(f"{c:>15}" for c in cols))
    print(f"\n{BOUNDS_NOTE}")
    if "guided" in searchers:
        groups = [[r for r in results if (r["family"], r["workload"]) == key]
                  for key in dict.fromkeys((r["family"], r["workload"]) for r in results)]
        print("\n" + verdict([(f"{rs[0]['family']} {rs[0]['workload']}", [r["scores"]["guided"][k] for r in rs],
                                [r["transfer"] for r in rs]) for rs in groups]))


def tasks_for(args) -> tuple[list[tuple], list[int]]:
    if args.seed_list:
        seeds = [int(s) for s in args.seed_list.split(",")]
    else:
        seeds = [secrets.randbits(31) for _ in range(3 if args.quick and args.seeds is None else args.seeds or 10)]
    searchers = args.searchers.split(",")
    workloads = MODERN if args.modern else WORKLOADS
    worlds = [(f, workloads[i % len(workloads)]) for i, f in enumerate(FAMILIES)] if args.quick else \
        [(f, wl) for f in FAMILIES for wl in workloads]
    return list(enumerate((f, wl, seed, searchers) for f, wl in worlds for seed in seeds)), seeds


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=None, help="seeds drawn at run time (default 10; 3 with --quick)")
    ap.add_argument("--seed-list", default="", help="comma-separated seeds to reproduce a run")
    ap.add_argument("--quick", action="store_true", help="one workload per family (smoke run)")
    ap.add_argument("--searchers", default=",".join(SEARCHERS))
    ap.add_argument("--jobs", type=int, default=2, help="worker processes over (world, seed)")
    ap.add_argument("--modern", action="store_true",
                    help="the worlds of today's dimensions (Llama 3 on H100, bf16/FP8, the default space)")
    args = ap.parse_args(argv)
    t0 = time.monotonic()
    tasks, seeds = tasks_for(args)
    print(f"{len(tasks)} {'MODERN' if args.modern else 'WORKLOADS'} worlds ({len(seeds)} seeds), searchers {args.searchers}, budget {BUDGET}, noise {NOISE}, "
          f"{args.jobs} processes\nseeds: {','.join(map(str, seeds))}  (reproduce: --seed-list "
          f"{','.join(map(str, seeds))}{' --quick' if args.quick else ''}{' --modern' if args.modern else ''})\n", flush=True)
    results = []
    with multiprocessing.get_context("fork").Pool(args.jobs) as pool:
        for r in pool.imap_unordered(evaluate, tasks, chunksize=1):
            results.append(r)
            print(f"\r{len(results)}/{len(tasks)} worlds, {time.monotonic() - t0:.0f} s", end="", file=sys.stderr,
                  flush=True)
    print(file=sys.stderr)
    results.sort(key=lambda r: r["order"])
    print_worlds(results)
    print_scores(results, args.searchers.split(","))
    print(f"wall time {time.monotonic() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
