"""Search efficiency on worlds that differ from the model: trials to reach within 3 % of the world's optimum.

Each world (benchmarks/world.py) is the simulator with perturbed cluster constants, physics the model
lacks, a memory estimate that is off, and 2 % seeded noise. Its optimum is found by evaluating the
world on every candidate the default driver would run (the model prunes layouts it predicts not to
fit; worlds where such a layout would be faster say so in the 'pruned opt' column). Every searcher runs
through the Driver (default pruning) with an in-memory SQLite store; one configuration also runs
through the command runner (`python benchmarks/world.py --perturb JSON`) to prove that path gives the
same trials.

    python benchmarks/search_efficiency.py [--seeds 5] [--budget 40] [--searchers guided,cbo,...] [--worlds a,b]

Prints per world and searcher the median number of trials to reach within 3 % of the optimum (">B"
when a run never did within the budget B) and the median best fraction of the optimum after 12 trials.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from world import WorldRunner, truth  # noqa: E402

from tuner.driver import Driver  # noqa: E402
from tuner.executors import InlineExecutor  # noqa: E402
from tuner.perfmodel import predict  # noqa: E402
from tuner.runners.command import CommandRunner  # noqa: E402
from tuner.search import make_searcher  # noqa: E402
from tuner.space import load_space  # noqa: E402
from tuner.specs import make_workload  # noqa: E402
from tuner.store import StudyRecord, open_store  # noqa: E402
from tuner.trial import Status  # noqa: E402

WITHIN = 0.97
AT = 12
SEARCHERS = ("guided", "cbo", "tpe", "random", "grid")
# name -> (model, nodes, perturbation); multipliers on the cluster file's constants (benchmarks/world.py)
WORLDS = {
    "22b-2n-slowtp2": ("22b", 2, {"matmul_efficiency": 0.7, "gemm_knee_gflop": 1.5, "microbatch_overhead_ms": 1.5,
                                  "slow": {"tp2": 1.25}}),
    "22b-2n-hbm-mem": ("22b", 2, {"hbm_bandwidth_gbps": 0.5, "gemm_knee_gflop": 0.5, "memory_reserved_gb": 2.5,
                                  "slow": {"pp1": 1.15}}),
    "22b-8n-slownet": ("22b", 8, {"inter_node_bandwidth_gbps": 0.5, "intra_node_bandwidth_gbps": 0.5, "latency_us": 2.0,
                                  "memory_reserved_gb": 3.0, "slow": {"mb4": 1.1, "z1": 1.08}}),
    "22b-8n-fastnet": ("22b", 8, {"inter_node_bandwidth_gbps": 1.5, "matmul_efficiency": 1.3, "gemm_knee_gflop": 0.6,
                                  "pp_penalty": 0.04, "tp_penalty": 0.1}),
    "175b-16n-memoff": ("175b", 16, {"activation_memory": 1.5, "memory_reserved_gb": 4.0,
                                     "microbatch_overhead_ms": 2.0}),
    "175b-16n-overhead": ("175b", 16, {"microbatch_overhead_ms": 2.5, "gemm_knee_gflop": 1.5,
                                       "inter_node_bandwidth_gbps": 0.7, "slow": {"pp16": 1.12}}),
    "175b-64n-slownet": ("175b", 64, {"inter_node_bandwidth_gbps": 0.5, "memory_reserved_gb": 1.5, "zero_penalty": 0.03,
                                      "slow": {"tp4": 1.12}}),
    "175b-64n-smallgemm": ("175b", 64, {"gemm_knee_gflop": 0.4, "microbatch_overhead_ms": 0.4,
                                        "intra_node_bandwidth_gbps": 0.5, "slow": {"dp32": 1.1}}),
    "1t-128n-lowmem": ("1t", 128, {"activation_memory": 0.7, "gemm_knee_gflop": 0.5, "inter_node_bandwidth_gbps": 0.6,
                                   "microbatch_overhead_ms": 1.5, "slow": {"pp16": 1.1}}),
    "1t-128n-oom": ("1t", 128, {"activation_memory": 1.3, "microbatch_overhead_ms": 3.0,
                                "inter_node_bandwidth_gbps": 0.5}),
}


def world_optimum(model: str, nodes: int, perturb: dict) -> dict:
    """The world's optimum over the layouts the default driver runs, and over every candidate."""
    w = make_workload(model, nodes)
    cands = load_space().enumerate_layouts(w)
    runnable = [c for c in cands if predict(c, w).fits]
    val = {c: truth(c, w, perturb)[0] for c in cands}
    best = max(runnable, key=lambda c: val[c] or 0.0)
    best_all = max(cands, key=lambda c: val[c] or 0.0)
    model_top = max(runnable, key=lambda c: predict(c, w).peak_fraction)
    return {"workload": w, "candidates": cands, "values": val, "opt": val[best], "opt_layout": best,
            "opt_all": val[best_all] or 0.0, "model_top": (val[model_top] or 0.0) / val[best],
            "runnable": len(runnable), "fails": sum(val[c] is None for c in runnable)}


def search(world: dict, perturb: dict, searcher: str, seed: int, budget: int, runner=None,
           results_dir: Path | None = None) -> list:
    """The layouts of the trials the driver ran (pruned ones excluded), in order."""
    w, space = world["workload"], load_space()
    store = open_store("sqlite://")
    name = f"{searcher}-{seed}"
    runner = runner or WorldRunner({**perturb, "seed": seed})
    store.create_study(StudyRecord(name, w.as_dict(), {"name": space.name}, searcher, runner.name))
    s = make_searcher(searcher, world["candidates"], seed=seed, workload=w)
    Driver(store=store, study=name, workload=w, space=space, searcher=s, runner=runner, executor=InlineExecutor(),
           budget=budget, results_dir=results_dir or Path(tempfile.gettempdir())).run()
    trials = sorted(store.trials(name), key=lambda t: t.number)
    store.close()
    return [t.layout for t in trials if t.status != Status.PRUNED]


def score(world: dict, layouts: list) -> tuple[int | None, float]:
    """(trials to reach within 3 % of the optimum or None, best fraction of the optimum after 12)."""
    vals = [(world["values"][lay] or 0.0) / world["opt"] for lay in layouts]
    reach = next((i + 1 for i, v in enumerate(vals) if v >= WITHIN), None)
    return reach, max(vals[:AT], default=0.0)


def command_check(world: dict, perturb: dict, budget: int = 12) -> str:
    """guided, seed 0, through the command runner: the same trials as in-process."""
    with tempfile.TemporaryDirectory() as d:
        argv = [sys.executable, str(Path(__file__).resolve().parent / "world.py"), "--perturb",
                json.dumps({**perturb, "seed": 0})]
        t = time.monotonic()
        via_cmd = search(world, perturb, "guided", 0, budget, CommandRunner(argv, results_dir=d), Path(d))
        secs = time.monotonic() - t
    in_proc = search(world, perturb, "guided", 0, budget)
    same = "identical" if via_cmd == in_proc else "DIFFERENT"
    return f"{len(via_cmd)} trials through the command runner in {secs:.1f} s: {same} to in-process"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--budget", type=int, default=40)
    ap.add_argument("--searchers", default=",".join(SEARCHERS))
    ap.add_argument("--worlds", default=",".join(WORLDS))
    ap.add_argument("--no-command-check", action="store_true")
    args = ap.parse_args(argv)
    names, worlds = args.searchers.split(","), args.worlds.split(",")
    t0 = time.monotonic()
    medians: dict[str, list] = {s: [] for s in names}
    worst_guided = 0
    head = f"{'world':20} {'cands':>5} {'runs':>4} {'OOM':>4} {'model@opt':>9} {'pruned opt':>10} | " + \
        " | ".join(f"{s:>12}" for s in names)
    print(f"median trials to reach {100 * WITHIN:.0f} % of the world's optimum / median best fraction after {AT} "
          f"trials ({args.seeds} seeds, budget {args.budget})\n")
    print(head)
    print("-" * len(head))
    for wname in worlds:
        model, nodes, perturb = WORLDS[wname]
        world = world_optimum(model, nodes, perturb)
        cells = []
        for s in names:
            res = [score(world, search(world, perturb, s, seed, args.budget)) for seed in range(args.seeds)]
            reach = [r if r is not None else args.budget + 1 for r, _ in res]
            med = statistics.median(reach)
            medians[s].append(med)
            if s == "guided":
                worst_guided = max(worst_guided, max(reach))
            shown = f">{args.budget}" if med > args.budget else f"{med:g}"
            cells.append(f"{shown:>5} / {statistics.median(b for _, b in res):.3f}")
        pruned = world["opt_all"] / world["opt"]
        print(f"{wname:20} {len(world['candidates']):5d} {world['runnable']:4d} {world['fails']:4d} "
              f"{world['model_top']:9.3f} {pruned:10.3f} | " + " | ".join(f"{c:>12}" for c in cells), flush=True)
    print()
    for s in names:
        m = medians[s]
        print(f"{s:8} median over worlds of the median trials to {100 * WITHIN:.0f} %: {statistics.median(m):g}"
              f"  (worst world {max(m):g})")
    if "guided" in names:
        print(f"guided: every seed of every world within {100 * WITHIN:.0f} % after at most {worst_guided} trials")
    if "guided" in names and "cbo" in names:
        g, c = statistics.median(medians["guided"]), statistics.median(medians["cbo"])
        print(f"cbo / guided trials: {c / g:.1f}x")
    if not args.no_command_check:
        model, nodes, perturb = WORLDS[worlds[0]]
        print(f"command runner ({worlds[0]}): " + command_check(world_optimum(model, nodes, perturb), perturb))
    print(f"\n{time.monotonic() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
