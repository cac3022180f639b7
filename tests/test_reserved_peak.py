"""A measured run's reserved memory (issue 24 round 7): an allocated peak (max_memory_allocated) cannot show the
caching allocator's fragmentation, so runners that can read it also record the reserved peak
(max_memory_reserved; Megatron's "max reserved"; the command runner's optional peak_reserved_gb) in the trial's
extra, and the memory correction, best's measured twins and the guided searcher read a run's need as the larger of
reserved + the cluster's reserve and allocated + that reserve (tuner.perfmodel.fit.run_need_gb). A twin whose
reserved peak is known already holds its own fragmentation: its p_fit keeps only its run-to-run noise."""

from __future__ import annotations

import math
import sys
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

from tuner.best import best_for_unmeasured, supported_fit
from tuner.correction import Observations, features, warm_start_records
from tuner.layout import Layout

from tuner.perfmodel import MEMORY_NOISE_SD, RECOMMEND_AT, fit_probability, gpu_fit_probability, predict
from tuner.runners import megatron
from tuner.runners.command import result_from_dict
from tuner.search.guided import GuidedSearcher
from tuner.space import load_space
from tuner.specs import load_model, make_workload
from tuner.store import StudyRecord, open_store
from tuner.trial import Status, TrialResult, TrialSpec

sys.path.insert(0, str(Path(__file__).parents[1] / "benchmarks"))
import indep_worlds  # noqa: E402  the search benchmarks' worlds
from worlds_ext import draw_world, memory_acct  # noqa: E402

FIXTURES = Path(__file__).parent / "fixtures"
SPACE = load_space("frontier-2023")
# Megatron-Core's ZeRO 0 keeps whole states at any dp (Megatron-DeepSpeed's pipeline engine shards them at ZeRO 0 too:
# tuner.perfmodel.deepspeed_states, issue 30 round 33)
W2, W4 = make_workload("22b", 2, framework="megatron-core"), make_workload("22b", 4, framework="megatron-core")
CAP, RES = W4.cluster.memory_gb, W4.cluster.memory_reserved_gb
RAN = Layout(tp=2, pp=8, dp=1, micro_batch=1, zero_stage=0, recompute="none")   # no ZeRO: dp 2 needs no less

def record(peak: float, reserved: float | None = None, layout: Layout = RAN):
    return SimpleNamespace(layout=layout, status=Status.OK, nodes=2, peak_memory_gb=peak, mfu=0.3, model="gpt-22b",
                           cluster="frontier", study="s", runner="command", global_batch=None,
                           peak_reserved_gb=reserved)

def twin_p(peak: float, reserved: float | None) -> float:
    return supported_fit(replace(RAN, dp=2), {replace(RAN, dp=1): [record(peak, reserved)]}, CAP, RES)[0]

def test_a_twin_whose_reserved_peak_is_near_capacity_is_not_trusted_as_roomy():
    """Allocated at 80 % of the GPU (0.999 sure by its bytes and the allocator's usual share), but the caching
    allocator held 98 % less the reserve: the twin's own fragmentation was far above ALLOCATOR_SD's."""
    allocated, reserved = 0.80 * CAP, 0.98 * CAP - RES
    assert twin_p(allocated, None) > RECOMMEND_AT                         # what an allocated peak alone said
    assert twin_p(allocated, reserved) == pytest.approx(fit_probability(0.98 * CAP, CAP, MEMORY_NOISE_SD))
    assert twin_p(allocated, reserved) < RECOMMEND_AT
    # in `best --nodes 2N`: an OOM of the same activation account caps the model's p_fit; the twin no longer lifts it
    oom = SimpleNamespace(**{**vars(record(0.0)), "layout": replace(RAN, pp=4, dp=2), "status": Status.OOM,
                             "peak_memory_gb": None, "mfu": None})
    rows = {r["layout"]: r for r in best_for_unmeasured(W4, SPACE, [oom, record(allocated)], k=10**6)}
    assert rows[replace(RAN, dp=2)]["headroom_ok"]
    rows = {r["layout"]: r for r in best_for_unmeasured(W4, SPACE, [oom, record(allocated, reserved)], k=10**6)}
    doubled = rows.get(replace(RAN, dp=2))
    assert doubled is None or not doubled["headroom_ok"]

def test_a_known_reserved_peak_does_not_count_the_allocators_share_twice():
    """Reserved + reserve at 90 % of the GPU: only the twin's re-run noise is left, so it is surer than the same need
    with ALLOCATOR_SD on top; an allocated need above the reserved one (a runner's odd figures) still counts."""
    p = twin_p(0.85 * CAP - RES, 0.90 * CAP - RES)
    assert p == pytest.approx(fit_probability(0.90 * CAP, CAP, MEMORY_NOISE_SD))
    assert p > gpu_fit_probability(0.90 * CAP, CAP, MEMORY_NOISE_SD)
    assert twin_p(0.95 * CAP - RES, 0.90 * CAP - RES) == pytest.approx(fit_probability(0.95 * CAP, CAP, MEMORY_NOISE_SD))
    # of two twins, the one with the larger need bounds the layout
    both = [record(0.70 * CAP, 0.95 * CAP - RES), record(0.75 * CAP, 0.80 * CAP - RES, layout=RAN)]
    p, by = supported_fit(replace(RAN, dp=2), {replace(RAN, dp=1): both}, CAP, RES)
    assert p == pytest.approx(fit_probability(0.80 * CAP, CAP, MEMORY_NOISE_SD)) and "reserved" in by

def test_the_correction_and_the_guided_searcher_read_the_reserved_need_when_larger():
    pred = predict(RAN, W2)
    ft = features(RAN, W2, pred)
    allocated = pred.memory_gb - RES                      # exactly the predicted allocated bytes
    reserved = 1.10 * pred.memory_gb - RES                # the allocator held 10 % of the prediction more
    assert ft.measured_log_ratio(allocated) == pytest.approx(0.0, abs=1e-12)
    assert ft.measured_log_ratio(allocated, reserved) == pytest.approx(math.log(1.10))
    assert ft.measured_log_ratio(allocated, 0.5 * allocated) == pytest.approx(0.0, abs=1e-12)
    obs = Observations()
    obs.add_result(ft, Status.OK, 0.3, allocated, W2.cluster.memory_gb, reserved_gb=reserved)
    assert obs.my == [pytest.approx(math.log(1.10))]
    rec = SimpleNamespace(**{**vars(record(allocated, reserved)), "nodes": W2.nodes})
    ws = warm_start_records([rec], W2)
    assert ws.observations.my == [pytest.approx(math.log(1.10))]
    s = GuidedSearcher([RAN], workload=W2)
    s.tell(RAN, TrialResult(Status.OK, mfu=0.3, peak_memory_gb=allocated, peak_reserved_gb=reserved))
    assert s.mem_scale == pytest.approx(1.10) and s.own.my == [pytest.approx(math.log(1.10))]

def test_the_store_keeps_the_reserved_peak_in_the_trials_extra():
    store = open_store("sqlite://")
    store.create_study(StudyRecord("s", W2.as_dict(), {"name": SPACE.name}, "guided", "command"))
    for lay, reserved in ((RAN, 41.5), (replace(RAN, micro_batch=2), None)):
        n = store.claim_trial("s", lay, None, "command")
        store.finish_trial("s", n, TrialResult(Status.OK, mfu=0.3, samples_per_second=1.0, peak_memory_gb=38.0,
                                               peak_reserved_gb=reserved))
    got = {t.layout: t for t in store.trials("s")}
    assert got[RAN].peak_reserved_gb == 41.5 and got[RAN].extra["peak_reserved_gb"] == 41.5
    assert got[replace(RAN, micro_batch=2)].peak_reserved_gb is None
    store.close()

def test_runners_read_the_reserved_peak():
    r = megatron.parse_log((FIXTURES / "megatron_log.txt").read_text(), load_model("175b"), 128, recompute=True,
                           global_batch=640)
    assert r.peak_reserved_gb == pytest.approx(38700.0 * 1024 ** 2 / 1e9)       # "max reserved" is MiB
    trial = TrialSpec(study="s", number=0, layout=RAN, workload=W2)
    res = result_from_dict({"status": "ok", "samples_per_second": 2.0, "peak_memory_gb": 30.0,
                            "peak_reserved_gb": 33.0}, trial, "result", "write")
    assert res.peak_memory_gb == 30.0 and res.peak_reserved_gb == 33.0 and res.extra == {"peak_reserved_gb": 33.0}
    assert result_from_dict({"status": "ok", "samples_per_second": 2.0}, trial, "r", "w").peak_reserved_gb is None
    bad = result_from_dict({"status": "ok", "samples_per_second": 2.0, "peak_reserved_gb": -1}, trial, "r", "w")
    assert bad.status == Status.FAILED and "peak_reserved_gb" in bad.message

def test_the_benchmark_worlds_report_their_own_fragmentation_as_reserved():
    world = indep_worlds.draw_world("compute-bound", "22b", 2, seed=5)
    lay = next(c for c in world.candidates if world.truth(c)[0] is not None)
    res = world.runner(seed=5).run(TrialSpec(study="s", number=0, layout=lay, workload=world.workload))
    assert res.peak_memory_gb < res.peak_reserved_gb < world.truth(lay)[1]    # fragmentation in, context out
    ext = draw_world("alloc-memory", 0, 3)
    lay = next(c for c in ext.candidates if ext.truth(c)[0] is not None)
    res = ext.runner(noise=0.02, seed=4).run(TrialSpec("s", 0, lay, ext.workload))
    assert res.peak_reserved_gb == memory_acct.peak_reserved_gb(ext.physics, lay, ext.workload)
    assert 1.05 * res.peak_memory_gb < res.peak_reserved_gb < ext.truth(lay)[1]   # alloc-memory: 6-16 % fragmentation
