"""Invariants of the performance model over whole plans (issue 25, item 5): every valid layout of the
default space for several workloads and frameworks, dense and mixture-of-experts. Recomputing more is never
faster; exposing a collective (a framework without its overlaps) never speeds a layout up; a TP group
moved out of the NVLink domain (the same layout on nodes of half the GPUs) is never cheaper."""

from __future__ import annotations

import dataclasses
import functools

import pytest

from tuner import frameworks
from tuner.layout import RECOMPUTE, recomputes_at_least
from tuner.perfmodel import predict
from tuner.space import load_space, valid_layouts
from tuner.specs import make_workload

CASES = [("deepseek-v3", "h100", 128, None, "megatron-core"), ("llama3-70b", "h100", 8, 128, "megatron-core"),
         ("gpt-175b", "frontier", 128, None, "megatron-deepspeed"), ("llama3-70b", "h100", 8, 128, "torchtitan"),
         ("qwen3-30b-a3b", "h100", 2, None, "torchtitan")]


@functools.lru_cache(maxsize=None)
def plan(i):
    model, cluster, nodes, gb, fw = CASES[i]
    w = make_workload(model, nodes, cluster, gb, framework=fw)
    return w, {lay: predict(lay, w) for lay in valid_layouts(load_space(), w)}


@pytest.mark.parametrize("i", range(len(CASES)), ids=[f"{c[0]}-{c[4]}" for c in CASES])
def test_recomputing_more_is_never_faster(i):
    _, preds = plan(i)
    pairs = 0
    for lay, p in preds.items():
        for rc in (r for r in RECOMPUTE if r != lay.recompute and recomputes_at_least(r, lay.recompute)):
            more = preds.get(dataclasses.replace(lay, recompute=rc))
            if more is not None:
                pairs += 1
                assert more.step_time_s >= p.step_time_s * (1 - 1e-12), (lay.key(), rc)
    assert pairs > 100


@pytest.mark.parametrize("i", [0, 1], ids=["deepseek-v3", "llama3-70b"])
def test_exposing_a_collective_never_speeds_a_layout_up(i, monkeypatch):
    w, preds = plan(i)
    bare = dataclasses.replace(frameworks.FRAMEWORKS["megatron-core"], overlaps=frozenset())
    monkeypatch.setitem(frameworks.FRAMEWORKS, "megatron-core", bare)
    faster = [lay.key() for lay, p in list(preds.items())[::3]
              if predict(lay, w).step_time_s < p.step_time_s * (1 - 1e-12)]
    assert not faster


@pytest.mark.parametrize("i", [0, 1, 2], ids=["deepseek-v3", "llama3-70b", "gpt-175b"])
def test_leaving_the_nvlink_domain_is_never_cheaper(i):
    w, preds = plan(i)
    half = dataclasses.replace(w.cluster, gpus_per_node=w.cluster.gpus_per_node // 2,     # the same NICs per GPU
                               inter_node_bandwidth_gbps=w.cluster.inter_node_bandwidth_gbps / 2)
    w2 = dataclasses.replace(w, cluster=half, nodes=2 * w.nodes)
    crossed = [lay for lay in list(preds)[::3] if lay.tp > half.gpus_per_node]
    assert crossed
    cheaper = [lay.key() for lay in crossed if predict(lay, w2).step_time_s < preds[lay].step_time_s * (1 - 1e-12)]
    assert not cheaper
