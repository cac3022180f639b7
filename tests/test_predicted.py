"""tuner.predicted: a study's predictions are the model's, each computed once while its workload is kept."""

from __future__ import annotations

import dataclasses

import pytest

import tuner
import tuner.search.guided as guided
from tuner import predicted
from tuner.perfmodel import predict
from tuner.space import load_space, valid_layouts
from tuner.specs import make_workload


@pytest.fixture
def calls(monkeypatch):
    """Every call that reaches the model from tuner.predicted or from the guided searcher, by its layout."""
    seen = {"kept": [], "guided": []}

    def spy(where, real):
        def counted(lay, w, *a, **k):
            seen[where].append(lay)
            return real(lay, w, *a, **k)
        return counted
    monkeypatch.setattr(predicted, "predict", spy("kept", predicted.predict))
    monkeypatch.setattr(guided, "predict", spy("guided", guided.predict))
    return seen


def small():
    w = make_workload("22b", 4)
    return w, valid_layouts(load_space("default"), w)


def test_the_answers_are_the_models_and_each_is_computed_once(calls):
    w, layouts = small()
    some = layouts[::7]
    first = predicted.predictions(some, w)
    assert first == [predict(lay, w) for lay in some]                     # every field, bit for bit
    again = predicted.predictions(list(reversed(some)), w)[::-1]
    assert all(a is b for a, b in zip(first, again)) and calls["kept"] == some     # the second time: none asked


def test_a_workload_is_known_by_every_field_and_the_oldest_goes(calls):
    w, layouts = small()
    some = layouts[:5]
    other = dataclasses.replace(w, global_batch=2 * w.global_batch)
    for x in (w, other, w):
        predicted.predictions(some, x)
    assert len(calls["kept"]) == 10                                       # two workloads, asked once each
    third = make_workload("22b", 8)
    predicted.predictions(valid_layouts(load_space("default"), third)[:5], third)   # KEEP = 2: `other` goes
    calls["kept"].clear()
    predicted.predictions(some, w)
    predicted.predictions(some, other)
    assert len(calls["kept"]) == 5
    predicted.forget()
    predicted.predictions(some, w)
    assert len(calls["kept"]) == 10


def test_a_space_over_the_limit_is_not_kept(calls, monkeypatch):
    w, layouts = small()
    monkeypatch.setattr(predicted, "MOST", 4)
    predicted.predictions(layouts[:5], w)
    predicted.predictions(layouts[:5], w)
    assert len(calls["kept"]) == 10
    predicted.predictions(layouts[:3], w)
    predicted.predictions(layouts[:3], w)
    assert len(calls["kept"]) == 13


def test_a_study_created_run_and_run_again_predicts_each_layout_once(calls, tmp_path, monkeypatch):
    """What the docs' notebook does: create (its check), optimize (the guided searcher), optimize again (a new
    searcher), a second study of the same workload: the model is asked about each layout once, the guided
    searcher never, and the study runs as before (its trials' layouts, the recommendation)."""
    monkeypatch.chdir(tmp_path)
    db = f"sqlite:///{tmp_path / 'p.db'}"
    w, layouts = small()
    study = tuner.create_study("once", storage=db, model="22b", nodes=4, budget=3)
    study.optimize()
    study.optimize(n_trials=2)
    tuner.create_study("twice", storage=db, model="22b", nodes=4, budget=2).optimize()
    assert sorted(calls["kept"]) == sorted(layouts) and calls["guided"] == []
    assert len(study.trials) == 5 and study.best() is not None
    kept = [t.layout.key() for t in study.trials]
    predicted.forget()
    monkeypatch.setattr(predicted, "MOST", 0)                            # nothing kept: the same study
    fresh = tuner.create_study("fresh", storage=db, model="22b", nodes=4, budget=3)
    fresh.optimize()
    fresh.optimize(n_trials=2)
    assert [t.layout.key() for t in fresh.trials] == kept



def test_a_cluster_or_bucket_size_change_is_a_new_workload(calls):
    """Same model, cluster name and nodes, another inter-node bandwidth or a stated bucket size: never the kept answers
    (the key is every field's value, the cluster's too)."""
    w = make_workload("22b", 4, framework="megatron-core")
    some = [lay for lay in valid_layouts(load_space("default"), w) if lay.dp > 1 and lay.zero_stage <= 1][:4]
    slow = dataclasses.replace(w, cluster=dataclasses.replace(
        w.cluster, inter_node_bandwidth_gbps=w.cluster.inter_node_bandwidth_gbps / 8))
    buckets = dataclasses.replace(w, ddp_bucket_size=1_000_000)        # Megatron-Core's default: 40 M elements
    first = predicted.predictions(some, w)
    for other in (slow, buckets):
        got = predicted.predictions(some, other)
        assert got == [predict(lay, other) for lay in some]
        assert [p.step_time_s for p in got] != [p.step_time_s for p in first]
    assert len(some) == 4 and len(calls["kept"]) == 3 * len(some)
