"""Guided search: the performance model's ranking, corrected by every measurement, by expected improvement.

The belief about a layout's log MFU (training speed) is log(predicted) + r, r the model's residual learned as a
Gaussian process (tuner/correction.py: a global scale, a linear term in the predicted time shares, and a smooth term
over layout features; prior mean 0), plus a family term over every searched dimension whose uncertainty grows where
the model has been wrong nearby (tuner/search/explore.py): a term the model lacks cannot hide a whole family (a
pipeline depth, a recompute mode, a micro-batch size, a ZeRO stage, an expert-parallel degree), and a trial far above
its prediction moves its neighbours. Memory is learned the same way from measured peaks and OOMs (an OOM at a layout
predicted to fit raises the expected memory of its neighbours; its message says what the process held outside the
allocator, with which a measured reserved peak is counted: issue 30 round 49).

- First trials (no history): the model's top pick, then `n_initial - 1` layouts within DIVERSE_WITHIN of its predicted
  speed, each the best predicted of those that take values no earlier pick has in the most family dimensions
  (explore.first_pick), so that a wrong model shows itself early; each keeps the cluster's memory headroom
  (tuner/best.py) where any layout does, since nothing has been measured yet.
- Then: expected improvement over the best measured, in log space, times the probability of fitting; a batch
  (ask(n > 1), or asks without tells between) uses the kriging believer: each chosen or running layout is its mean.
- An OOM defers every layout not yet run that the model predicts to need at least as much memory on the same worst
  pipeline stage, until the memory learned from measured peaks says otherwise (tuner/search/oom_deferral.py).
- `reserve`: offloaded twins the space does not offer, held until the memory learned puts their layout below one half
  p_fit (tuner/search/reserve.py), then candidates like any other.
- `history` (stored trials of the model and cluster at any node count: correction.warm_start_records;
  `history_studies`: study name -> StudyRecord) corrects the model before the first trial (`evidence`: what it used);
  only measurements of the workload's framework count (a study's own trials, simulated or not, are its world's).
- Early stop (`stop_threshold`, off by default so that `ask` honours the contract of exhausting the candidates): ask
  returns [] (running trials may still change its mind) once the stop rule (tuner/search/stop_rule.py) is sure enough
  that no layout beats the recommended one (the fastest measured) by more than `stop_threshold`; `confidence` and
  `stop_reason` say how sure it is after every ask, whether or not stopping is on. The GP's sd is widened when its
  leave-one-out errors say it does not explain the data (tuner.gp.GP.calibrate).
Deterministic: ties break by a seeded permutation.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.special import ndtr

from tuner.frameworks import ALLOCATOR_BIAS, ALLOCATOR_SD, of as framework_of
from tuner.perfmodel import RECOMMEND_AT
from tuner.layout import Layout
from tuner.metrics import rank_key
from tuner.perfmodel import memory_fit, predict
from tuner.search import STUDY_DEFAULTS  # (re-exported: the study defaults of the stop rule)
from tuner.search.base import DIMS, BaseSearcher
from tuner.search.confidence import beat_probability, margin_of
from tuner.search.explore import (N_INITIAL, believe, family_key, family_scale, first_pick, fit_beliefs,
                                  inactive_mask)
from tuner.oom_evidence import activation_account, outside_gb, said_capacities, said_outside, usable_workload
from tuner.search.oom_deferral import OomDeferral
from tuner.search.reserve import Reserve
from tuner.search.stop_rule import StopRule
from tuner.gp import GP
from tuner.correction import (F_DIM, FM_DIM, OOM_MARGIN, Z_DIM, Features, Observations, features,
                              warm_start_records)
from tuner.trial import Status, TrialResult, oom_capacity_gb, oom_outside_gb

XI = 0.0                   # EI margin (log space)
P_FIT_SD = ALLOCATOR_SD       # the caching allocator's share beyond the learned uncertainty (as predict states p_fit)


def _norm_pdf(z):
    return np.exp(-0.5 * z * z) / math.sqrt(2 * math.pi)


class GuidedSearcher(BaseSearcher):
    name = "guided"
    _peaks: tuple = (None, None, None)      # (key, the peaks-alone memory correction, its (mean, sd)): _peaks_gp

    def __init__(self, candidates: list[Layout], *, seed: int = 0, workload=None, history=None,
                 history_studies: dict | None = None, stop_threshold: float | None = None,
                 stop_probability: float = STUDY_DEFAULTS["stop_probability"], min_trials: int = 4,
                 n_initial: int = N_INITIAL, predictions: dict | None = None, reserve=(), **kw):
        reserve = set(reserve) - set(candidates)        # held twins (tuner.search.reserve): candidates once released
        super().__init__([*candidates, *reserve], seed=seed, **kw)
        self.reserve = Reserve(self.candidates, reserve)
        self.used[self.reserve.held] = True     # never proposed, asked or counted while held
        self.workload = workload
        self.stop = StopRule(stop_threshold, stop_probability, min_trials)
        self.n_initial = int(n_initial)
        self.capacity = workload.cluster.memory_gb if workload is not None else None
        preds = self._features(workload, predictions or {})
        n = len(self.candidates)
        self.mem_gb = [p.memory_gb if p is not None else None for p in preds]   # stored as predicted_memory_gb
        self.prior_fit = np.array([p.p_fit if p is not None else 1.0 for p in preds])  # predict's, before any peak
        self.mem_stage = np.array([p.memory_stage if p is not None else -1 for p in preds], dtype=int)
        self.accounts = {}                      # activation account -> its id (OomDeferral compares them)
        account = np.array([self.accounts.setdefault(activation_account(c), len(self.accounts))
                            for c in self.candidates], dtype=int)
        self.oom = OomDeferral(np.array([p.memory_gb if p is not None else -math.inf for p in preds], dtype=float),
                               self.mem_stage, self.log_mem, self.Z, self.FM, account)
        self._tiebreak = np.random.default_rng([self.seed, 11]).permutation(n) * 1e-12
        self.said = said_capacities(history, workload, history_studies) if workload is not None else []
        self.said_out = said_outside(history, workload, history_studies) if workload is not None else []
        hw, usable = usable_workload(workload, self.said) if workload is not None else (workload, None)
        if usable:                              # the history's OOM messages: the GPUs hold less than stated
            self.capacity, self.prior_fit = usable[0], self._prior_fit(hw)
        self._history = (history, history_studies)    # rebuilt at each usable capacity (_bound_ooms)
        self._oom_log_mem: list[float] = []     # log predicted peak of each own OOM, in the order of self.own.oy
        ws = warm_start_records(history, hw, history_studies) if (history and workload is not None) else None
        self.history = ws.observations if ws else Observations()
        self.evidence = ws.evidence if ws else None
        self.own = Observations(outside_gb=outside_gb(self.said_out))
        self.own_X: list[list[float]] = []      # the searcher's coordinates of each own time observation
        shown = self.X[~self.reserve.held]      # a held twin's offloading is no family of the space's
        self.varying = [k for k in range(self.X.shape[1]) if np.ptp(shown[:, k]) > 0] if len(shown) else []
        self.family_dims = [DIMS[k] for k in self.varying]
        self.family_scale = family_scale(self.X[:, self.varying], self.family_dims)
        self.family_X = self.X[:, self.varying] * self.family_scale    # the candidates' rows of the family term
        self.family_off = inactive_mask(self.candidates, self.family_dims)   # where they mean nothing
        self.own_off: list[np.ndarray] = []     # the same of each own time observation
        self.pending: dict[int, None] = {}      # asked, not told (insertion-ordered)
        #: each asked layout's belief when it was chosen: (log MFU mean, predictive sd with the fit's noise, a first pick)
        self.beliefs_at_ask: dict[Layout, tuple[float, float, bool]] = {}
        self.best_log: float | None = None
        self.best_layout: Layout | None = None
        self.best_index: int | None = None
        self.best_key: tuple | None = None
        self.n_ok = 0
        self.mem_scale = 1.0                    # max measured/predicted peak seen (reported)
        self.failed = np.zeros(n, dtype=bool)   # told a failure: cannot be the fastest
        self.ran = np.zeros(n, dtype=bool)      # ran (not pruned): known to fit
        self._learned = 0                       # results that taught something (the stop rule's cache key)
        if workload is not None:                # unmeasured first picks keep the memory headroom
            self.memory_sd = framework_of(workload).memory_sd
            self.roomy = self.p_fit() >= RECOMMEND_AT
        else:
            self.memory_sd, self.roomy = None, np.ones(n, dtype=bool)

    def _features(self, workload, known: dict) -> list:
        """Each candidate's prediction (`known`'s where the study has it: tuner.predicted) and the features the
        corrections read (fts, Z, F, FM, log_pred, log_mem)."""
        preds = [known.get(c) or predict(c, workload) for c in self.candidates] if workload is not None \
            else [None] * len(self.candidates)
        self.fts: list[Features] = [features(c, workload, p) for c, p in zip(self.candidates, preds)]
        n = len(self.candidates)
        self.Z = np.array([f.z for f in self.fts]).reshape(n, Z_DIM)
        self.F = np.array([f.f for f in self.fts]).reshape(n, F_DIM)
        self.FM = np.array([f.fm for f in self.fts]).reshape(n, FM_DIM)
        self.log_pred = np.array([f.log_pred for f in self.fts])
        self.log_mem = np.array([f.log_mem for f in self.fts])
        return preds

    # the stop rule's state, read by the driver, the CLI and the library
    stop_threshold = property(lambda self: self.stop.threshold)
    stop_probability = property(lambda self: self.stop.probability)
    min_trials = property(lambda self: self.stop.min_trials)
    confidence = property(lambda self: self.stop.confidence)
    stop_reason = property(lambda self: self.stop.reason)
    stopped = property(lambda self: self.stop.stopped)

    # ---- telling ----------------------------------------------------------------------------------
    def _observe(self, layout: Layout, result: TrialResult, asked: bool) -> None:
        self.oom.note_base(self.deferred)      # base.py's deferrals (needs_more_memory)
        i = self.index.get(layout)
        if i is not None:
            self.pending.pop(i, None)
            self.reserve.held[i] = False        # told (a warm start, another driver): used, no longer held
            ft = self.fts[i]
        elif self.workload is not None and layout.gpus == self.workload.gpus:
            ft = features(layout, self.workload)
        else:
            return
        if result.status == Status.PRUNED:
            return                              # the model's own verdict: nothing learned about the world
        self._learned += 1
        if i is not None:
            self.ran[i] = True
        n_time = len(self.own.y)
        reserved = getattr(result, "peak_reserved_gb", None)
        lowered = result.status == Status.OOM and self.workload is not None and self._note_capacity(result.message)
        self.own.add_result(ft, result.status, result.mfu, result.peak_memory_gb, self.capacity, reserved_gb=reserved)
        if result.status == Status.OOM and self.capacity:
            self._oom_log_mem.append(ft.log_mem)
        if lowered:                             # the first picks' headroom, once the OOM is an observation p_fit reads
            self.roomy = self.p_fit() >= RECOMMEND_AT
        if len(self.own.y) > n_time:
            self.own_X.append(self.encode(layout.as_dict()))
            self.own_off.append(inactive_mask([layout], self.family_dims)[0])
        if i is not None and result.status not in (Status.OK, Status.STOPPED):
            self.failed[i] = True
        if result.status == Status.OOM and self.workload is not None:
            memory_gb, stage = self._predicted_memory(layout, i)
            self.deferred |= self.oom.after_oom(memory_gb, stage, ft.z, ft.fm, ft.log_mem, self.used,
                                                self.accounts.get(activation_account(layout), -1))
        if result.status == Status.OK and result.peak_memory_gb and self.workload is not None:
            self.oom.note_measured(result.peak_memory_gb, self.accounts.get(activation_account(layout), -1))
            self.mem_scale = max(self.mem_scale, math.exp(ft.measured_log_ratio(result.peak_memory_gb, reserved)))
        if result.status == Status.OK and result.mfu:
            self.n_ok += 1
            memory = result.peak_memory_gb if result.peak_memory_gb is not None else self.mem_gb[i] if i is not None else None
            key = rank_key(result.mfu, memory, layout)
            if self.best_key is None or key < self.best_key:   # the store's order (tuner.metrics), in any tell order
                self.best_key, self.best_layout, self.best_index = key, layout, i
                self.best_log = math.log(max(result.mfu, 1e-6))

    def _note_capacity(self, message: str) -> bool:
        """An OOM's PyTorch message says what the process held outside the allocator (tuner.trial.oom_outside_gb: a
        reserved peak is counted with their median, Observations.memory_y) and what memory it had (oom_capacity_gb):
        every p_fit compares with the median of what the OOMs said (oom_evidence.usable_capacity), where it is below
        the cluster's capacity, and so does every OOM's bound. Whether the capacity moved (headroom recomputed)."""
        out = oom_outside_gb(message or "")
        if out is not None:
            self.said_out.append(out)
            self.own.outside_gb = outside_gb(self.said_out)
        gb = oom_capacity_gb(message or "", self.workload.cluster.memory_reserved_gb)
        if not gb:
            return False
        self.said.append(gb)
        hw = usable_workload(self.workload, self.said)[0]
        moved, self.capacity = hw.cluster.memory_gb != self.capacity, hw.cluster.memory_gb
        if moved:
            self._bound_ooms(hw)
        return moved

    def _bound_ooms(self, hw) -> None:
        """Every OOM told or read so far bounds its layout's need at the capacity p_fit now compares with (`hw`'s),
        whichever came first, the OOM or the message that moved the capacity, up or down."""
        cap = math.log(hw.cluster.memory_gb)
        self.own.oy = [max(cap - log_mem, 0.0) + OOM_MARGIN for log_mem in self._oom_log_mem]
        history, studies = self._history
        if history and self.history.oy:
            self.history = warm_start_records(history, hw, studies).observations

    def _prior_fit(self, workload) -> np.ndarray:
        """predict's prior p_fit of every candidate (fit.prior_fit_probability) on `workload`'s GPUs: what p_fit
        reads before any peak or OOM of this framework, at the usable capacity the history's messages said."""
        memo: dict = {}
        return np.array([memory_fit(c, workload, memo)[4] for c in self.candidates])

    def _predicted_memory(self, layout: Layout, i: int | None) -> tuple[float, int]:
        """(predicted peak GB, worst stage) of `layout`: a candidate's from its stored prediction."""
        if i is not None:
            return self.mem_gb[i], int(self.mem_stage[i])
        p = predict(layout, self.workload)
        return p.memory_gb, p.memory_stage

    def tell_claimed_elsewhere(self, layout: Layout) -> None:
        """Another driver runs `layout`: never propose it, and do not wait for its result."""
        i = self.index.get(layout)
        if i is not None:
            self.used[i], self.reserve.held[i] = True, False
            self.pending.pop(i, None)

    # ---- beliefs ----------------------------------------------------------------------------------
    def _time_data(self) -> Observations:
        obs = Observations()
        obs.extend(self.history)
        obs.extend(self.own)
        return obs

    def _beliefs(self, extra: list[int]) -> tuple[GP, np.ndarray]:
        """The time GP with the family term (tuner/search/explore.py; hyperparameters of the base GP by
        marginal likelihood on real data), refitted with believer observations at `extra` (chosen or
        running layouts), and the candidates' rows to predict it at."""
        obs = self._time_data()
        base = obs.time_gp()
        Z, F, y, noise = obs.time_data()
        Xc = self.family_X
        X_own = np.array(self.own_X, dtype=float).reshape(len(self.own.y), self.X.shape[1])[:, self.varying] \
            * self.family_scale
        off_own = np.array(self.own_off, dtype=bool).reshape(X_own.shape)
        gp, rows = fit_beliefs(base, (Z, F, y, noise), len(self.history.y), X_own, Xc, self.Z,
                               off=(off_own, self.family_off))
        if extra:
            gp = believe(gp, rows[extra], self.F[extra])
        return gp, rows

    def believed_fastest(self, layouts) -> Layout | None:
        """Of `layouts` (candidates that ran), the one whose speed the searcher's belief puts highest: the model
        corrected by every measurement, the family term and the measurement noise in the fit -- what Ax calls the
        best point by model prediction. The study's recommendation is the fastest measured (tuner.metrics.rank_key);
        under a few percent of run-to-run noise the two can differ (issue 30 round 30: benchmarks/ext_search.py
        prints both). None when none of `layouts` is a candidate."""
        idx = [self.index[lay] for lay in layouts if lay in self.index]
        if not idx:
            return None
        gp, rows = self._beliefs([])
        mu, _ = gp.predict(rows[idx], self.F[idx])
        return self.candidates[idx[int(np.argmax(self.log_pred[idx] + mu))]]

    def p_fit(self) -> np.ndarray:
        """Probability that each candidate fits in memory, from the learned memory correction."""
        if self.capacity is None:
            return np.ones(len(self.candidates))
        obs = self._memory_obs()
        if not (obs.my or obs.oy):      # no peak nor OOM: the prior p_fit predict states (fit.prior_fit_probability)
            return self.prior_fit
        if not obs.my:                  # OOMs alone: capped at the model's prior
            return np.minimum(self._fit_by(obs.memory_gp(self.memory_sd)), self.prior_fit)
        peaks, at_peaks = self._peaks_gp()
        if not obs.oy:                  # no OOM: the correction is the peaks' own
            return self._fit_from(*at_peaks)
        # an OOM is a lower bound: its widening never makes a layout likelier to fit than the measured peaks alone say,
        # or the model's prior where none was measured (issue 30 rounds 33-34: a 15-sd surprise under a measured one)
        return np.minimum(self._fit_by(obs.memory_gp(self.memory_sd, peaks)), self._fit_from(*at_peaks))

    def _peaks_gp(self) -> tuple:
        """The memory correction of the measured peaks alone (no OOM bound) and its (mean, sd) at every candidate: what
        p_fit caps an OOM's widening at and the OOM deferral reads (oom_deferral), once per set of peaks."""
        key = (id(self.history), len(self.history.my), len(self.own.my), self.own.outside_gb)
        if self._peaks[0] != key:
            obs = self._memory_obs()
            gp = obs.peaks_gp(self.memory_sd)
            self._peaks = (key, gp, gp.predict(self.Z, self.FM))
        return self._peaks[1], self._peaks[2]

    def _fit_by(self, gp) -> np.ndarray:
        """Every candidate's p_fit under the memory correction `gp`, the caching allocator's share on top."""
        return self._fit_from(*gp.predict(self.Z, self.FM))

    def _fit_from(self, mu: np.ndarray, sd: np.ndarray) -> np.ndarray:
        """Every candidate's p_fit at a memory correction's (mean, sd) there, the caching allocator's share on top."""
        return ndtr((math.log(self.capacity) - self.log_mem - mu - ALLOCATOR_BIAS) / np.hypot(sd, P_FIT_SD))

    def _memory_obs(self) -> Observations:
        mem = Observations(outside_gb=self.own.outside_gb)
        mem.extend(self.history)
        mem.extend(self.own)
        return mem

    def _free(self) -> np.ndarray:
        free = np.flatnonzero(~self.used)
        pref = free[~self.deferred[free]]
        return pref if pref.size else free

    # ---- asking -----------------------------------------------------------------------------------
    def ask(self, n: int) -> list[Layout]:
        if int(n) > 0 and self.remaining and self._should_stop():
            return []
        return super().ask(n)

    def _should_stop(self) -> bool:
        """Update `confidence`; True when stopping is on and no layout is likely to beat the recommended one."""
        if self.best_index is None or self.n_ok < 1:
            self.stop.confidence = None
            return False
        recommended = f"{self.best_layout.key()} (MFU {100 * math.exp(self.best_log):.2f} %)"
        return self.stop.check(self._learned, self.n_ok, self._confidence, recommended)

    def _confidence(self) -> float:
        """P(no layout beats the recommended one by more than the threshold), see confidence.py."""
        gp, rows = self._beliefs([])            # running trials are not measurements
        threshold = self.stop.threshold if self.stop.threshold is not None else 0.01
        others = np.flatnonzero(~self.failed & ~self.reserve.held)
        others = others[others != self.best_index]
        p_fit = np.where(self.ran, 1.0, self.p_fit())     # a layout the model pruned may still run in truth
        rng = np.random.default_rng([self.seed, 13, self._learned])
        return 1.0 - beat_probability(gp, rows, self.F, self.log_pred, self.best_index, others, p_fit,
                                      margin_of(threshold), rng)

    def _initial_pick(self, score: np.ndarray, chosen: list[int]) -> int | None:
        """One of the first `n_initial` trials (no history; explore.first_pick), or None once they are chosen."""
        tried = sum(r.status != Status.PRUNED for r in self.told.values()) + len(chosen) + len(self.pending)
        if self.history.y or tried >= self.n_initial:
            return None
        free = self._free()
        if free.size == 0:
            return None
        picks = [family_key(self.candidates[i]) for i in (*chosen, *self.pending)]
        picks += [family_key(lay) for lay, r in self.told.items() if r.status != Status.PRUNED]
        return first_pick(self.candidates, free, score, picks, self.roomy, self._tiebreak)

    def _propose(self, n: int) -> list:
        p_fit = self.p_fit()
        self.used[self.reserve.release(p_fit)] = False   # held twins whose layout is likelier out of memory now
        stray = max((abs(y) for y in self._memory_obs().my), default=0.0)   # the farthest a measured peak strayed
        self.deferred = self.oom.deferred(self.used, self._peaks_gp, stray,
                                         math.log(self.capacity) if self.capacity else math.inf)
        log_fit = np.log(np.maximum(p_fit, 1e-12))
        chosen: list[int] = []
        for _ in range(n):
            extra = list(self.pending) + chosen
            gp, rows = self._beliefs(extra)
            mu, sd = gp.predict(rows, self.F)
            mean = self.log_pred + mu
            i = self._initial_pick(mean + log_fit, chosen)
            first = i is not None
            if i is None:
                free = self._free()
                if free.size == 0:
                    break
                if self.best_log is None:
                    acq = mean[free] + log_fit[free]             # nothing measured yet: the best belief
                else:
                    imp = mean[free] - self.best_log - XI
                    s = np.maximum(sd[free], 1e-9)
                    z = imp / s
                    ei = imp * ndtr(z) + s * _norm_pdf(z)
                    acq = np.log(np.maximum(ei, 1e-300)) + log_fit[free]
                i = int(free[int(np.argmax(acq + self._tiebreak[free]))])
            j = self._take(i)
            if j is None:
                break
            self.beliefs_at_ask[self.candidates[j]] = (float(mean[j]), float(math.hypot(sd[j], gp.noise)), first)
            chosen.append(j)
        for i in chosen:
            self.pending[i] = None
        return []
