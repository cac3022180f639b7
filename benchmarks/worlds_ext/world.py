"""One drawn extended world: its workload and space, the truth of every layout, its optimum, a runner."""

from __future__ import annotations

import dataclasses
import hashlib
import math
from functools import cached_property

import numpy as np

from pytorch_oom import oom_message
from tuner.layout import Layout
from tuner.offload import offload_refusal
from tuner.space import load_space
from tuner.space_offload import offload_counts
from tuner.specs import Workload, make_workload
from tuner.trial import Status, TrialResult, TrialSpec
from worlds_ext import memory_acct, step
from worlds_ext.families import FAMILIES, WORKLOADS, draw_physics


def space_of(cluster: str, framework: str) -> str:
    return "frontier-2023" if (cluster == "frontier" and framework == "megatron-deepspeed") else "default"


def evaluate(ph: dict, w: Workload, layout: Layout, seed: int) -> tuple[float | None, float]:
    """(samples per second, or None when it does not fit; peak reserved GB per GPU)."""
    mem = memory_acct.peak_gb(ph, layout, w)
    if mem > ph["usable"] * w.cluster.memory_gb:
        return None, mem
    return w.global_batch / step.step_s(ph, layout, w, seed), mem


class World:
    """The world of (family, workload case, seed)."""

    def __init__(self, family: str, case: tuple[str, int, str, str], seed: int, space=None):
        model, nodes, cluster, framework = case
        self.family, self.case, self.seed = family, tuple(case), int(seed)
        self.workload = make_workload(model, nodes, cluster, framework=framework)
        self.physics = draw_physics(family, case, seed, self.workload.model.num_experts)
        self.physics["hbm_gbps"] = self.workload.cluster.hbm_bandwidth_gbps
        self.space = space or space_of(cluster, framework)      # a space's name or a SearchSpace
        self.name = f"{family}/{model}@{nodes}n {cluster} {framework}/s{seed}"
        self.label = f"{model}@{nodes}n-{framework}"
        self._truth: dict[Layout, tuple[float | None, float]] = {}

    @cached_property
    def candidates(self) -> list[Layout]:
        """Every layout of the space the workload's framework runs: where the space leaves CPU activation offloading
        unnamed, Megatron-Core's layouts that may offload (tuner.offload's rules) also with each of the layer counts
        `tuner search` tries (tuner.space_offload.offload_counts), right after the layout itself."""
        space = load_space(self.space) if isinstance(self.space, str) else self.space
        layouts = space.enumerate_layouts(self.workload)
        w = self.workload
        if w.framework != "megatron-core" or "offload_layers" in space.dimensions:
            return layouts
        counts = offload_counts(w.model.num_layers)
        out = []
        for lay in layouts:
            out.append(lay)
            if lay.pp == 1 and lay.recompute == "none" and not lay.offload_layers:
                twins = (dataclasses.replace(lay, offload_layers=n) for n in counts)
                out += [t for t in twins if offload_refusal(w.framework, t, w) is None]
        return out

    def truth(self, layout: Layout, workload: Workload | None = None) -> tuple[float | None, float]:
        if workload is not None and workload != self.workload:
            return evaluate(self.physics, workload, layout, self.seed)
        if layout not in self._truth:
            self._truth[layout] = evaluate(self.physics, self.workload, layout, self.seed)
        return self._truth[layout]

    def optimum(self) -> tuple[Layout, float]:
        """The fastest candidate that really runs, and its samples per second. An offloaded layout whose layout without
        offloading runs is slower than it (the same work and the copies: step.offload_s), so it is not evaluated."""
        plain_runs = lambda lay: self.truth(dataclasses.replace(lay, offload_layers=0))[0] is not None  # noqa: E731
        runs = [(v, lay) for lay in self.candidates if not (lay.offload_layers and plain_runs(lay))
                and (v := self.truth(lay)[0]) is not None]
        if not runs:
            raise ValueError(f"{self.name}: no candidate layout fits in memory")
        v, lay = max(runs, key=lambda p: (p[0], p[1]))
        return lay, v

    def at_nodes(self, nodes: int) -> "World":
        """The same physics (family, model, cluster, framework, seed) at another node count."""
        model, _, cluster, framework = self.case
        return World(self.family, (model, nodes, cluster, framework), self.seed, self.space)

    def runner(self, noise: float = 0.02, seed: int = 0) -> "ExtRunner":
        return ExtRunner(self, noise, seed)


def draw_world(family: str, case: tuple[str, int, str, str] | int, seed: int, space=None) -> World:
    """The world of `family`'s workload `case` (a tuple, or its index in WORKLOADS[family]); `space`: a
    space's name or a SearchSpace instead of the workload's own (frontier-2023 or default)."""
    if family not in FAMILIES:
        raise ValueError(f"unknown family '{family}'; families: {', '.join(FAMILIES)}")
    if isinstance(case, int):
        case = WORKLOADS[family][case]
    return World(family, case, seed, space)


class ExtRunner:
    """The world behind the runner protocol; multiplicative log-normal noise seeded by (seed, layout)."""

    name = "world"
    measured = True

    def __init__(self, world: World, noise: float = 0.02, seed: int = 0):
        self.world, self.noise, self.seed = world, float(noise), int(seed)

    def factor(self, layout: Layout, nodes: int) -> float:
        digest = hashlib.sha256(f"ext:{self.world.family}:{self.seed}:{nodes}:{layout.key()}".encode()).digest()
        z = np.random.default_rng(int.from_bytes(digest[:8], "little")).standard_normal()
        return math.exp(self.noise * z)

    def run(self, trial: TrialSpec) -> TrialResult:
        w = trial.workload
        sps, mem = self.world.truth(trial.layout, w)
        if sps is None:
            return TrialResult(Status.OOM, message=self.oom_message(trial.layout, w, mem))
        allocated = memory_acct.peak_allocated_gb(self.world.physics, trial.layout, w)   # as a GPU run reports
        reserved = memory_acct.peak_reserved_gb(self.world.physics, trial.layout, w)     # its own fragmentation
        return TrialResult(Status.OK, samples_per_second=sps * self.factor(trial.layout, w.nodes),
                           peak_memory_gb=allocated, peak_reserved_gb=reserved, message="world")

    def oom_message(self, layout: Layout, w: Workload, need_gb: float) -> str:
        """PyTorch's out-of-memory message (benchmarks/pytorch_oom.py) of a run that needed `need_gb` on a GPU whose
        process has the world's usable share of the capacity. An out-of-memory run learns no more of its need."""
        ph = self.world.physics
        outside = memory_acct.peak_gb(ph, layout, w) - memory_acct.peak_reserved_gb(ph, layout, w)  # context, comms
        return oom_message(w.cluster.memory_gb, ph["usable"] * w.cluster.memory_gb, need_gb, outside,
                           f"ext-oom:{self.world.family}:{self.seed}:{w.nodes}:{layout.key()}",
                           rocm=w.cluster.software == "rocm")

    def cancel(self) -> None:
        pass

    def resources(self, trial: TrialSpec) -> dict[str, float]:
        return {"CPU": 0.1}
