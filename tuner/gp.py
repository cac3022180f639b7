"""The Gaussian process the memory and speed correction fits on the model's residuals (tuner.correction): a
kernel of a constant, a linear term in the model's features and a squared-exponential term in the layout's
coordinates; its shape chosen by marginal likelihood over a small grid. RatioGP: the memory correction's form of it
(a ratio of peaks), and what an OOM it already expected tells it (truncation_site). Pure numpy."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace

import numpy as np

# ------------------------------------------------------------------------------------------------ GP
@dataclass
class GP:
    """A GP with kernel s_c^2 + s_w^2 f.f' + s_g^2 exp(-|z - z'|^2 / 2 l^2); zero prior mean."""

    s_c: float = 0.3
    s_w: float = 0.3
    s_g: float = 0.15
    ell: float = 0.5
    noise: float = 0.025
    sd_scale: float = 1.0          # calibration of the predictive sd (see calibrate)
    w_scale: np.ndarray | None = None   # per-feature multipliers of s_w (None: all 1)
    z_scale: np.ndarray | None = None   # per-coordinate multipliers of z in the squared-exponential (None: all 1)
    #: the prior mean: feature column `scaled_col` (a share of the predicted time) taking `scale` times as long --
    #: log(1 + (scale - 1) share) slower (1: a zero mean); see fit_gp's `scales`
    scale: float = 1.0
    scaled_col: int | None = None
    _data: tuple | None = field(default=None, repr=False)
    _noise2: np.ndarray | None = field(default=None, repr=False)     # each fitted point's noise variance

    def shape(self) -> dict:
        """The hyperparameters (GP's fields but the sd calibration and the data): what a GP built on this one's
        choice (tuner.search.explore's family GP) takes over."""
        return {f.name: getattr(self, f.name) for f in fields(GP) if f.name != "sd_scale" and not f.name.startswith("_")}

    def mean(self, F) -> np.ndarray:
        F = np.asarray(F, float)
        if self.scale == 1.0 or self.scaled_col is None:
            return np.zeros(len(F))
        return -np.log1p((self.scale - 1.0) * F[:, self.scaled_col])

    def kernel(self, Z1, F1, Z2, F2) -> np.ndarray:
        if self.z_scale is not None:
            Z1, Z2 = Z1 * self.z_scale, Z2 * self.z_scale
        d2 = ((Z1[:, None, :] - Z2[None, :, :]) ** 2).sum(-1)
        W = F1 if self.w_scale is None else F1 * self.w_scale ** 2
        return self.s_c ** 2 + self.s_w ** 2 * W @ F2.T + self.s_g ** 2 * np.exp(-0.5 * d2 / self.ell ** 2)

    def prior_var(self, Z, F) -> np.ndarray:
        W = F if self.w_scale is None else F * self.w_scale ** 2
        return self.s_c ** 2 + self.s_w ** 2 * (W * F).sum(1) + self.s_g ** 2

    def fit(self, Z, F, y, extra_noise=None) -> "GP":
        Z, F, y = np.asarray(Z, float), np.asarray(F, float), np.asarray(y, float)
        if len(y) == 0:
            self._data = None
            return self
        nv = self.noise ** 2 + (np.zeros(len(y)) if extra_noise is None else np.asarray(extra_noise) ** 2)
        self._noise2 = nv
        K = self.kernel(Z, F, Z, F) + np.diag(nv + 1e-9)
        L = np.linalg.cholesky(K)
        alpha = np.linalg.solve(L.T, np.linalg.solve(L, y - self.mean(F)))
        self._data = (Z, F, y, L, alpha)
        return self

    def log_marginal(self) -> float:
        if self._data is None:
            return 0.0
        _, F, y, L, alpha = self._data
        return float(-0.5 * (y - self.mean(F)) @ alpha - np.log(np.diag(L)).sum()
                     - 0.5 * len(y) * math.log(2 * math.pi))

    def predict(self, Z, F) -> tuple[np.ndarray, np.ndarray]:
        """Posterior mean and standard deviation (of the latent residual, without noise)."""
        Z, F = np.asarray(Z, float), np.asarray(F, float)
        var = self.prior_var(Z, F)
        if self._data is None:
            return self.mean(F), np.sqrt(var)
        Zd, Fd, _, L, alpha = self._data
        Ks = self.kernel(Z, F, Zd, Fd)
        v = np.linalg.solve(L, Ks.T)
        sd = self.sd_scale * np.sqrt(np.maximum(var - (v * v).sum(0), 1e-8))
        return self.mean(F) + Ks @ alpha, sd

    def predict_cov(self, Z, F) -> tuple[np.ndarray, np.ndarray]:
        """Posterior mean and covariance (latent, calibrated like `predict`) of a set of layouts."""
        Z, F = np.asarray(Z, float), np.asarray(F, float)
        K = self.kernel(Z, F, Z, F)
        if self._data is None:
            return self.mean(F), K
        Zd, Fd, _, L, alpha = self._data
        Ks = self.kernel(Z, F, Zd, Fd)
        v = np.linalg.solve(L, Ks.T)
        return self.mean(F) + Ks @ alpha, self.sd_scale ** 2 * (K - v.T @ v)

    def loo_z2(self) -> float:
        """Mean squared leave-one-out z-score of the data (about 1 when the GP's uncertainty is
        calibrated, larger when the data surprise it)."""
        if self._data is None:
            return 1.0
        _, _, _, L, alpha = self._data
        Linv = np.linalg.solve(L, np.eye(len(alpha)))
        kinv_diag = (Linv * Linv).sum(0)
        return float(np.mean(alpha ** 2 / kinv_diag))

    def with_points(self, Z, F, y, noise) -> "GP":
        """A copy of this fitted GP -- its shape and sd calibration kept, not chosen again -- conditioned on more
        points as well, each with the whole noise sd `noise` in the units `predict` states its sd in (at least the
        GP's own noise)."""
        out = replace(self)
        extra = np.sqrt(np.maximum((np.asarray(noise, float) / self.sd_scale) ** 2 - self.noise ** 2, 0.0))
        if self._data is None:
            return out.fit(Z, F, y, extra)
        Zd, Fd, yd, _, _ = self._data
        had = np.sqrt(np.maximum(self._noise2 - self.noise ** 2, 0.0))
        return out.fit(np.vstack([Zd, np.asarray(Z, float)]), np.vstack([Fd, np.asarray(F, float)]),
                       np.concatenate([yd, np.asarray(y, float)]), np.concatenate([had, extra]))

    def calibrate(self, max_scale: float = 3.0) -> "GP":
        """Widen the predictive sd when the leave-one-out errors are larger than it says (never
        narrow it): a residual model that does not explain the data must not be trusted."""
        self.sd_scale = float(min(max(math.sqrt(self.loo_z2()), 1.0), max_scale))
        return self


GRID = [(s_w, s_g, ell) for s_w in (0.15, 0.4) for s_g in (0.12, 0.3) for ell in (0.35, 0.7)]


def fit_gp(Z, F, y, extra_noise=None, *, s_c=0.3, noise=0.025, min_points=6, z_scale=None, scaled_col=None,
           scales=(1.0,), **_) -> GP:
    """A GP on the residuals, its shape chosen by marginal likelihood over a small grid once there
    are `min_points` observations (defaults before: wide enough to keep exploring); `z_scale` (GP.z_scale) kept;
    with `scaled_col`, the prior mean (GP.scale) chosen the same way among `scales`, the first winning ties."""
    if len(y) < min_points:
        return GP(s_c=s_c, noise=noise, z_scale=z_scale).fit(Z, F, y, extra_noise)
    best, best_lm = None, -math.inf
    for scale in scales if scaled_col is not None else (1.0,):
        for s_w, s_g, ell in GRID:
            gp = GP(s_c=s_c, s_w=s_w, s_g=s_g, ell=ell, noise=noise, z_scale=z_scale, scale=scale,
                    scaled_col=scaled_col)
            lm = gp.fit(Z, F, y, extra_noise).log_marginal()
            if lm > best_lm + 1e-9:
                best, best_lm = gp, lm
    return best.calibrate()


def truncation_site(mean: float, sd: float, bound: float) -> float:
    """The noise sd of a Gaussian observation at `mean` that narrows a belief N(mean, sd^2) to the variance it has
    once it is known to lie above `bound` (the truncated normal's; Johnson, Kotz & Balakrishnan 1994, "Continuous
    Univariate Distributions", vol. 1, 13.10) without moving its mean: a censored observation's second moment, not
    its first (inf where the bound says nothing: far below the belief)."""
    a = (bound - mean) / sd
    lam = math.exp(-0.5 * a * a) / math.sqrt(2 * math.pi) / max(0.5 * math.erfc(a / math.sqrt(2)), 1e-300)
    r = 1.0 + a * lam - lam * lam                 # the truncated variance over the belief's
    return math.inf if r >= 1.0 - 1e-6 else sd * math.sqrt(max(r, 1e-6) / (1.0 - r))


@dataclass
class RatioGP:
    """The memory correction: a GP on measured / predicted peak - 1, which is linear in the memory shares
    when each component of the model's account is off by its own factor (sum_k m_k share_k - 1), however
    large the factors; `predict` answers in log(measured / predicted) as the callers compare with capacity."""

    gp: GP

    def predict(self, Z, F) -> tuple[np.ndarray, np.ndarray]:
        mu, sd = self.gp.predict(Z, F)
        ratio = np.maximum(1.0 + mu, 0.05)
        return np.log(ratio), sd / ratio

    def truncated(self, Z, F, bounds, rows) -> "RatioGP":
        """This correction told that the OOM'd layouts `rows` (of Z, F; lower `bounds` in log) needed more than
        their bounds, where it already believes they did: each belief is narrowed to its truncated normal's
        variance, its mean kept (truncation_site), one OOM after the other on the belief those before it left
        (two alike narrow it less than two apart) -- one OOM of an account that no peak measured then lowers
        the p_fit of its kin the belief puts above the capacity, which entering it at its bound cannot (issue 30
        round 43); the mean shift is left out (round 35: under a wide prior it moved a whole family)."""
        out = self
        for i in rows:
            (mu,), (sd,) = out.predict(Z[i:i + 1], F[i:i + 1])
            noise = truncation_site(mu, sd, bounds[i])
            if math.isfinite(noise) and mu >= bounds[i]:
                ratio = math.exp(mu)
                out = RatioGP(out.gp.with_points(Z[i:i + 1], F[i:i + 1], [ratio - 1.0], [noise * ratio]))
        return out
