"""Hostile worlds: physics of their own, not just scaled cluster constants. Does guided still find the
world's optimum, and does its early stop (the CLI's defaults) stop only when it is right?

Each world is benchmarks/world.py's world (a mild perturbation of the cluster constants) times a
layout-dependent error the model's features do not describe directly:

- rff: a smooth random multiplicative error over (log2 tp, log2 pp, log2 dp, log2 mb, ZeRO, ckpt), up to
  +-`amp` in log space (random Fourier features, fixed by the world's name);
- bubble: the pipeline bubble costs `k` times what 1F1B theory says (k < 1: interleaving, k > 1: stalls);
- tp_overlap: that share of the in-node TP all-reduce time is hidden behind compute;
- ac: checkpointing makes the step that factor slower; mb_bonus: each doubling of the micro-batch makes
  the stage compute (GEMMs, attention, element-wise) that much faster (kernel efficiency);
- zero: {stage: factor}: the step takes that factor longer at that ZeRO stage;
- mem: the world's peak memory is that factor times the model's (the driver still prunes by the model);
- bump: the optimum is a layout the model ranks at `rank` (among those the driver runs), made `gain`
  times better than the best other layout by a smooth bump around it (width `width` in feature units).

The optimum is over the layouts the default driver runs (the model prunes what it predicts not to fit).
Every searcher runs through the Driver with an in-memory SQLite store (search_efficiency.search).

    python benchmarks/hostile_worlds.py [--seeds 5] [--budget 40] [--searchers guided-cli,guided,cbo,random]
                                        [--worlds a,b]

guided-cli is guided as `tuner search` builds it (stop_threshold 0.01, min_trials 8); guided never stops
early. Columns per searcher: median trials to within 3 % of the optimum (">B": never within budget B),
median best fraction of the optimum after 12 trials, and for guided-cli the false stops (stopped early
while > 3 % from the optimum, out of the seeds) and the median trials it used.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import math
import random
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import search_efficiency as se  # noqa: E402
from world import truth as world_truth  # noqa: E402

from tuner import metrics  # noqa: E402
from tuner.layout import Layout  # noqa: E402
from tuner.perfmodel import predict  # noqa: E402
from tuner.search import make_searcher  # noqa: E402
from tuner.space import load_space  # noqa: E402
from tuner.specs import Workload, make_workload  # noqa: E402
from tuner.trial import Status, TrialResult  # noqa: E402

CLI_OPTIONS = {"stop_threshold": 0.01, "min_trials": 12}   # tuner/cli/study.py run_study
SEARCHERS = ("guided-cli", "guided", "cbo", "random")
STAGE = ("gemm", "attention", "elementwise")

# name -> (model, nodes, spec); spec: "perturb" (benchmarks/world.py keys) and the hostile keys above
WORLDS = {
    "22b-2n-rff": ("22b", 2, {"perturb": {"matmul_efficiency": 0.9}, "rff": 0.25}),
    "22b-8n-rff": ("22b", 8, {"perturb": {}, "rff": 0.3}),
    "175b-16n-rff": ("175b", 16, {"perturb": {"inter_node_bandwidth_gbps": 0.8}, "rff": 0.25}),
    "1t-512n-rff": ("1t", 512, {"perturb": {}, "rff": 0.3}),
    "175b-16n-cheapbubble": ("175b", 16, {"perturb": {}, "bubble": 0.2}),
    "22b-2n-dearbubble": ("22b", 2, {"perturb": {}, "bubble": 3.0}),
    "175b-64n-dearbubble": ("175b", 64, {"perturb": {}, "bubble": 3.0}),
    "22b-2n-tpfree": ("22b", 2, {"perturb": {}, "tp_overlap": 0.95}),
    "175b-16n-tpfree": ("175b", 16, {"perturb": {"matmul_efficiency": 0.9}, "tp_overlap": 0.95}),
    "22b-8n-ac-mb": ("22b", 8, {"perturb": {}, "ac": 1.35, "mb_bonus": 0.08}),
    "175b-64n-ac-mb": ("175b", 64, {"perturb": {}, "ac": 1.3, "mb_bonus": 0.1}),
    "22b-2n-zero": ("22b", 2, {"perturb": {}, "zero": {0: 1.25, 1: 1.0, 2: 1.3, 3: 1.6}}),
    "175b-64n-zero": ("175b", 64, {"perturb": {}, "zero": {0: 1.0, 1: 1.3, 2: 0.85, 3: 0.9}}),
    "22b-8n-memhi": ("22b", 8, {"perturb": {}, "mem": 1.15}),
    "175b-16n-memlo": ("175b", 16, {"perturb": {}, "mem": 0.85}),
    "1t-256n-memhi": ("1t", 256, {"perturb": {}, "mem": 1.15}),
    "22b-8n-hidden": ("22b", 8, {"perturb": {}, "bump": {"rank": 40, "gain": 1.08, "width": 0.35}}),
    "175b-64n-hidden": ("175b", 64, {"perturb": {}, "bump": {"rank": 30, "gain": 1.08, "width": 0.35}}),
    "22b-2n-hidden": ("22b", 2, {"perturb": {}, "bump": {"rank": 25, "gain": 1.06, "width": 0.4}}),
}


def coords(lay: Layout) -> np.ndarray:
    return np.array([math.log2(lay.tp) / 3, math.log2(lay.pp) / 4, math.log2(max(lay.dp, 1)) / 6,
                     math.log2(lay.micro_batch) / 3, lay.zero_stage / 3, float(lay.activation_checkpointing)])


class Hostile:
    """A hostile world: truth(layout) -> (fraction of peak or None for OOM, peak memory GB)."""

    def __init__(self, name: str, workload: Workload, spec: dict):
        self.name, self.w, self.spec = name, workload, dict(spec)
        self.perturb = dict(spec.get("perturb") or {})
        self.unbounded = dataclasses.replace(workload, cluster=dataclasses.replace(workload.cluster, memory_gb=1e12))
        rng = np.random.default_rng(int(hashlib.sha256(name.encode()).hexdigest()[:8], 16))
        self.W, self.b = rng.normal(0.0, 2.5, (8, 6)), rng.uniform(0, 2 * math.pi, 8)
        self.a = rng.normal(0.0, 1.0, 8)
        self.bump = None
        if spec.get("bump"):
            self._place_bump(spec["bump"])

    def _rff(self, lay: Layout) -> float:
        g = float(self.a @ np.cos(self.W @ coords(lay) + self.b)) / float(np.abs(self.a).sum())
        return math.exp(self.spec["rff"] * g / 0.5) if abs(g) < 0.5 else math.exp(self.spec["rff"] * math.copysign(1, g))

    def _base(self, lay: Layout) -> tuple[float | None, float]:
        value, peak = world_truth(lay, self.unbounded, self.perturb)     # memory checked here
        p = predict(lay, self.w)
        peak = p.memory_gb * float(self.spec.get("mem", 1.0)) + (peak - p.memory_gb)
        if peak > self.w.cluster.memory_gb:
            value = None
        if value is None:
            return None, peak
        t, step = p.time_breakdown, p.step_time_s
        new = step
        if "bubble" in self.spec:
            new += (float(self.spec["bubble"]) - 1.0) * t.get("bubble", 0.0)
        if "tp_overlap" in self.spec and lay.tp <= self.w.cluster.gpus_per_node:
            stage = sum(t.get(k, 0.0) for k in ("gemm", "attention", "elementwise", "tp_comm", "p2p",
                                                "microbatch_overhead")) or 1e-12
            tp = t.get("tp_comm", 0.0) * (1 + t.get("bubble", 0.0) / stage)     # the bubble repeats it
            new -= float(self.spec["tp_overlap"]) * tp
        if "mb_bonus" in self.spec:
            stage = sum(t.get(k, 0.0) for k in ("gemm", "attention", "elementwise", "tp_comm", "p2p",
                                                "microbatch_overhead")) or 1e-12
            comp = sum(t.get(k, 0.0) for k in STAGE) * (1 + t.get("bubble", 0.0) / stage)
            new -= comp * (1 - 1 / (1 + float(self.spec["mb_bonus"]) * math.log2(lay.micro_batch)))
        v = value * step / max(new, 1e-9)
        if "ac" in self.spec and lay.activation_checkpointing:
            v /= float(self.spec["ac"])
        if "zero" in self.spec:
            v /= float(self.spec["zero"].get(lay.zero_stage, 1.0))
        if "rff" in self.spec:
            v *= self._rff(lay)
        return v, peak

    def _place_bump(self, b: dict) -> None:
        cands = load_space().enumerate_layouts(self.w)
        base = {c: self._base(c)[0] for c in cands if predict(c, self.w).fits}
        ranked = sorted((c for c in base if base[c]), key=lambda c: -predict(c, self.w).mfu)
        target = ranked[min(int(b["rank"]), len(ranked) - 1)]
        c0, width = coords(target), float(b["width"])
        k = {c: math.exp(-0.5 * float(((coords(c) - c0) ** 2).sum()) / width ** 2) for c in base if base[c]}

        def margin(amp):        # target / best other, both bumped
            return base[target] * (1 + amp) / max(base[c] * (1 + amp * k[c]) for c in k if c != target)

        lo, hi = 0.0, 4.0       # the smallest bump that makes the target `gain` better than any other
        for _ in range(40):
            lo, hi = (lo, (lo + hi) / 2) if margin((lo + hi) / 2) >= float(b["gain"]) else ((lo + hi) / 2, hi)
        self.bump, self.target = (c0, width, hi), target

    def truth(self, lay: Layout) -> tuple[float | None, float]:
        v, peak = self._base(lay)
        if v is not None and self.bump is not None:
            c, width, amp = self.bump
            v *= 1 + amp * math.exp(-0.5 * float(((coords(lay) - c) ** 2).sum()) / width ** 2)
        return v, peak

    def measure(self, lay: Layout, seed: int, noise: float = 0.02) -> TrialResult:
        value, peak = self.truth(lay)
        if value is None:
            return TrialResult(Status.OOM, peak_memory_gb=None, message=f"world OOM: needs {peak:.1f} GB")
        rnd = random.Random(hashlib.sha256(f"{self.name}:{seed}:{lay.key()}".encode()).digest())
        sps = value * max(0.05, 1.0 + rnd.gauss(0.0, noise)) / metrics.mfu(1.0, self.w)
        return metrics.complete(TrialResult(Status.OK, samples_per_second=sps, message="hostile world",
                                            peak_memory_gb=peak * (1 + rnd.gauss(0.0, 0.005))), self.w, lay)


class HostileRunner:
    name = "world"
    measured = True

    def __init__(self, world: Hostile, seed: int):
        self.world, self.seed = world, seed

    def run(self, trial) -> TrialResult:
        return self.world.measure(trial.layout, self.seed)

    def cancel(self) -> None:
        pass


def hostile_optimum(name: str) -> tuple[Hostile, dict]:
    """The world and search_efficiency's world dict (workload, candidates, values, opt, ...)."""
    model, nodes, spec = WORLDS[name]
    w = make_workload(model, nodes)
    h = Hostile(name, w, spec)
    cands = load_space().enumerate_layouts(w)
    runnable = [c for c in cands if predict(c, w).fits]
    val = {c: h.truth(c)[0] for c in cands}
    best = max(runnable, key=lambda c: val[c] or 0.0)
    rank = sorted(runnable, key=lambda c: -predict(c, w).mfu).index(best) + 1
    model_top = max(runnable, key=lambda c: predict(c, w).mfu)
    return h, {"workload": w, "candidates": cands, "values": val, "opt": val[best], "opt_layout": best,
               "opt_all": max(v or 0.0 for v in val.values()), "model_top": (val[model_top] or 0.0) / val[best],
               "runnable": len(runnable), "fails": sum(val[c] is None for c in runnable), "rank": rank}


_LAST: list = []


def _make_searcher(name, candidates, **kw):
    """search_efficiency.search's factory, plus 'guided-cli' (guided with run_study's options)."""
    s = make_searcher("guided", candidates, **kw, **CLI_OPTIONS) if name == "guided-cli" else \
        make_searcher(name, candidates, **kw)
    _LAST[:] = [s]
    return s


se.make_searcher = _make_searcher


def run_one(h: Hostile, world: dict, searcher: str, seed: int, budget: int) -> dict:
    lays = se.search(world, {}, searcher, seed, budget, runner=HostileRunner(h, seed))
    reach, at12 = se.score(world, lays)
    stopped = bool(getattr(_LAST[0], "stopped", False))
    best = max(((world["values"][lay] or 0.0) / world["opt"] for lay in lays), default=0.0)
    return {"reach": reach, "at12": at12, "used": len(lays), "stopped": stopped,
            "false_stop": stopped and best < se.WITHIN}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--budget", type=int, default=40)
    ap.add_argument("--searchers", default=",".join(SEARCHERS))
    ap.add_argument("--worlds", default=",".join(WORLDS))
    args = ap.parse_args(argv)
    names, worlds = args.searchers.split(","), args.worlds.split(",")
    t0 = time.monotonic()
    med: dict[str, list] = {s: [] for s in names}
    worst: dict[str, int] = {s: 0 for s in names}
    false_stops, runs_cli = 0, 0
    head = f"{'world':20} {'runs':>4} {'OOM':>4} {'opt rank':>8} {'model@opt':>9} | " + \
        " | ".join(f"{s:>21}" if s == "guided-cli" else f"{s:>12}" for s in names)
    print(f"median trials to {100 * se.WITHIN:.0f} % of the world's optimum / median best fraction after {se.AT} "
          f"trials ({args.seeds} seeds, budget {args.budget}); guided-cli also: false stops / median trials used\n")
    print(head)
    print("-" * len(head))
    for wname in worlds:
        h, world = hostile_optimum(wname)
        cells = []
        for s in names:
            res = [run_one(h, world, s, seed, args.budget) for seed in range(args.seeds)]
            reach = [r["reach"] if r["reach"] is not None else args.budget + 1 for r in res]
            m = statistics.median(reach)
            med[s].append(m)
            worst[s] = max(worst[s], max(reach))
            shown = f">{args.budget}" if m > args.budget else f"{m:g}"
            cell = f"{shown:>5} / {statistics.median(r['at12'] for r in res):.3f}"
            if s == "guided-cli":
                fs = sum(r["false_stop"] for r in res)
                false_stops, runs_cli = false_stops + fs, runs_cli + len(res)
                cell += f" {fs}/{len(res)} {statistics.median(r['used'] for r in res):4g}"
                cells.append(f"{cell:>21}")
            else:
                cells.append(f"{cell:>12}")
        print(f"{wname:20} {world['runnable']:4d} {world['fails']:4d} {world['rank']:8d} {world['model_top']:9.3f} | "
              + " | ".join(cells), flush=True)
    print()
    for s in names:
        print(f"{s:10} median over worlds of the median trials to {100 * se.WITHIN:.0f} %: "
              f"{statistics.median(med[s]):g}  (worst world {max(med[s]):g}, worst seed {worst[s]})")
    if "guided-cli" in names:
        print(f"guided-cli false stops (stopped early > 3 % from the optimum): {false_stops} of {runs_cli} runs")
    for g in ("guided-cli", "guided"):
        if g in names and "cbo" in names:
            print(f"cbo / {g} trials: {statistics.median(med['cbo']) / statistics.median(med[g]):.1f}x")
    print(f"\n{time.monotonic() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
