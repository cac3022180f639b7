"""An OOM the measured peaks already expected caps nothing at another node count (tuner.oom_evidence.expected_oom,
issue 30 round 47): where the memory correction of the measured peaks alone puts the OOM'd layout out of memory more
likely than not, the OOM tells `best` nothing those peaks did not, and its twins and the layouts of its activation
account keep the p_fit the correction gives them; an OOM those peaks did not expect still caps them."""

from __future__ import annotations

import math
from dataclasses import replace
from types import SimpleNamespace

from tuner.best import unmeasured_rows
from tuner.correction import features, warm_start_records
from tuner.frameworks import of
from tuner.layout import Layout
from tuner.oom_evidence import expected_oom, oom_bounds
from tuner.perfmodel import predict
from tuner.space import load_space
from tuner.specs import make_workload
from tuner.trial import Status

SPACE = load_space("frontier-2023")
W2, W4 = make_workload("22b", 2), make_workload("22b", 4)
OOMED = Layout(tp=2, pp=4, dp=2, micro_batch=1, zero_stage=1, recompute="none")     # predicted 46 of 68.7 GB
TWIN = replace(OOMED, dp=4)
RAN = [replace(OOMED, tp=4, dp=1), replace(OOMED, pp=8, dp=1), replace(OOMED, recompute="full")]


def record(layout: Layout, status: Status, peak: float | None = None, mfu: float | None = None):
    return SimpleNamespace(layout=layout, status=status, nodes=2, peak_memory_gb=peak, mfu=mfu, model="gpt-22b",
                           cluster="frontier", study="s", runner="command", global_batch=None)


def study(ratio: float) -> list:
    """Three ok runs whose GPUs needed `ratio` times the account, and the OOM."""
    runs = [record(lay, Status.OK, ratio * predict(lay, W2).memory_gb - W2.cluster.memory_reserved_gb,
                   predict(lay, W2).mfu) for lay in RAN]
    return runs + [record(OOMED, Status.OOM)]


def peaks_gp(recs):
    o = warm_start_records(recs, W4).observations
    return o.peaks_gp(of(W4).memory_sd), o


def test_an_oom_the_peaks_expected_bounds_nothing_and_a_surprise_still_does():
    cap = W2.cluster.memory_gb
    p = predict(OOMED, W2)
    for ratio, expected in ((1.6, True), (1.0, False)):
        recs = study(ratio)
        peaks, obs = peaks_gp(recs)
        assert expected_oom(peaks, features(OOMED, W2, p), math.log(cap / p.memory_gb)) is expected
        gp = obs.memory_gp(of(W4).memory_sd)
        assert [b.layout for b in oom_bounds(recs, W4, gp)] == [OOMED]           # without the peaks' belief: a bound
        assert [b.layout for b in oom_bounds(recs, W4, gp, peaks=peaks)] == ([] if expected else [OOMED])


def test_best_at_2n_leaves_the_twin_of_an_expected_oom_to_the_correction():
    assert 1.6 * predict(TWIN, W4).memory_gb < W4.cluster.memory_gb < 1.6 * predict(OOMED, W2).memory_gb  # it fits
    for ratio, limited in ((1.6, False), (1.0, True)):
        rows = {r["layout"]: r for r in unmeasured_rows(W4, SPACE, study(ratio))[0]}
        why = rows[TWIN]["limited_by"]
        assert (why is not None and OOMED.key() in why) is limited
