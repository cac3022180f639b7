"""The stop rule's confidence: P(no other layout beats the recommended one by more than a threshold). Pure.

Joint over every layout that could still beat it (measured ones included: their true speed is only
known up to noise), against the recommended layout's *posterior* speed, not its noisy measurement:

    confidence = P( max_j  fit_j * (f_j - f_rec) <= log(1 + threshold) )

with f the latent log MFU (model prediction + the learned residual GP, jointly Gaussian) and fit_j a
draw of whether layout j fits in memory (1 for a layout that ran). Estimated by Monte Carlo over the
MC_MAX layouts most likely to beat it (joint draws from the GP posterior); the rest contribute their
marginal probabilities as a union bound, so the figure errs low (conservative), never high.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.special import ndtr

MC_DRAWS = 2000
MC_MAX = 150


def beat_probability(gp, Z, F, log_pred, rec: int, others: np.ndarray, p_fit: np.ndarray, margin: float,
                     rng: np.random.Generator) -> float:
    """P(some layout of `others` (indices) is faster than layout `rec` by more than `margin` (log))."""
    if others.size == 0:
        return 0.0
    mu, sd = gp.predict(Z[others], F[others])
    m_rec, s_rec = gp.predict(Z[[rec]], F[[rec]])
    gap = log_pred[others] + mu - (log_pred[rec] + m_rec[0]) - margin
    marginal = ndtr(gap / np.maximum(np.hypot(sd, s_rec[0]), 1e-9)) * p_fit[others]
    order = np.argsort(-marginal)
    top, rest = order[:MC_MAX], order[MC_MAX:]
    tail = float(marginal[rest].sum())
    idx = np.concatenate([[rec], others[top]])
    mean, cov = gp.predict_cov(Z[idx], F[idx])
    mean = mean + log_pred[idx]
    L = _chol(cov)
    draws = mean[None, :] + rng.standard_normal((MC_DRAWS, len(idx))) @ L.T
    fits = rng.random((MC_DRAWS, len(top))) < p_fit[others[top]][None, :]
    beats = ((draws[:, 1:] - draws[:, :1] > margin) & fits).any(axis=1)
    return min(1.0, float(beats.mean()) + tail)


def _chol(cov: np.ndarray) -> np.ndarray:
    """A square root of a covariance that may be singular (layouts with identical features)."""
    try:
        return np.linalg.cholesky(cov + 1e-8 * max(float(np.mean(np.diag(cov))), 1e-12) * np.eye(len(cov)))
    except np.linalg.LinAlgError:
        w, v = np.linalg.eigh(cov)
        return v * np.sqrt(np.maximum(w, 0.0))


def margin_of(threshold: float) -> float:
    return math.log1p(threshold)
