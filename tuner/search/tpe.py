"""TPE: Optuna's tree-structured Parzen estimator on an in-memory study, through ask/tell.

TPESampler(seed, multivariate, constant_liar): running trials count as bad while they run, so
parallel asks spread out. Each dimension is an integer index into the sorted choices the candidates
use. A suggestion that is not an unused candidate (or is deferred by a failure while others remain)
is told as FAIL -- it was never run, and samplers ignore failed trials -- and replaced by a trial
enqueued at the nearest unused candidate. Failures of real trials are told as a low value (0.0), not
as FAIL: Optuna's samplers ignore failed trials and would sample OOM layouts again (optuna #566,
#3472). Replayed results of layouts this searcher never asked are added with `create_trial`.
"""

from __future__ import annotations

import warnings

from tuner.errors import MissingExtra
from tuner.layout import Layout
from tuner.search.base import DIMS, BaseSearcher, objective
from tuner.trial import TrialResult

FAILURE_VALUE = 0.0        # what a failed trial is worth: below every fraction of peak
N_STARTUP_TRIALS = 10      # random trials before TPE models the results


def _import_optuna():
    try:
        import optuna
    except ImportError:
        raise MissingExtra("optuna", "all") from None
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna


class TPESearcher(BaseSearcher):
    name = "tpe"

    def __init__(self, candidates: list[Layout], *, seed: int = 0, n_startup_trials: int = N_STARTUP_TRIALS, **kw):
        super().__init__(candidates, seed=seed, **kw)
        optuna = self.optuna = _import_optuna()
        self.varying = [d for d in DIMS if len(self.choices[d]) > 1]
        self._pos = {d: {v: k for k, v in enumerate(self.choices[d])} for d in DIMS}
        self.dists = {d: optuna.distributions.IntDistribution(0, len(self.choices[d]) - 1) for d in self.varying}
        self._running: dict[Layout, object] = {}   # layout -> optuna Trial of our own asks
        self.study = None
        if not self.varying:   # at most one candidate: the fallback order proposes it
            return
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            sampler = optuna.samplers.TPESampler(seed=self.seed, multivariate=True, constant_liar=True,
                                                 n_startup_trials=n_startup_trials)
        self.study = optuna.create_study(direction="maximize", sampler=sampler)

    def _params(self, lay: Layout) -> dict:
        return {d: self._pos[d][getattr(lay, d)] for d in self.varying}

    def _values(self, params: dict) -> dict:
        out = {d: self.choices[d][0] for d in DIMS}
        out.update({d: self.choices[d][params[d]] for d in self.varying})
        return out

    def _ask_trial(self):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return self.study.ask(self.dists)

    def _propose(self, n: int) -> list:
        if self.study is None:
            return []
        state = self.optuna.trial.TrialState
        for _ in range(n):
            trial = self._ask_trial()
            i = self._take(self._values(trial.params))
            if i is None:
                self.study.tell(trial, state=state.FAIL)
                break
            lay = self.candidates[i]
            if self._params(lay) != trial.params:
                # not the layout it suggested: drop the suggestion, run the mapped layout as a trial
                self.study.tell(trial, state=state.FAIL)
                self.study.enqueue_trial(self._params(lay))
                trial = self._ask_trial()
            self._running[lay] = trial
        return []

    def _observe(self, layout: Layout, result: TrialResult, asked: bool) -> None:
        if self.study is None:
            return
        value = objective(result)
        value = FAILURE_VALUE if value is None else value
        trial = self._running.pop(layout, None)
        if trial is not None:
            self.study.tell(trial, value)
        elif all(getattr(layout, d) in self._pos[d] for d in DIMS):
            self.study.add_trial(self.optuna.trial.create_trial(
                params=self._params(layout), distributions=self.dists, value=value))
        # else: a layout outside this space's choices cannot be encoded; it stays "used"
