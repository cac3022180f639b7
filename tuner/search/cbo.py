"""CBO: DeepHyper's centralised Bayesian optimisation, the Frontier study's method.

Random-forest surrogate, UCB acquisition, constant liar "cl_min" for ask(n > 1), seeded. Each
dimension (tp, sp, cp, pp, vp, micro_batch, zero_stage, recompute) is an integer index into the
sorted choices the candidates use; dp follows from the GPU count. The problem's sampling function
draws only unused candidates (non-deferred first), so both the initial random points and the points
on which the acquisition is maximised are candidates. Failures are told as DeepHyper failure markers
("F_oom", "F_pruned", ...), which its optimiser replaces by the worst objective seen: the surrogate
discounts their neighbourhood. Tells are buffered and given to DeepHyper in one batch at the next ask,
so a resume that replays many trials fits the surrogate once.
"""

from __future__ import annotations

import logging
import warnings

import numpy as np

from tuner.errors import MissingExtra
from tuner.layout import Layout
from tuner.search.base import DIMS, BaseSearcher, objective
from tuner.trial import TrialResult

N_INITIAL_POINTS = 10   # random points before the surrogate is fitted
N_TREES = 10            # trees of the random forest
MAX_SAMPLES = 2000      # candidates on which the acquisition function is evaluated per fit


def _import_deephyper():
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from deephyper.hpo import CBO, HpProblem
    except ImportError:
        raise MissingExtra("deephyper", "all") from None
    logging.getLogger("deephyper").setLevel(logging.WARNING)
    return CBO, HpProblem


class CBOSearcher(BaseSearcher):
    name = "cbo"

    def __init__(self, candidates: list[Layout], *, seed: int = 0, n_initial_points: int = N_INITIAL_POINTS,
                 n_trees: int = N_TREES, **kw):
        super().__init__(candidates, seed=seed, **kw)
        CBO, HpProblem = _import_deephyper()
        self.varying = [d for d in DIMS if len(self.choices[d]) > 1]
        self._pos = {d: {v: k for k, v in enumerate(self.choices[d])} for d in DIMS}
        self._rng = np.random.default_rng([self.seed, 3])
        self._pending: list[tuple[dict, float | str]] = []
        self.search = None
        if not self.varying:      # at most one candidate: the fallback order proposes it
            return
        problem = HpProblem()
        for d in self.varying:
            problem.add_hyperparameter((0, len(self.choices[d]) - 1), d)
        # DeepHyper deep-copies the problem: a bound method would take a stale copy of this searcher
        # along, a lambda (copied by reference) keeps sampling from the live one.
        problem.set_sampling_fn(lambda size: self._sample(size))
        self.search = CBO(
            problem, random_state=self.seed, log_dir=".", checkpoint_history_to_csv=False,
            surrogate_model="RF", surrogate_model_kwargs={"n_estimators": n_trees},
            acq_func="UCB", acq_optimizer="sampling",
            acq_optimizer_kwargs={"n_points": min(MAX_SAMPLES, max(len(self.candidates), 1)),
                                  "filter_failures": "min", "max_total_failures": -1},
            multi_point_strategy="cl_min", n_initial_points=n_initial_points,
        )

    def _sample(self, size: int) -> list[dict]:
        free = np.flatnonzero(~self.used)
        pref = free[~self.deferred[free]]
        pool = pref if pref.size else free
        if pool.size == 0:
            pool = np.arange(len(self.candidates))   # exhausted: ask() returns [] before using these
        pool = self._rng.permutation(pool)[:max(int(size), 1)]
        return [self._config(self.candidates[i]) for i in pool]

    def _config(self, lay: Layout) -> dict:
        return {d: self._pos[d][getattr(lay, d)] for d in self.varying}

    def _values(self, cfg: dict) -> dict:
        out = {d: self.choices[d][0] for d in DIMS}
        for d in self.varying:
            k = int(round(float(cfg[d])))
            out[d] = self.choices[d][min(max(k, 0), len(self.choices[d]) - 1)]
        return out

    def _observe(self, layout: Layout, result: TrialResult, asked: bool) -> None:
        if self.search is None or any(getattr(layout, d) not in self._pos[d] for d in DIMS):
            return   # a layout outside this space's choices cannot be encoded; it stays "used"
        value = objective(result)
        self._pending.append((self._config(layout), value if value is not None else f"F_{result.status.value}"))

    def _propose(self, n: int) -> list:
        if self.search is None:
            return []
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if self._pending:
                batch, self._pending = self._pending, []
                self.search.tell(batch)
            return [self._values(cfg) for cfg in self.search.ask(n)]
