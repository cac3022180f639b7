"""The spread rule (issue 24 round 9): where a framework's account was measured, p_fit is the empirical distribution of
the seen rows' log errors (tuner.frameworks memory_errors, equally likely atoms), convolved with the caching allocator's
share on a GPU -- not a normal of the median absolute deviation, which called the errors' tail impossible."""

from __future__ import annotations

import math
import random
import statistics

import pytest

from tuner import frameworks
from tuner.frameworks import ALLOCATOR_SD
from tuner.layout import Layout
from tuner.perfmodel import fit_probability, predict
from tuner.perfmodel.fit import (ERROR_QUANTILES, account_fit_probability, error_quantiles, errors_fit_probability,
                                 gpu_fit_probability)
from tuner.specs import make_workload


def test_error_quantiles_are_equally_likely_atoms_of_the_errors():
    xs = [0.001 * i for i in range(160)]
    q = error_quantiles(xs)
    assert len(q) == ERROR_QUANTILES and q == tuple(sorted(q))
    assert q[0] == pytest.approx(0.005) and q[-1] == pytest.approx(0.155)     # ranks (j + 1/2) n / k


def test_account_p_fit_is_the_share_of_atoms_that_fit():
    errors = (0.0,) * 14 + (0.01, 0.05)
    assert account_fit_probability(100.0, 100.0, errors) == 14 / 16          # the tail does not fit at its prediction
    assert account_fit_probability(100.0, 100.0 * math.exp(0.02), errors) == 15 / 16
    assert account_fit_probability(100.0, 99.0, errors) == 0.0


def test_gpu_p_fit_is_the_atoms_convolved_with_the_allocator_share():
    errors = (-0.01, 0.0, 0.03)
    want = statistics.fmean(fit_probability(50.0 * math.exp(a), 52.0, ALLOCATOR_SD) for a in errors)
    assert errors_fit_probability(50.0, 52.0, errors) == pytest.approx(want, abs=1e-12)
    assert errors_fit_probability(50.0, 52.0, (0.0,)) == pytest.approx(gpu_fit_probability(50.0, 52.0, 0.0))


@pytest.mark.parametrize("name", ["megatron-core", "torchtitan"])
def test_predict_states_the_measured_frameworks_empirical_p_fit(name):
    fw = frameworks.FRAMEWORKS[name]
    assert len(fw.memory_errors) == ERROR_QUANTILES and fw.memory_n >= 100
    w = make_workload("llama3-70b", 8, "h100", framework=name)
    p = predict(Layout(tp=4, pp=2, dp=8, micro_batch=1, zero_stage=1 if name == "megatron-core" else 3,
                       recompute="full"), w)
    assert p.p_fit == errors_fit_probability(p.memory_gb, w.cluster.memory_gb, fw.memory_errors)
    assert "quantiles" in fw.memory_note()


def test_a_heavy_tail_is_calibrated_where_the_mad_normal_is_not():
    """Exchangeable errors with a 10 % tail (as Megatron-Core's full recompute): P(error <= t) stated by the rule on
    200 draws, checked on 2,000 more at the tail's thresholds: within one atom's weight (1/16)."""
    rng = random.Random(7)
    draw = lambda: rng.gauss(0, 0.0002) if rng.random() > 0.1 else rng.uniform(0.002, 0.014)   # noqa: E731
    seen, fresh = [draw() for _ in range(200)], [draw() for _ in range(2000)]
    errors = error_quantiles(seen)
    med = statistics.median(seen)
    mad = 1.4826 * statistics.median(abs(x - med) for x in seen)
    for t in (0.001, 0.003, 0.005):
        realised = sum(x <= t for x in fresh) / len(fresh)
        assert abs(account_fit_probability(1.0, math.exp(t), errors) - realised) < 1 / ERROR_QUANTILES + 0.01
        assert abs(fit_probability(1.0, math.exp(t), mad, med) - realised) > 0.05     # the normal says ~1
