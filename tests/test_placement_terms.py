"""benchmarks/placement_terms.py (issue 24): the split of the GEMM term and the FSDP break-even read the model as it is."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

from tuner.cluster_spec import load_cluster
from tuner.perfmodel import predict
from tuner.space import load_space, valid_layouts


def _terms():
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))   # it imports h100_gap by name
    return importlib.import_module("placement_terms")


def _layouts(pt, w):
    """The recipe and Megatron-FSDP tp8 dp8 mb2 (no recompute), from the space plan enumerates."""
    every = valid_layouts(load_space("default"), w)
    recipe = next(lay for lay in every if pt.is_recipe(lay))
    fsdp = next(lay for lay in every if lay.tp == 8 and lay.pp == 1 and lay.context_parallel == 1
                and lay.micro_batch == 2 and lay.zero_stage == 3 and lay.recompute == "none")
    return recipe, fsdp


def test_the_knee_free_gemm_term_is_smaller_and_the_model_is_put_back():
    pt = _terms()
    w = pt.workload()
    recipe, fsdp = _layouts(pt, w)
    flat = pt.knee_free(w, [recipe, fsdp])
    for lay in (recipe, fsdp):
        assert 0.0 < flat[lay] < predict(lay, w).time_breakdown["gemm"]
    # twice the tokens per GEMM and half the calls: the knee costs the recipe more than Megatron-FSDP mb2
    knee_recipe = predict(recipe, w).time_breakdown["gemm"] - flat[recipe]
    knee_fsdp = predict(fsdp, w).time_breakdown["gemm"] - flat[fsdp]
    assert knee_recipe > 1.5 * knee_fsdp
    assert load_cluster("h100").gemm_knee_gflop == 60.0


def test_fsdp_traffic_beside_compute_is_at_least_what_shows():
    pt = _terms()
    w = pt.workload()
    _, fsdp = _layouts(pt, w)
    pr = predict(fsdp, w)
    shown = pr.time_breakdown["dp_grad_reduce"] + pr.time_breakdown["dp_param_gather"]
    busy = pt.fsdp_busy(w, pr)
    assert busy > shown > 0.0
    assert busy < pr.step_time_s          # hidden under a step's compute, as the model has it


def test_grouped_prints_identical_predictions_once():
    pt = _terms()
    w = pt.workload()
    recipe, fsdp = _layouts(pt, w)
    a, b = predict(recipe, w), predict(fsdp, w)
    groups = pt.grouped([a, b, a])
    assert [ranks for ranks, _ in groups] == [[1, 3], [2]]
