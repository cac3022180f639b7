"""Exploration that escapes a wrong prior (issue 30): a family term whose uncertainty grows where the model
has been wrong, and first picks spread over layout families. Pure (numpy).

The guided searcher's belief about a layout's log speed is log(predicted) + r, r learned by the time GP of
tuner/correction.py over the model's own account of the layout (time shares, bubble, communication
shares, a few layout coordinates). A term the model lacks that hits a whole family -- every expert-parallel
degree, every deep pipeline, every layout with the micro-batch one size up -- is invisible to features the
model computes, so one wrong term can hide a family for the whole budget. `FamilyGP` adds to that GP's
kernel a term over the searcher's own coordinates of every searched dimension (tuner.search.base encode:
tp, sp, cp, pp, vp, ep, etp, micro-batch, ZeRO stage, recompute):

    k_fam(x, x') = sigma(x) sigma(x') mean_d exp(-(x_d - x'_d)^2 / 2 ELL^2)

additive over the dimensions that vary (one effect per dimension: what every layout with ep 8, or with
micro-batch 4, has in common; the ZeRO stage a category, CATEGORICAL), so measurements that all share a value
teach that value's effect and leave the untried values of that dimension at the prior -- a family the model
ranks low but nobody measured keeps its chance -- with a non-stationary amplitude (a valid kernel for any sigma >= 0):


    sigma(x) = BASE + GAIN * u(x),
    u(x) = (sum_j w_j(x) e_j + PRIOR_WEIGHT * mean_j e_j) / (sum_j w_j(x) + PRIOR_WEIGHT)

e_j the model's error at trial j (model_errors: how far log(measured_j / predicted_j) lies from the study's
median, plus half that median), w_j(x) = exp(-|x - x_j|^2 / 2 ELL_U^2). Where the model has been wrong
nearby, layouts are uncertain (expected improvement looks there); far from every trial the uncertainty is
the model's mean error so far (a model wrong by 2x where it was measured is no better trusted where it
was not). A trial that beats its prediction by far pulls its
neighbours' posterior up through the same term (their covariance with it is large). Trials of other
studies (warm start) and stopped-early bounds enter with sigma 0: the family term learns from this
study's own measurements only. A dimension that means nothing in a layout (INACTIVE: the interleaving and the stage
split at pp 1, sequence parallelism at tp 1) is read there as a value of its own, as a conditional search space
needs: what the pp-1 layouts got wrong is not what every pipeline without interleaving has in common.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from tuner.correction import Z_DIM
from tuner.gp import GP

ELL = 0.25           # length-scale of each dimension's effect over its [0, 1] coordinate
ELL_U = 0.35         # reach of a trial's error on its neighbours' uncertainty
BASE = 0.05          # the family term's amplitude before anything is measured (log speed)
GAIN = 1.0           # amplitude per unit of the model's (log) error nearby
PRIOR_WEIGHT = 0.5   # weight of the study's mean error in u(x) (a pseudo-trial everywhere)
DEAD_ZONE = 0.03     # errors below this are measurement noise, not the model being wrong
GLOBAL_SHARE = 0.5   # share of the study's typical error that counts as the model's error everywhere
#: The family of a layout for the first picks: what one wrong term of the model can hide together. The first
#: KEY_DIMS count twice: a pipeline depth, a recompute mode, a micro-batch size, a ZeRO stage is each the
#: subject of one term of the model (bubble and per-micro-batch cost, recompute cost, GEMM shapes, collectives).
FAMILY_DIMS = ("pp", "recompute", "micro_batch", "zero_stage", "tp", "expert_parallel", "expert_tensor_parallel",
               "context_parallel", "virtual_pipeline")
KEY_DIMS = 4
#: Dimensions whose values share no effect in the family term: each ZeRO stage is its own mechanism (stage 3 gathers
#: the parameters every micro-batch, stage 2 reduce-scatters the gradients, stage 1 only shards the optimizer), so a
#: world that makes one stage slow says nothing about the next one, as an ordinal coordinate would have it.
CATEGORICAL = ("zero_stage",)
N_INITIAL = 3              # first picks: the model's top pick + the best of other layout families
#: Dimensions that mean nothing in some layouts (a conditional search space, Swersky et al. 2014, "Raiders of the
#: Lost Architecture", arXiv:1409.4011): an interleaving or a stage split without a pipeline, sequence parallelism
#: without tensor parallelism -- dimension: (the layout field, the value at which it is inactive). The family term
#: reads an inactive dimension as a value of its own (INACTIVE_AT, far from every active one), so that the pp-1
#: layouts' error is not taught to every pipeline that does not interleave (issue 30 round 31).
INACTIVE = {"virtual_pipeline": ("pp", 1), "pipeline_split": ("pp", 1), "sequence_parallel": ("tp", 1)}
INACTIVE_AT = -10.0
SPREAD_CAP = 12            # novelty beyond this does not rank a first pick higher
DIVERSE_WITHIN = 0.7       # a first pick's predicted throughput is at least this fraction of the top


@dataclass
class FamilyGP(GP):
    """tuner.gp.GP plus the family term. Its Z rows are [z (Z_DIM) | x (the searcher's coordinates) | sigma]."""

    ell_x: float = ELL
    _noise_extra: np.ndarray = field(default_factory=lambda: np.zeros(0), repr=False)

    def fit(self, Z, F, y, extra_noise=None) -> "FamilyGP":
        self._noise_extra = np.zeros(len(y)) if extra_noise is None else np.asarray(extra_noise, float)
        super().fit(Z, F, y, extra_noise)
        return self

    def kernel(self, Z1, F1, Z2, F2) -> np.ndarray:
        base = super().kernel(Z1[:, :Z_DIM], F1, Z2[:, :Z_DIM], F2)
        X1, X2, s1, s2 = Z1[:, Z_DIM:-1], Z2[:, Z_DIM:-1], Z1[:, -1], Z2[:, -1]
        add = np.zeros((len(X1), len(X2)))
        for d in range(X1.shape[1]):             # additive: one smooth effect per dimension
            add += np.exp(-0.5 * (X1[:, d, None] - X2[None, :, d]) ** 2 / self.ell_x ** 2)
        return base + s1[:, None] * s2[None, :] * add / max(X1.shape[1], 1)

    def prior_var(self, Z, F) -> np.ndarray:
        return super().prior_var(Z[:, :Z_DIM], F) + Z[:, -1] ** 2


def model_errors(y) -> np.ndarray:
    """e_j: how wrong the model was at each measured trial (log), beyond the measurement noise: its error
    apart from the study's typical (median) error (what the GP's global scale absorbs), plus GLOBAL_SHARE of
    that typical error itself (a model off by 2x wherever it was measured is no better trusted where it was not)."""
    y = np.asarray(y, float)
    if y.size == 0:
        return y
    typical = float(np.median(y))             # robust: one trial far off does not make the model wrong everywhere
    return np.maximum(np.abs(y - typical) - DEAD_ZONE, 0.0) + GLOBAL_SHARE * max(abs(typical) - DEAD_ZONE, 0.0)


def amplitude(X: np.ndarray, X_obs: np.ndarray, errors: np.ndarray, base: float = BASE,
              off: tuple | None = None) -> np.ndarray:
    """sigma(x) of every row of X given the trials at X_obs and the model's errors there; with `off` (the
    inactive_mask of X's rows and of X_obs's), a dimension inactive in either layout adds nothing to their distance."""
    if len(errors) == 0:
        return np.full(len(X), base)
    sq = (X[:, None, :] - X_obs[None, :, :]) ** 2
    if off is not None:
        sq = np.where(off[0][:, None, :] | off[1][None, :, :], 0.0, sq)
    d2 = sq.sum(-1)
    w = np.exp(-0.5 * d2 / ELL_U ** 2)
    u = (w @ errors + PRIOR_WEIGHT * errors.mean()) / (w.sum(1) + PRIOR_WEIGHT)
    return base + GAIN * u


def family_scale(X: np.ndarray, dims: list[str]) -> np.ndarray:
    """Per column of X (the searcher's coordinates of `dims`), the factor the family term reads it at: each CATEGORICAL
    column spread so that its neighbouring values lie 3 ELL apart (they share under 1 % of an effect, and a trial's
    error there reaches no other value's uncertainty); 1 for the rest."""
    scale = np.ones(len(dims))
    for k, d in enumerate(dims):
        values = np.unique(X[:, k]) if d in CATEGORICAL and len(X) else ()
        if len(values) > 1:
            scale[k] = 3 * ELL / float(np.diff(values).min())
    return scale


def inactive_mask(layouts, dims: list[str]) -> np.ndarray:
    """(len(layouts), len(dims)) booleans: where the dimension means nothing for the layout (INACTIVE)."""
    out = np.zeros((len(layouts), len(dims)), dtype=bool)
    for k, d in enumerate(dims):
        if d in INACTIVE:
            on, value = INACTIVE[d]
            out[:, k] = [getattr(lay, on) == value for lay in layouts]
    return out


def augment(Z: np.ndarray, X: np.ndarray, sigma: np.ndarray) -> np.ndarray:
    """Rows [z | x | sigma] for FamilyGP."""
    return np.hstack([Z, X, np.asarray(sigma, float).reshape(-1, 1)])


def family_gp(base: GP, Z, F, y, noise, X, sigma, calibrate: bool = True) -> FamilyGP:
    """`base`'s hyperparameters plus the family term, fitted on rows [Z | X | sigma]; with `calibrate`, its sd
    widened by its leave-one-out errors as the time GP's is (never narrowed)."""
    gp = FamilyGP(**base.shape())
    gp.fit(augment(np.asarray(Z, float).reshape(len(y), Z_DIM), X, sigma), F, y, noise)
    return gp.calibrate() if calibrate and len(y) >= 6 else gp


def fit_beliefs(base: GP, data: tuple, n_hist: int, X_own: np.ndarray, X_cand: np.ndarray, Z_cand: np.ndarray,
                base_sigma: float = BASE, calibrate: bool = True,
                off: tuple | None = None) -> tuple[FamilyGP, np.ndarray]:
    """The family GP on `data` = (Z, F, y, noise): rows [0, n_hist) from other studies, the next len(X_own)
    this study's own trials at X_own, any after them (stopped-early bounds) without a family term; and the
    candidates' rows [Z_cand | X_cand | sigma] to predict it at. `off` = (inactive_mask of the own trials, of the
    candidates): an inactive dimension reads INACTIVE_AT in the kernel and counts in no distance of the amplitude."""
    Z, F, y, noise = data
    n_own = len(X_own)
    errors = model_errors(y[n_hist:n_hist + n_own])
    off_own, off_cand = off if off is not None else (np.zeros(X_own.shape, bool), np.zeros(X_cand.shape, bool))
    X = np.zeros((len(y), X_cand.shape[1]))
    X[n_hist:n_hist + n_own] = np.where(off_own, INACTIVE_AT, X_own)
    sigma = np.zeros(len(y))
    sigma[n_hist:n_hist + n_own] = amplitude(X_own, X_own, errors, base_sigma, (off_own, off_own))
    gp = family_gp(base, Z, F, y, noise, X, sigma, calibrate)
    sigma_cand = amplitude(X_cand, X_own, errors, base_sigma, (off_cand, off_own))
    return gp, augment(Z_cand, np.where(off_cand, INACTIVE_AT, X_cand), sigma_cand)


def believe(gp: FamilyGP, rows: np.ndarray, F: np.ndarray) -> FamilyGP:
    """The kriging believer: `gp` refitted with the layouts at `rows` (candidate rows [z | x | sigma]) counted
    as measured at its posterior mean, noise-free; hyperparameters and sd calibration kept (real data set them)."""
    if gp._data is None:
        A, Fd, y, noise = np.zeros((0, rows.shape[1])), np.zeros((0, F.shape[1])), np.zeros(0), np.zeros(0)
    else:
        A, Fd, y = gp._data[0], gp._data[1], gp._data[2]
        noise = gp._noise_extra
    mu, _ = gp.predict(rows, F)
    out = FamilyGP(**gp.shape(), sd_scale=gp.sd_scale, ell_x=gp.ell_x)
    out.fit(np.vstack([A, rows]), np.vstack([Fd, F]), np.concatenate([y, mu]),
            np.concatenate([noise, np.zeros(len(mu))]))
    return out


def first_pick(candidates: list, free: np.ndarray, score: np.ndarray, picks: list[tuple], roomy: np.ndarray,
               tiebreak: np.ndarray) -> int | None:
    """A first trial (no history) among the indices `free`: the best-scored (predicted) candidate that takes
    values no earlier pick (`picks`: their family keys) has in as many of the family dimensions (FAMILY_DIMS,
    up to SPREAD_CAP) as any candidate within DIVERSE_WITHIN of the top does -- the model's top pick when
    there is none -- keeping the memory headroom (`roomy`) where any does: one wrong term of the model cannot
    hide a whole family."""
    top = float(score[free].max())
    ok = [i for i in free if score[i] >= top + math.log(DIVERSE_WITHIN)] if picks else list(free)
    if any(roomy[i] for i in ok):
        ok = [i for i in ok if roomy[i]]
    if not ok:
        return None
    far = {i: min(novelty(family_key(candidates[i]), picks), SPREAD_CAP) for i in ok}
    return int(max(ok, key=lambda i: (far[i], score[i] + tiebreak[i])))


def family_key(layout) -> tuple:
    return tuple(getattr(layout, d) for d in FAMILY_DIMS)


def novelty(key: tuple, chosen: list[tuple]) -> int:
    """How many of FAMILY_DIMS `key` takes a value in that none of `chosen` has, the KEY_DIMS counted twice
    (0 with none chosen)."""
    if not chosen:
        return 0
    return sum((2 if d < KEY_DIMS else 1) * all(v != c[d] for c in chosen) for d, v in enumerate(key))
