"""The guided searcher and transfer across node counts, on worlds that differ from the model."""

from __future__ import annotations

import importlib.util
import math
import statistics
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from tuner.errors import UsageError
from tuner.layout import Layout
from tuner.perfmodel import predict
from tuner.search import SEARCHERS
from tuner.search.guided import STUDY_DEFAULTS, GuidedSearcher
from tuner.space import load_space
from tuner.specs import make_workload
from tuner.best import best_for_unmeasured
from tuner.correction import Observations, features, warm_start_records
from tuner.trial import Status, TrialResult

def _load(name: str, where: Path):
    spec = importlib.util.spec_from_file_location(name, where / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod           # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


# the model with perturbed constants: for the correction's arithmetic only (it flatters any searcher
# that uses the model, so what guided finds is measured on the independent worlds)
world = _load("perturbed_world", Path(__file__).parent / "fixtures")
iw = _load("indep_worlds", Path(__file__).parents[1] / "benchmarks")   # physics written apart from the model
sys.path.insert(0, str(Path(__file__).parents[1] / "benchmarks"))
sc = _load("stop_calibration", Path(__file__).parents[1] / "benchmarks")

SPACE = load_space("frontier-2023")   # the Frontier study's dimensions, which these GPT worlds model
# The model ranks tp2 first on 2 nodes; in this world tp2 is slow and GEMMs are less efficient.
SLOW_TP2 = {"matmul_efficiency": 0.7, "gemm_knee_gflop": 1.5, "microbatch_overhead_ms": 1.5, "slow": {"tp2": 1.25}}
SLOW_NET = {"inter_node_bandwidth_gbps": 0.5, "intra_node_bandwidth_gbps": 0.5, "latency_us": 2.0,
            "memory_reserved_gb": 3.0, "slow": {"mb4": 1.1, "z1": 1.08}}


def optimum(w, perturb):
    vals = {c: world.truth(c, w, perturb)[0] for c in SPACE.enumerate_layouts(w) if predict(c, w).fits}
    return max(v or 0.0 for v in vals.values()), vals


def drive(searcher, w, perturb, budget, seed=0):
    """The driver's loop in brief: prune what the model says cannot fit, run the rest in the world.
    Returns the layouts that ran, in order."""
    ran = []
    while len(ran) < budget:
        got = searcher.ask(1)
        if not got:
            break
        lay = got[0]
        p = predict(lay, w)
        if not p.fits:
            searcher.tell(lay, TrialResult(Status.PRUNED, peak_memory_gb=p.memory_gb))
            continue
        searcher.tell(lay, world.measure(lay, w, {**perturb, "seed": seed}))
        ran.append(lay)
    return ran


def trials_to(ran, vals, opt, within=0.97):
    return next((i + 1 for i, lay in enumerate(ran) if (vals[lay] or 0.0) >= within * opt), None)


def test_guided_is_the_default_searcher():
    assert SEARCHERS[0] == "guided"


def indep_search(seed: int, budget: int = 20, **options):
    """guided with the study defaults on the independent world of `seed` (family and workload cycle with
    it), pruning what the model says cannot fit as the driver does: (world, searcher, layouts that ran)."""
    fam, (model, nodes) = iw.FAMILIES[seed % 3], iw.WORKLOADS[(seed // 3) % 4]
    wd = iw.draw_world(fam, model, nodes, seed)
    drop = options.pop("drop_bf16_twins", False)
    cands = [c for c in wd.candidates if not (drop and bf16_twin(c))]
    s = GuidedSearcher(cands, seed=seed, workload=wd.workload, **{**STUDY_DEFAULTS, **options})
    return wd, s, run_world(s, wd, budget, seed)


def run_world(s, wd, budget: int, seed: int) -> list:
    """The benchmark's loop (benchmarks/stop_calibration.py): the layouts that ran, in order."""
    return sc.drive(s, wd, budget, seed)


def recommended_ratio(wd, s, ran) -> float:
    """True speed of the fastest measured layout / the world's fastest (over every layout that runs)."""
    measured = {lay: s.told[lay].mfu for lay in ran if s.told[lay].mfu}
    return (wd.truth(max(measured, key=measured.get))[0] or 0.0) / wd.optimum()[1]


def test_the_stop_rule_stops_on_independent_worlds_and_never_falsely():
    """Seeds 10 and 18 of the independent worlds are the two of the first 20 (three physics, four workloads) on
    which the 99 % rule stops within 30 trials (budget 30, as benchmarks/stop_calibration.py, which checks the
    stated confidence over 200 seeds drawn at run time and prints the false stops): each stops, at the stated
    confidence, on a layout within the threshold of the world's fastest. The other 18 run all 30 trials without
    stopping (since the ZeRO stage is a category of the correction, issue 30 round 19: seed 16 ends at confidence
    0.989, 1 at 0.972; they stopped before it), which cannot stop falsely; they are left to the benchmark, where
    they cost 30 trials each."""
    stops, thr, sure = [], STUDY_DEFAULTS["stop_threshold"], 1 - STUDY_DEFAULTS["stop_probability"]
    for seed in (10, 18):
        wd, s, ran = indep_search(seed, budget=30, drop_bf16_twins=True)
        stops.append((seed, s.stopped, len(ran), recommended_ratio(wd, s, ran), s.confidence))
    assert all(stopped and r * (1 + thr) >= 1.0 and c >= sure for _, stopped, _, r, c in stops), stops


def test_guided_finds_the_fastest_layout_of_independent_worlds_in_12_trials():
    """Median over 6 seeds (each family twice) of the recommended layout's speed after 12 trials."""
    ratios = [recommended_ratio(*indep_search(seed, budget=12, stop_threshold=None)) for seed in range(6)]
    assert statistics.median(ratios) >= 0.97 and min(ratios) >= 0.9, ratios


def test_same_seed_same_proposals():
    w = make_workload("22b", 2)
    cands = SPACE.enumerate_layouts(w)
    a = drive(GuidedSearcher(cands, seed=3, workload=w), w, SLOW_NET, 8)
    b = drive(GuidedSearcher(cands, seed=3, workload=w), w, SLOW_NET, 8)
    assert a == b


def test_learns_from_an_oom_at_a_layout_predicted_to_fit():
    w = make_workload("175b", 16)
    cands = SPACE.enumerate_layouts(w)
    s = GuidedSearcher(cands, workload=w)
    oom = Layout(tp=4, pp=8, dp=4, micro_batch=1, zero_stage=1, recompute="full")
    assert predict(oom, w).fits
    before = s.p_fit()
    s.tell(oom, TrialResult(Status.OOM, message="out of memory"))
    after = s.p_fit()
    mem = {c: predict(c, w).memory_gb for c in cands}
    bigger = [s.index[c] for c in cands if (c.tp, c.pp) == (4, 8) and c != oom and mem[c] >= mem[oom]]
    smaller = [s.index[c] for c in cands if mem[c] < 0.8 * mem[oom] and predict(c, w).fits]
    assert bigger and smaller
    assert all(after[i] < 0.5 < before[i] for i in bigger if before[i] > 0.5)
    # lower where it was plausible; one OOM widens the correction (issue 24 / 30: a 7-sd surprise), so a layout
    # predicted at 2-10x the GPU may rise from 1e-7 to 1e-4 -- still hopeless; one at another ZeRO stage may keep its
    # p_fit, the OOM's gradients being another optimizer's (issue 30 round 46), but never gains
    other_stage = {i for i in bigger if s.candidates[i].zero_stage != oom.zero_stage}
    assert all(after[i] < before[i] or after[i] < 0.01 or (i in other_stage and after[i] == before[i]) for i in bigger)
    assert all(after[i] <= before[i] for i in bigger if before[i] > 0.01)
    assert sum(after[i] > 0.5 for i in smaller) >= 0.8 * len(smaller)   # far-off small layouts still fit
    # a measured peak above the prediction raises the expected memory of similar layouts
    s2 = GuidedSearcher(cands, workload=w)
    ok = Layout(tp=4, pp=8, dp=4, micro_batch=1, zero_stage=0, recompute="full")
    allocated = 1.3 * mem[ok] - w.cluster.memory_reserved_gb   # a peak is allocated bytes; the prediction adds the reserve
    s2.tell(ok, TrialResult(Status.OK, mfu=0.3, peak_memory_gb=allocated))
    assert s2.mem_scale == pytest.approx(1.3)
    assert s2.p_fit()[s2.index[oom]] < before[s.index[oom]]


def bf16_twin(c: Layout) -> bool:
    """ZeRO 0 under DeepSpeed's pipeline engine: BF16_Optimizer steps as ZeRO 1 does, with one more buffer
    (tuner.perfmodel.deepspeed_states), so each such layout is its ZeRO-1 twin's exact speed. Two measured twins stay
    within the noise the stop rule assumes of each other, and it never reaches its confidence (issue 30 round 33, left
    as found): the stop-rule tests search without them, as a space with the constraint `zero_stage >= 1 or pp == 1`."""
    return c.zero_stage == 0 and c.pp > 1


def test_stops_early_with_a_stated_confidence():
    w = make_workload("22b", 8)
    cands = [c for c in SPACE.enumerate_layouts(w) if not bf16_twin(c)]
    s = GuidedSearcher(cands, workload=w, stop_threshold=0.03)     # the study's stop_probability
    ran = drive(s, w, {"noise": 0.0}, 200)          # the world is the model
    assert s.stopped and len(ran) < 80              # 53: more layouts fit a GCD's allocatable 68.7 GB than 64
    assert s.confidence is not None and s.confidence >= 1 - STUDY_DEFAULTS["stop_probability"]
    assert "confident" in s.stop_reason and "%" in s.stop_reason
    assert s.ask(1) == [] and s.remaining > 0
    # the default (what make_searcher builds) never stops early: the contract's exhaustion holds
    assert GuidedSearcher(cands, workload=w).stop_threshold is None


def _history(model, nodes_list, perturb, trials=10):
    """Stored-trial stand-ins from guided studies of the same world at other node counts."""
    recs = []
    for nodes in nodes_list:
        w = make_workload(model, nodes)
        s = GuidedSearcher(SPACE.enumerate_layouts(w), seed=nodes, workload=w)
        for lay in drive(s, w, perturb, trials, seed=nodes):
            r = s.told[lay]
            recs.append(SimpleNamespace(study=f"{model}-{nodes}", layout=lay, status=r.status, nodes=nodes,
                                        mfu=r.mfu, peak_memory_gb=r.peak_memory_gb,
                                        model=w.model.name, cluster=w.cluster.name))
    return recs


def test_warm_start_from_other_node_counts_corrects_the_model_where_nothing_was_measured():
    """Independent worlds (same physics at 2, 4 and 8 nodes): 10-trial guided studies at 2 and 4 nodes
    make the corrected prediction at 8 nodes closer to the world than the model alone on the layouts
    like those measured (same tp, pp, micro-batch, ZeRO, checkpointing), and the warm-started
    searcher's first pick is at least as fast as the cold one's, on the median of 3 seeds."""
    from tuner import metrics
    from tuner.best import corrected
    err_raw, err_cor, first_cold, first_warm = [], [], [], []
    for seed in range(3):
        fam = iw.FAMILIES[seed]
        recs = []
        for nodes in (2, 4):
            wd = iw.draw_world(fam, "22b", nodes, seed)
            s = GuidedSearcher(wd.candidates, seed=seed, workload=wd.workload)
            run_world(s, wd, 10, seed)
            recs += [SimpleNamespace(study=f"s{nodes}", layout=lay, status=r.status, nodes=nodes, mfu=r.mfu,
                                     peak_memory_gb=r.peak_memory_gb, model="gpt-22b", cluster="frontier")
                     for lay, r in s.told.items() if r.status != Status.PRUNED]
        wd = iw.draw_world(fam, "22b", 8, seed)
        w = wd.workload
        ws = warm_start_records(recs, w)
        assert ws.evidence["node_counts"] == [2, 4] and ws.evidence["ok_trials"] >= 8
        shapes = {(r.layout.tp, r.layout.pp, r.layout.micro_batch, r.layout.zero_stage,
                   r.layout.recompute) for r in recs if r.mfu}
        runs = [lay for lay in wd.candidates if wd.truth(lay)[0] and predict(lay, w).fits and
                (lay.tp, lay.pp, lay.micro_batch, lay.zero_stage, lay.recompute) in shapes]
        rows = corrected(runs, w, ws.observations)
        truth = [math.log(metrics.mfu(wd.truth(r["layout"])[0], w)) for r in rows]
        err_raw.append(statistics.mean(abs(math.log(r["raw"].mfu) - t) for r, t in zip(rows, truth)))
        err_cor.append(statistics.mean(abs(r["log_mean"] - t) for r, t in zip(rows, truth)))
        for hist, out in ((None, first_cold), (recs, first_warm)):
            ran = run_world(GuidedSearcher(wd.candidates, seed=seed, workload=w, history=hist), wd, 1, seed)
            out.append((wd.truth(ran[0])[0] or 0.0) / wd.optimum()[1])     # 0: it ran out of memory
    assert statistics.median(err_cor) < 0.8 * statistics.median(err_raw), (err_cor, err_raw)
    assert statistics.median(first_warm) >= statistics.median(first_cold), (first_warm, first_cold)


def test_best_for_unmeasured_is_predicted_and_corrected_by_other_node_counts():
    history = _history("22b", [2, 8], SLOW_NET, trials=8)
    w = make_workload("22b", 4)
    rows = best_for_unmeasured(w, SPACE, history, k=3)
    assert len(rows) == 3 and all(r["predicted"] is True for r in rows)
    ev = rows[0]["evidence"]
    assert ev["node_counts"] == [2, 8] and ev["trials"] == len(history) and sorted(ev["studies"]) == ["22b-2", "22b-8"]
    assert math.isfinite(ev["mean_residual"]) and ev["mean_residual"] < 0     # the world is slower than the model
    r = rows[0]
    assert r["mfu"] < r["raw_mfu"] and r["layout"].gpus == w.gpus
    assert rows[0]["mfu"] >= rows[1]["mfu"] >= rows[2]["mfu"]
    # over the layouts that run in the world at 4 nodes, the corrected model is closer than the model alone
    rows = best_for_unmeasured(w, SPACE, history, k=10_000)
    err = {"corrected": [], "raw": []}
    for r in rows:
        truth = world.truth(r["layout"], w, SLOW_NET)[0]
        if truth:
            err["corrected"].append(abs(math.log(r["mfu"] / truth)))
            err["raw"].append(abs(math.log(r["raw_mfu"] / truth)))
    assert len(err["raw"]) > 50 and sum(err["corrected"]) < 0.8 * sum(err["raw"])
    none = best_for_unmeasured(w, SPACE, [], k=1)
    assert none[0]["evidence"]["trials"] == 0 and none[0]["mfu"] == pytest.approx(none[0]["raw_mfu"])


def test_best_for_unmeasured_with_no_valid_layout_says_why():
    w = make_workload("22b", 7)      # 56 GPUs: no tp * pp * dp fits 48 layers, 48 heads and a batch of 640
    with pytest.raises(UsageError, match="no valid layout .* 7 node"):
        best_for_unmeasured(w, SPACE, [], k=1)


def test_uncertainty_widens_when_the_residual_model_does_not_explain_the_data():
    import numpy as np

    from tuner.gp import GP
    rng = np.random.default_rng(0)
    Z, F = rng.uniform(0, 1, (12, 11)), np.zeros((12, 8))
    calm = GP(s_c=0.3, s_w=0.15, s_g=0.12, ell=0.35).fit(Z, F, rng.normal(0, 0.02, 12)).calibrate()
    wild = GP(s_c=0.3, s_w=0.15, s_g=0.05, ell=0.35).fit(Z, F, rng.normal(0, 0.3, 12)).calibrate()
    assert calm.sd_scale == pytest.approx(1.0)             # never narrowed
    assert wild.sd_scale > 1.5
    assert wild.predict(Z[:1] + 0.5, F[:1])[1][0] > GP(s_c=0.3, s_w=0.15, s_g=0.05, ell=0.35).fit(
        Z, F, rng.normal(0, 0.3, 12)).predict(Z[:1] + 0.5, F[:1])[1][0]


def test_a_trial_stopped_early_is_an_upper_bound():
    """A stopped trial says 'no faster than this': it pulls the belief down only where it sits above."""
    w = make_workload("22b", 2)
    lay = Layout(tp=1, pp=8, dp=2, micro_batch=1)
    ft = features(lay, w)
    pred = math.exp(ft.log_pred)
    above, below = Observations(), Observations()
    above.add_result(ft, Status.STOPPED, 1.5 * pred, None, w.cluster.memory_gb)     # bound above the belief
    below.add_result(ft, Status.STOPPED, 0.5 * pred, None, w.cluster.memory_gb)     # bound below it
    below.add_result(ft, Status.FAILED, None, None, w.cluster.memory_gb)
    assert not above.y and not below.y and len(below.cy) == 1      # never an ordinary measurement
    assert len(above.time_data()[2]) == 0                          # a bound above the belief teaches nothing
    z, f, y, _ = below.time_data()
    assert y == [pytest.approx(math.log(0.5))]                     # clamped to the bound
    mu, _ = below.time_gp().predict(z, f)
    assert mu[0] < math.log(0.8)


def test_warm_start_predicts_each_trial_in_its_study_precision():
    """An fp8 study's trial that ran exactly as the model predicts (in fp8) is no evidence that a bf16
    workload runs faster than predicted: the residual is taken in the trial's own precision."""
    import dataclasses
    w16 = make_workload("llama3-8b", 1, "h100")
    w8 = dataclasses.replace(w16, precision="fp8")
    lay = Layout(tp=2, sequence_parallel=True, pp=1, dp=4, micro_batch=1, recompute="none")
    p8 = predict(lay, w8)
    rec = SimpleNamespace(study="f8", layout=lay, status=Status.OK, nodes=1, mfu=p8.mfu,
                          peak_memory_gb=p8.memory_gb, model="llama3-8b", cluster="h100")
    studies = {"f8": SimpleNamespace(global_batch=w8.global_batch, workload=w8.as_dict())}
    assert warm_start_records([rec], w16, studies).evidence["mean_ratio"] == pytest.approx(1.0)
    assert warm_start_records([rec], w16).evidence["mean_ratio"] > 1.2      # as bf16 it would look fast


def test_the_correction_sees_the_experts_gradient_sync_apart_from_the_dense_one():
    """Two linear features where there was one DP share (issue 30): the dense parameters' collectives over the
    data-parallel group and the experts' over the expert-dp group, each its share of the predicted step, so a
    residual learned on one moves the layouts heavy in it and not those heavy in the other."""
    from tuner.correction import STAGE_KEYS
    moe = make_workload("mixtral-8x7b", 8, "h100", framework="megatron-core")
    lay = Layout(tp=1, pp=1, dp=64, expert_parallel=2, expert_tensor_parallel=4, micro_batch=1, zero_stage=3)
    pr = predict(lay, moe)
    t, step, n = pr.time_breakdown, pr.step_time_s, len(STAGE_KEYS)
    f = features(lay, moe, pr).f
    assert f[n] == pytest.approx((t["dp_grad_reduce"] + t["dp_param_gather"]) / step)
    assert f[n + 1] == pytest.approx((t["dp_expert_grad_reduce"] + t["dp_expert_param_gather"]) / step)
    assert f[n + 1] > 5 * f[n] > 0
    dense = features(Layout(tp=1, pp=1, dp=32, micro_batch=1, zero_stage=3), make_workload("llama3-8b", 4, "h100"))
    assert dense.f[n] > 0 and dense.f[n + 1] == 0.0
