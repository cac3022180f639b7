"""The driver's rules that several front ends rely on: one order for the recommendation (ties too),
the live view sees running trials, the study row's budget holds for every driver, and a driver
displaced by `resume --force` writes nothing more (fencing)."""

from __future__ import annotations

import pytest

import tuner
from tuner import lease
from tuner import study as studies
from tuner.errors import TunerError
from tuner.layout import Layout
from tuner.metrics import rank_key
from tuner.report import ok_trials
from tuner.store import open_store
from tuner.trial import Status, TrialResult

SMALL = {"model": "22b", "nodes": 4}


@pytest.fixture
def db(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return f"sqlite:///{tmp_path / 'rules.db'}"


def flat(trial):
    """Every layout equally fast and equally big: the recommendation is decided by the tie rule alone."""
    return {"status": "ok", "samples_per_second": 5.0, "peak_memory_gb": 40.0}


def test_ties_name_one_layout_in_the_searcher_the_store_and_the_reports(db):
    study = tuner.create_study("tie", storage=db, runner=flat, budget=8, parallel=2, **SMALL)
    result = studies.run(study.store, study.record, runner=study.runner)
    ok = ok_trials(study.trials)
    assert len(ok) >= 4 and len({t.mfu for t in ok}) == 1            # a real tie
    fastest = studies.fastest(study.store, "tie")[0]
    assert fastest.layout == ok[0].layout == min((t.layout for t in ok), key=Layout.key)
    assert result.searcher.best_layout == fastest.layout              # what the stop line names
    w = tuner.load_study("tie", storage=db).record
    best = study.store.best(w.model, w.cluster, w.nodes)[0]
    assert best.layout == fastest.layout


def test_rank_key_orders_speed_then_memory_then_key():
    a, b = Layout(tp=4, pp=2, dp=4, micro_batch=1), Layout(tp=2, pp=4, dp=4, micro_batch=1)
    assert rank_key(0.5, 60.0, a) < rank_key(0.4, 10.0, b)           # faster first
    assert rank_key(0.5, 50.0, a) < rank_key(0.5, 60.0, b)           # then more headroom
    assert rank_key(0.5, 50.0, b) < rank_key(0.5, 50.0, a)           # then the key
    assert rank_key(0.5, 50.0, a) < rank_key(0.5, None, b)           # an unknown peak counts last


def test_the_live_view_sees_trials_while_they_run(db):
    seen = []
    study = tuner.create_study("live", storage=db, runner=flat, budget=4, **SMALL)
    study.optimize(callbacks=[lambda p: seen.append(([n for n, _ in p.running_trials],
                                                     [t.number for t in p.finished]))])
    ran = [t.number for t in study.trials if t.status == Status.OK]     # a trial the driver prunes never runs
    assert len(ran) == 4
    for number in ran:
        assert any(number in running and number not in done for running, done in seen), number


def test_the_budget_is_the_study_rows_not_the_drivers_copy(db):
    """`resume --budget` from another shell lowers the budget of a running driver's study: it stops there."""
    store = open_store(db)

    def lower_it(trial):
        if trial.number == 1:
            store.update_study_settings("cut", {"budget": 3})
        return flat(trial)
    study = tuner.create_study("cut", storage=store, runner=lower_it, runner_name="cut", budget=20, **SMALL)
    outcome = study.optimize()
    ran = [t for t in study.trials if t.status not in (Status.PRUNED, Status.INTERRUPTED)]
    assert len(ran) == 3 and outcome.ran == 3


def test_a_displaced_driver_writes_nothing_more(db):
    """While trial 2 runs, another driver takes the study over (`resume --force`): this driver's result
    for trial 2 is refused, it claims nothing more, and its heartbeat does not bring its lease back."""
    store = open_store(db)

    def taken_over(trial):
        if trial.number == 2:
            store.modify_study_settings("fenced", lambda st: lease.take(st, "fenced", "force"))
        return flat(trial)
    study = tuner.create_study("fenced", storage=store, runner=taken_over, runner_name="t", budget=6, **SMALL)
    with pytest.raises(TunerError, match="taken over by another driver"):
        study.optimize()
    trials = {t.number: t.status for t in study.trials}
    assert trials == {1: Status.OK, 2: Status.RUNNING}        # trial 2 is the new driver's to re-run
    settings = study.record.settings
    assert lease.epoch(settings) == 1
    assert lease.refresh(settings, 0) is None                 # the old epoch's heartbeat adds nothing
    assert lease.refresh(settings, 1) is not None


def test_store_claims_are_fenced_by_epoch(db):
    store = open_store(db)
    tuner.create_study("e", storage=store, budget=5, **SMALL)
    lay = Layout(tp=2, pp=4, dp=4, micro_batch=1)
    n = store.claim_trial("e", lay, None, "sim", epoch=0)
    store.modify_study_settings("e", lambda st: {"epoch": 1})
    from tuner.errors import Displaced
    with pytest.raises(Displaced):
        store.finish_trial("e", n, TrialResult(Status.OK, samples_per_second=1.0), epoch=0)
    with pytest.raises(Displaced):
        store.claim_trial("e", Layout(tp=4, pp=2, dp=4, micro_batch=1), None, "sim", epoch=0)
    store.finish_trial("e", n, TrialResult(Status.OK, samples_per_second=1.0), epoch=1)
    assert store.trials("e")[0].status == Status.OK
