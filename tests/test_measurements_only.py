"""Measurements only (issue 24, item 4): a simulated trial is the model's own prediction, so it never
corrects the model; a measurement corrects its own framework's predictions only; an OOM defers every
layout predicted to need at least as much memory on the same pipeline stage."""

from __future__ import annotations

import math

import pytest

from tuner import metrics
from tuner import study as studies
from tuner.best import best, best_for_unmeasured, corrected, history, stored_best
from tuner.correction import Observations, warm_start_records
from tuner.layout import Layout
from tuner.perfmodel import predict
from tuner.search.base import needs_more_memory
from tuner.search.guided import GuidedSearcher
from tuner.space import load_space, valid_layouts
from tuner.specs import make_workload
from tuner.store import StudyRecord, open_store
from tuner.trial import Status, TrialResult

SPACE = load_space("frontier-2023")      # a few hundred layouts of 22b: every answer in well under a second
MDS, MCORE = "megatron-deepspeed", "megatron-core"
MEASURED = Layout(tp=2, pp=4, dp=2, micro_batch=1, zero_stage=1, recompute="full")   # 16 GPUs: 2 nodes
W8 = make_workload("22b", 8)             # the node count nobody measures


@pytest.fixture
def store():
    with open_store("sqlite://") as s:
        yield s


def simulate(store, name: str, nodes: int, framework: str, budget: int = 6) -> None:
    """A simulator study run through the real driver (runner 'sim', the default)."""
    rec = studies.new_record(name, make_workload("22b", nodes, framework=framework), SPACE, budget=budget)
    studies.run(store, studies.create(store, rec))


def measure(store, name: str, nodes: int, framework: str, speed: float = 0.6, memory: float = 1.15,
            runner: str = "command") -> None:
    """A study of one stored trial that ran `speed` times as fast as predicted and peaked at `memory` times
    the predicted peak, as a measuring runner stores it (claim, then finish)."""
    w = make_workload("22b", nodes, framework=framework)
    store.create_study(StudyRecord(name, w.as_dict(), SPACE.as_record(), "random", runner))
    p = predict(MEASURED, w)
    number = store.claim_trial(name, MEASURED, p, runner)
    result = TrialResult(Status.OK, samples_per_second=speed * p.samples_per_second,
                         peak_memory_gb=memory * p.memory_gb, message="measured")
    store.finish_trial(name, number, metrics.complete(result, w, MEASURED))


def strip(rows: list[dict]) -> list[dict]:
    """Predicted rows without their evidence (what they stand on): layout, speed, interval, memory, p_fit."""
    return [{key: v for key, v in row.items() if key != "evidence"} for row in rows]


def answer(store, nodes: int = 8, framework: str = MDS, k: int = 3) -> list[dict]:
    """`best`'s predicted rows for an unmeasured node count."""
    got = best(store, make_workload("22b", nodes, framework=framework), k=k, space=SPACE)
    assert not got.trials and len(got.predicted) == k
    return strip(got.predicted)


def evidence(store, nodes: int = 8, framework: str = MDS) -> dict:
    return best(store, make_workload("22b", nodes, framework=framework), space=SPACE).predicted[0]["evidence"]


# ---- simulated trials never correct the model ------------------------------------------------------
def test_simulator_studies_leave_best_for_an_unmeasured_node_count_exactly_unchanged(store):
    cold = {fw: answer(None, framework=fw) for fw in (MDS, MCORE)}       # no store: the model alone
    simulate(store, "sim-2", 2, MDS)
    simulate(store, "sim-4-mcore", 4, MCORE)
    ran = [t for name in ("sim-2", "sim-4-mcore") for t in store.trials(name) if t.status == Status.OK]
    assert len(ran) >= 8 and {t.runner for t in ran} == {"sim"}
    for fw in (MDS, MCORE):                      # same layouts, intervals, memory, p_fit: exactly
        assert answer(store, framework=fw) == cold[fw]
    ev = evidence(store)
    assert ev["trials"] == ev["ok_trials"] == 0 and ev["node_counts"] == [] and ev["studies"] == []
    assert ev["simulated_trials"] >= 6 and "simulated trial(s) left out" in ev["note"]
    # the filter is what keeps it equal: the same trials, named by a measuring runner, would correct it
    records = store.trials("sim-2")
    for t in records:
        t.runner = "command"
    assert warm_start_records(records, W8, {"sim-2": store.get_study("sim-2")}).evidence["trials"] == 0   # its study: sim
    assert strip(best_for_unmeasured(W8, SPACE, records, k=3)) != cold[MDS]


def test_a_measurement_corrects_its_own_framework_only(store):
    cold = {fw: answer(None, framework=fw) for fw in (MDS, MCORE)}
    measure(store, "mcore-2", 2, MCORE)                 # measured on Megatron-Core
    assert answer(store, framework=MDS) == cold[MDS]    # not evidence for Megatron-DeepSpeed
    assert evidence(store)["other_framework_trials"] == 1
    hot = answer(store, framework=MCORE)
    assert hot != cold[MCORE]
    ev = evidence(store, framework=MCORE)
    assert ev["trials"] == 1 and ev["node_counts"] == [2] and ev["studies"] == ["mcore-2"]
    assert ev["mean_ratio"] == pytest.approx(0.6, rel=1e-6)
    measure(store, "mds-2", 2, MDS)                     # and one on Megatron-DeepSpeed corrects that
    assert answer(store, framework=MDS) != cold[MDS]
    lay = cold[MDS][0]["layout"]                        # the cold answer's layout, corrected
    records, history_studies = history(store, "gpt-22b", "frontier")
    hot = corrected([lay], W8, warm_start_records(records, W8, history_studies).observations)[0]
    base = corrected([lay], W8, Observations())[0]
    assert hot["mfu"] < base["mfu"] and hot["memory_gb"] > base["memory_gb"] and hot["p_fit"] < base["p_fit"]
    assert hot["log_sd"] < base["log_sd"]                # a measurement narrows the interval
    assert evidence(store, framework=MCORE)["studies"] == ["mcore-2"]


def test_a_simulator_study_beside_a_measured_one_changes_nothing(store):
    measure(store, "mds-2", 2, MDS)
    measured_only = answer(store)
    simulate(store, "sim-4", 4, MDS)
    assert answer(store) == measured_only and evidence(store)["simulated_trials"] >= 4


def test_a_local_or_registered_runner_is_a_measurement_but_sim_is_not():
    w = make_workload("22b", 8)
    for runner, used in (("sim", 0), ("local", 1), ("slurm", 1), ("my-trainer", 1)):
        p = predict(MEASURED, make_workload("22b", 2))
        rec = type("Rec", (), dict(study="s", layout=MEASURED, status=Status.OK, nodes=2, mfu=p.mfu, runner=runner,
                                   peak_memory_gb=p.memory_gb, model="gpt-22b", cluster="frontier"))()
        ev = warm_start_records([rec], w).evidence
        assert (ev["trials"], ev["simulated_trials"]) == (used, 1 - used), runner


def test_the_guided_searcher_warm_starts_from_measurements_only(store):
    simulate(store, "sim-2", 2, MDS)
    w = make_workload("22b", 8)
    records, history_studies = [t for t in store.trials("sim-2")], {"sim-2": store.get_study("sim-2")}
    cands = valid_layouts(SPACE, w)
    warm = GuidedSearcher(cands, workload=w, history=records, history_studies=history_studies)
    cold = GuidedSearcher(cands, workload=w)
    assert not warm.history.y and not warm.history.my and warm.evidence["simulated_trials"] >= 4
    assert warm.ask(3) == cold.ask(3)                   # the cold searcher's diverse first picks
    # within one simulator study the searcher learns from its own (simulated) results
    lay = warm.ask(1)[0]
    p = predict(lay, w)
    warm.tell(lay, TrialResult(Status.OK, mfu=0.5 * p.mfu, peak_memory_gb=p.memory_gb, message="simulated"))
    assert len(warm.own.y) == 1


def test_best_at_a_measured_node_count_prefers_measurements_and_marks_simulated_trials(store, tuner):
    simulate(store, "sim-2", 2, MDS)
    w = make_workload("22b", 2)
    only_sim = stored_best(store, w, k=2)
    assert only_sim and all(t.runner == "sim" for t in only_sim)
    measure(store, "slow-2", 2, MDS, speed=0.3)         # slower than every simulated trial, but it ran
    got = stored_best(store, w, k=2)
    assert [t.study for t in got] == ["slow-2"] and got[0].mfu < only_sim[-1].mfu
    # the CLI: a node count whose only trials are simulated says so, in JSON and in the table
    assert tuner("search", "--model", "22b", "--nodes", "4", "--budget", "3", "--space", "frontier-2023",
                 "--study", "s4")[0] == 0
    import json
    code, out, _ = tuner("best", "--model", "22b", "--nodes", "4", "--format", "json")
    got = json.loads(out)
    assert code == 0 and got["simulated"] is True and got["measured"] is False and got["study"] == "s4"
    code, out, _ = tuner("best", "--model", "22b", "--nodes", "4")
    assert code == 0 and "SIMULATED, not measured" in out and "correct no prediction" in out
    code, out, _ = tuner("best", "--model", "22b", "--nodes", "8", "--format", "json")
    got = json.loads(out)
    assert got["simulated"] is False and got["predicted"] is True and got["evidence"]["trials"] == 0


# ---- an OOM defers every layout predicted to need at least as much memory on the same stage ------------
def _run(searcher, w, limit_gb: float, budget: int) -> list[tuple[Layout, Status]]:
    """Drive `searcher` as the driver does (prune what the model says cannot fit) with a runner that runs
    out of memory exactly when the layout's predicted peak is at least `limit_gb`."""
    ran = []
    while len(ran) < budget:
        got = searcher.ask(1)
        if not got:
            break
        p = predict(got[0], w)
        if not p.fits:
            searcher.tell(got[0], TrialResult(Status.PRUNED, peak_memory_gb=p.memory_gb))
            continue
        status = Status.OOM if p.memory_gb >= limit_gb else Status.OK
        searcher.tell(got[0], TrialResult(status, mfu=p.mfu if status == Status.OK else None,
                                          peak_memory_gb=p.memory_gb if status == Status.OK else None))
        ran.append((got[0], status))
    return ran


def test_an_oom_defers_its_equal_memory_twin_that_the_structural_rule_misses():
    w = make_workload("llama3-8b", 1, "h100")           # Megatron-Core: selective recompute keeps no less memory
    cands = valid_layouts(load_space(), w)
    s = GuidedSearcher(cands, workload=w)
    first = s.ask(1)[0]
    p = predict(first, w)
    twins = [c for c in cands if c != first and predict(c, w).memory_stage == p.memory_stage
             and math.isclose(predict(c, w).memory_gb, p.memory_gb, rel_tol=1e-12)]
    assert twins and any(not needs_more_memory(c, first) for c in twins)     # base.py alone would propose them
    s.tell(first, TrialResult(Status.OOM, message="CUDA out of memory"))
    heavier = [s.index[c] for c in cands if c != first and predict(c, w).memory_stage == p.memory_stage
               and predict(c, w).memory_gb >= p.memory_gb]
    assert all(s.deferred[i] for i in heavier) and all(s.deferred[s.index[c]] for c in twins)
    assert not s.deferred.all()
    later = [lay for lay, _ in _run(s, w, limit_gb=math.inf, budget=10)]
    assert not set(later) & {s.candidates[i] for i in heavier}


def test_each_oom_is_predicted_smaller_than_every_earlier_oom_on_its_stage():
    """A runner that runs out of memory above a fixed predicted peak: once a layout ran out, no layout
    predicted to need as much on that stage runs while others remain, so the OOMs' predicted peaks fall."""
    w = make_workload("llama3-8b", 1, "h100")                   # the H100's allocatable 84.9 GB
    cands = valid_layouts(load_space(), w)
    fitting = sorted(predict(c, w).memory_gb for c in cands if predict(c, w).fits)
    limit = fitting[len(fitting) // 2]                  # half of what the model says fits runs out
    s = GuidedSearcher(cands, workload=w)
    ran = _run(s, w, limit, budget=25)
    ooms = [(predict(lay, w).memory_stage, predict(lay, w).memory_gb) for lay, st in ran if st == Status.OOM]
    assert len(ooms) >= 2, ran
    for j, (stage, mem) in enumerate(ooms):
        assert all(mem < m for st, m in ooms[:j] if st == stage), ooms
    assert sum(st == Status.OK for _, st in ran) >= 10
