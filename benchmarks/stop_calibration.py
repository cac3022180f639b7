"""Is guided's stated confidence a probability? Stated confidence vs realised false-stop rate.

Runs many guided searches, each on a freshly drawn independent world (benchmarks/indep_worlds.py:
physics written apart from tuner.perfmodel, parameters drawn per seed; family, workload and seed drawn
at run time from the OS, printed for reproduction), with the study defaults `tuner search` uses
(tuner.search.guided.STUDY_DEFAULTS), 2 % measurement noise and the model pruning layouts it predicts
not to fit, as the driver does. Each search runs until guided stops or the budget is spent.

A *false stop*: guided stopped, and the world's fastest layout (over every layout that really runs)
is more than the threshold faster than the recommended one (the fastest measured). The claim printed
at a stop is "c % confident that no layout trains more than threshold faster", so in each bin of
stated confidence the realised false-stop rate must be at most 1 - c (within binomial error).

A second table bins every state along the way (after each trial, from the first success), whether or
not it stopped there: the same claim, checked at every confidence level the searcher states.

`--modern` draws the worlds of today's dimensions instead (indep_worlds.MODERN: Llama 3 on H100, bf16
and FP8, the default space with sp, cp, vp, selective recompute).

    python benchmarks/stop_calibration.py [--runs 200] [--budget 30] [--seed-list 1,2,...] [--jobs 2] [--modern]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import secrets
import sys
import time
from multiprocessing import Pool
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):   # one BLAS thread per process:
    os.environ.setdefault(_var, "1")                                         # --jobs processes share the cores

import indep_worlds as iw  # noqa: E402

from tuner import metrics  # noqa: E402
from tuner.perfmodel import predict  # noqa: E402
from tuner.search.guided import STUDY_DEFAULTS, GuidedSearcher  # noqa: E402
from tuner.trial import Status, TrialResult, TrialSpec  # noqa: E402

BINS = [(0.0, 0.5), (0.5, 0.8), (0.8, 0.9), (0.9, 0.95), (0.95, 0.99), (0.99, 1.0001)]


def drive(s, world, budget: int, seed: int, noise: float = 0.02, after=None) -> list:
    """Ask one layout at a time, prune what the model says cannot fit (as the driver does), measure the
    rest in `world` with seeded noise and tell the searcher; `after(layout, result)` after each trial.
    The layouts that ran, in order."""
    w, runner, ran = world.workload, world.runner(noise=noise, seed=seed), []
    while len(ran) < budget and (got := s.ask(1)):
        lay = got[0]
        p = predict(lay, w)
        if not p.fits:
            s.tell(lay, TrialResult(Status.PRUNED, peak_memory_gb=p.memory_gb))
            continue
        res = metrics.complete(runner.run(TrialSpec("cal", len(ran) + 1, lay, w)), w, lay)
        s.tell(lay, res)
        ran.append(lay)
        if after:
            after(lay, res)
    return ran


def draw(seed: int, modern: bool = False) -> "iw.World":
    """The world of `seed`: family and workload cycle with it (MODERN's workloads when `modern`)."""
    fam = iw.FAMILIES[seed % len(iw.FAMILIES)]
    workloads = iw.MODERN if modern else iw.WORKLOADS
    model, nodes, *where = workloads[(seed // len(iw.FAMILIES)) % len(workloads)]     # where: cluster, precision
    return iw.draw_world(fam, model, nodes, seed, *where)


def one_search(seed: int, budget: int, noise: float = 0.02, options: dict | None = None,
               modern: bool = False) -> dict:
    """One guided search on the world drawn from `seed`: its stop, and every state along the way."""
    world = draw(seed, modern)
    t0 = time.monotonic()
    _, opt = world.optimum()
    opts = {**STUDY_DEFAULTS, **(options or {})}
    thr = opts["stop_threshold"]
    s = GuidedSearcher(world.candidates, seed=seed, workload=world.workload, **opts)
    states, best = [], [None, -1.0]

    def after(lay, res):
        if res.status == Status.OK and res.mfu > best[1]:
            best[:] = [lay, res.mfu]
        if best[0] is not None:
            s._should_stop()                                    # the confidence it states now
            states.append((s.confidence, (world.truth(best[0])[0] or 0.0) * (1 + thr) < opt))

    ran = drive(s, world, budget, seed, noise, after)
    true = (world.truth(best[0])[0] or 0.0) if best[0] is not None else 0.0
    return {"seed": seed, "world": world.name, "stopped": s.stopped, "trials": len(ran),
            "confidence": s.confidence, "ratio": true / opt, "false": s.stopped and true * (1 + thr) < opt,
            "states": states, "family": world.family, "seconds": time.monotonic() - t0}


def wilson(k: int, n: int, sign: int, z: float = 1.96) -> float:
    """Wilson bound (sign +1 upper, -1 lower) of a binomial proportion."""
    if n == 0:
        return 1.0 if sign > 0 else 0.0
    p = k / n
    c = p + z * z / (2 * n) + sign * z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return min(1.0, max(0.0, c / (1 + z * z / n)))


def table(pairs: list[tuple[float, bool]], title: str) -> bool:
    print(f"\n{title}\n{'stated confidence':>18} {'n':>5} {'false':>6} {'rate':>7} {'95% upper':>9} {'allowed':>8}  ok")
    good = True
    for lo, hi in BINS:
        got = [f for c, f in pairs if c is not None and lo <= c < hi]
        if not got:
            continue
        k, n = sum(got), len(got)
        allowed = 1 - lo
        ok = wilson(k, n, -1) <= allowed          # the rate is within binomial error of the allowance
        good &= ok
        print(f"{f'[{lo:.2f}, {min(hi, 1):.2f})':>18} {n:5d} {k:6d} {k / n:7.3f} {wilson(k, n, +1):9.3f} "
              f"{allowed:8.2f}  {'yes' if ok else 'NO'}")
    return good


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--budget", type=int, default=30)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--seed-list", default=None, help="comma-separated seeds (reproduce a run); default: drawn now")
    ap.add_argument("--options", default="{}", help="JSON: guided options over the study defaults (explore)")
    ap.add_argument("--modern", action="store_true",
                    help="the worlds of today's dimensions (Llama 3 on H100, bf16/FP8, the default space)")
    args = ap.parse_args(argv)
    seeds = ([int(x) for x in args.seed_list.split(",")] if args.seed_list
             else [secrets.randbelow(2**31) for _ in range(args.runs)])
    print(f"{len(seeds)} guided searches on {'MODERN' if args.modern else 'WORKLOADS'} worlds, budget {args.budget}, "
          f"defaults {STUDY_DEFAULTS}; seeds drawn now: {','.join(map(str, seeds[:12]))}"
          f"{',...' if len(seeds) > 12 else ''}  (all: --seed-list {','.join(map(str, seeds))})")
    t0 = time.monotonic()
    with Pool(args.jobs) as pool:
        runs = pool.starmap(one_search, [(sd, args.budget, 0.02, json.loads(args.options), args.modern)
                                         for sd in seeds])
    stops = [r for r in runs if r["stopped"]]
    false = [r for r in stops if r["false"]]
    summary(runs, stops, false)
    ok1 = table([(r["confidence"], r["false"]) for r in stops], "At the stops (the figure printed to users)")
    ok2 = table([st for r in runs for st in r["states"]], "Every state along the way (after each trial)")
    for r in false[:10]:
        print(f"  false stop: seed {r['seed']} {r['world']} after {r['trials']} trials at {r['ratio']:.3f} "
              f"of the fastest, stated {100 * r['confidence']:.1f} %")
    print(f"\ncalibrated in every bin: {'yes' if ok1 and ok2 else 'NO'}   ({time.monotonic() - t0:.0f} s)")
    return 0


def summary(runs: list[dict], stops: list[dict], false: list[dict]) -> None:
    """The stop rate, trials to stop and final ratio, overall and per family."""
    ratios = sorted(r["ratio"] for r in runs)
    print(f"stopped early in {len(stops)} of {len(runs)} searches (median {_median([r['trials'] for r in stops])} "
          f"trials); false stops {len(false)} = {len(false) / max(len(stops), 1):.3f} of stops, "
          f"{len(false) / len(runs):.3f} of searches")
    print(f"recommended / fastest at the end: median {ratios[len(ratios) // 2]:.3f}, worst {ratios[0]:.3f}; "
          f"median {_median([r['seconds'] for r in runs]):.1f} s per search")
    print(f"\n{'family':14} {'runs':>5} {'stopped':>7} {'trials to stop (med, min-max)':>30} {'false':>5} "
          f"{'ratio med':>9} {'worst':>6}")
    for fam in iw.FAMILIES:
        rs = [r for r in runs if r["family"] == fam]
        if not rs:
            continue
        st = sorted(r["trials"] for r in rs if r["stopped"])
        span = f"{_median(st)} ({st[0]}-{st[-1]})" if st else "-"
        rat = sorted(r["ratio"] for r in rs)
        print(f"{fam:14} {len(rs):5d} {len(st):7d} {span:>30} {sum(r['false'] for r in rs):5d} "
              f"{rat[len(rat) // 2]:9.3f} {rat[0]:6.3f}")


def _median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2] if xs else "-"


if __name__ == "__main__":
    sys.exit(main())
