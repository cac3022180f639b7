"""The analytic performance and memory model: hand-computed formulas, properties, study layouts."""

from __future__ import annotations

import dataclasses
import functools
import math

from tuner.frameworks import of as framework_of
from tuner.perfmodel import PRUNE_BELOW

import pytest
from hypothesis import given, settings, strategies as st

from tuner.layout import Layout, micro_batches_per_pipeline, why_invalid
from tuner.perfmodel import (Prediction, comm, compute, expected_speed, keeps_headroom, memory, predict, rank, risk,
                             shape_of)
from tuner.perfmodel.compute import Shape
from tuner.perfmodel.flops import megatron_flops
from tuner.space import load_space
from tuner.specs import load_cluster, load_model, make_workload

FRONTIER = load_cluster("frontier")
A100 = load_cluster("a100")


def lay(tp, pp, dp, mb=1, z=1, ac=True):
    return Layout(tp=tp, pp=pp, dp=dp, micro_batch=mb, zero_stage=z, recompute="full" if ac else "none")


# ------------------------------------------------------------------------ hand-computed formulas
@pytest.mark.parametrize("zero, dp, expected", [
    (0, 8, 16.0),            # 2 + 2 + 12
    (1, 2, 4.0 + 12 / 2),    # ZeRO-1: 4 + 12/d
    (2, 4, 2.0 + 14 / 4),    # ZeRO-2: 2 + 14/d
    (3, 8, 16 / 8),          # ZeRO-3: 16/d
    (3, 1, 16.0),
])
def test_bytes_per_param_per_zero_stage(zero, dp, expected):
    assert sum(memory.model_state_bytes_per_param(zero, dp).values()) == pytest.approx(expected)


def test_activation_bytes_per_layer():
    m = load_model("gpt-175b")     # s 2048, h 12288, a 96
    sbh = 2048 * 12288
    # s*b*h*(10 + 24/t + 5*a*s/(h*t)) with t = 4: 10 + 6 + 5*96*2048/(12288*4) = 16 + 20
    assert memory.activation_bytes_per_layer(m, Shape(1, 4), flash_attention=False) == pytest.approx(36 * sbh)
    assert memory.activation_bytes_per_layer(m, Shape(1, 4), flash_attention=True) == pytest.approx(16 * sbh)
    assert memory.activation_bytes_per_layer(m, Shape(2, 4), flash_attention=True) == pytest.approx(32 * sbh)
    assert memory.checkpoint_bytes_per_layer(m, Shape(1)) == 2 * sbh
    # sequence parallelism: s*b*h*34/t (Korthikanti et al.), its checkpoint split by t as well
    assert memory.activation_bytes_per_layer(m, Shape(1, 4, sp=True), True) == pytest.approx(34 / 4 * sbh)
    assert memory.checkpoint_bytes_per_layer(m, Shape(1, 4, sp=True)) == pytest.approx(2 * sbh / 4)
    # context parallelism keeps s/cp of everything; selective recompute drops the scores (no FlashAttention)
    assert memory.activation_bytes_per_layer(m, Shape(1, 4, c=2), True) == pytest.approx(16 * sbh / 2)
    assert memory.activation_bytes_per_layer(m, Shape(1, 4, recompute="selective"), False) == pytest.approx(16 * sbh)


def test_interleaved_schedule_keeps_more_in_flight():
    # Megatron's warm-up on rank 0: 2(p - 1) + (v - 1)p + 1 = p*v + p - 1 virtual-stage passes
    assert memory.in_flight(0, 4, 64, vp=2) == 2 * 3 + 4 + 1 == 4 * 2 + 4 - 1
    assert memory.in_flight(3, 4, 64, vp=2) == 4 + 1
    assert memory.in_flight(0, 4, 2, vp=2) == 4              # never more than m*v passes
    m = load_model("gpt-175b")
    plain = Layout(tp=8, pp=8, dp=1, micro_batch=1, recompute="none")
    inter = Layout(tp=8, pp=8, virtual_pipeline=4, dp=1, micro_batch=1, recompute="none")
    a1 = memory.stage_activation_bytes(m, plain, 0, 64, Shape(1, 8), True)
    a4 = memory.stage_activation_bytes(m, inter, 0, 64, Shape(1, 8), True)
    # Narayanan et al.: 1 + (p - 1)/(p v) times the layers' activations (boundary tensors aside)
    layers = 8 * 12 * memory.activation_bytes_per_layer(m, Shape(1, 8), True)     # 8 in flight x 12 layers
    assert a4 - a1 == pytest.approx(layers * (8 - 1) / (8 * 4) + (39 - 8) * 2 * 2048 * 12288, rel=1e-9)


def test_in_flight_1f1b_rule():
    assert memory.in_flight(0, 16, 320) == 16
    assert memory.in_flight(15, 16, 320) == 1
    assert memory.in_flight(0, 16, 4) == 4
    assert memory.in_flight(0, 1, 10) == 1


def test_stage_activation_bytes_hand_computed():
    m = load_model("gpt-175b")
    sbh = 2048 * 12288
    layout = lay(4, 16, 2)
    # stage 0: 16 in flight x (6 layer checkpoints + 1 output buffer) x 2sbh + one layer's working set
    # (16 sbh, of which its own 2 sbh checkpoint is already counted)
    expected = 16 * 7 * 2 * sbh + (16 - 2) * sbh
    assert memory.stage_activation_bytes(m, layout, 0, 320, Shape(1, 4, recompute="full"), True) == pytest.approx(expected)
    no_ckpt = lay(4, 16, 2, ac=False)
    assert memory.stage_activation_bytes(m, no_ckpt, 15, 320, Shape(1, 4), True) == pytest.approx(6 * 16 * sbh + 2 * sbh)


def test_megatron_core_frees_each_pass_output_once_sent():
    """Megatron-Core's deallocate_pipeline_outputs (schedules.deallocate_output_tensor): a pass keeps its layers'
    activations and nothing for its output; the stacks that keep the output (DeepSpeed's pipeline engine,
    PyTorch's pipelining) keep one checkpoint-sized tensor per pass in flight."""
    m = load_model("gpt-175b")
    sbh = 2048 * 12288
    layout = lay(4, 16, 2)
    kept = memory.stage_activation_bytes(m, layout, 0, 320, Shape(1, 4, recompute="full"), True)
    freed = memory.stage_activation_bytes(m, layout, 0, 320, Shape(1, 4, recompute="full"), True, outputs_freed=True)
    assert kept - freed == pytest.approx(16 * 2 * sbh)
    assert framework_of(make_workload(m, 16, load_cluster("h100"), 64, framework="megatron-core")).frees_pipeline_outputs
    assert not framework_of(make_workload(m, 16, load_cluster("h100"), 64, framework="torchtitan")).frees_pipeline_outputs


def test_logits_and_params():
    m = load_model("gpt-175b")
    assert memory.logits_bytes(m, 1, 4) == pytest.approx(4 * 2048 * 50688 / 4)
    h = 12288
    assert memory.layer_params(m, 4) == pytest.approx((12 * h * h + 7 * h) / 4 + 6 * h)
    middle = memory.stage_params(m, Layout(tp=4, pp=16, dp=1, micro_batch=1), 5)
    assert middle == pytest.approx(6 * memory.layer_params(m, 4))
    assert middle / 1e9 == pytest.approx(2.72, abs=0.01)          # the authors' log: 2.72 B per GCD
    first = memory.stage_params(m, Layout(tp=4, pp=16, dp=1, micro_batch=1), 0)
    assert first - middle == pytest.approx(50688 * h / 4 + 2048 * h)
    whole = memory.stage_params(m, Layout(tp=1, pp=1, dp=1, micro_batch=1), 0)
    assert whole == pytest.approx(m.num_parameters, rel=0.01)


def test_ring_allreduce_time():
    c = dataclasses.replace(FRONTIER, network_efficiency=0.8, latency_us=10.0)
    # 2(g-1)/g * n / bw + 2(g-1) * alpha: 2*3/4 * 1e9 / 80e9 + 6 * 1e-5
    assert comm.allreduce_time(1e9, 4, 100.0, c) == pytest.approx(0.01875 + 6e-5)
    assert comm.reduce_scatter_time(1e9, 4, 100.0, c) == pytest.approx((0.01875 + 6e-5) / 2)
    assert comm.allreduce_time(1e9, 1, 100.0, c) == 0.0
    assert comm.p2p_time(1e9, 100.0, c) == pytest.approx(1e9 / 80e9 + 1e-5)


def test_group_bandwidth_follows_rank_order_and_links():
    assert comm.group_bandwidth(FRONTIER, 2, 1) == 200.0      # one MI250X
    assert comm.group_bandwidth(FRONTIER, 4, 1) == 100.0
    assert comm.group_bandwidth(FRONTIER, 8, 1) == 50.0
    # TP=16 leaves the node: 8 ranks per node share the node's 100 GB/s, and the ring still crosses the
    # slowest in-node link (50)
    assert comm.group_bandwidth(FRONTIER, 16, 1) == 50.0
    assert comm.crosses_nodes(FRONTIER, 16, 1) and not comm.crosses_nodes(FRONTIER, 8, 1)
    # DP with tp = 8: one rank per node, 8 groups share the injection bandwidth
    assert comm.group_bandwidth(FRONTIER, 4, 8) == pytest.approx(100.0 / 8)
    # DP with tp = 2 across nodes: 4 ranks per node -> 100 * 4/8
    assert comm.group_bandwidth(FRONTIER, 16, 2) == pytest.approx(50.0)
    assert comm.group_bandwidth(A100, 8, 1) == 300.0
    assert comm.group_bandwidth(A100, 6, 8) == pytest.approx(200.0 / 8)
    assert comm.pipeline_p2p_bandwidth(FRONTIER, 4, 2, 16) == pytest.approx(100.0 / 8)


def test_gemm_efficiency_curve():
    c = FRONTIER
    assert compute.gemm_efficiency(c, c.gemm_knee_gflop) == pytest.approx(c.matmul_efficiency / 2)
    assert compute.gemm_efficiency(c, 1e6) == pytest.approx(c.matmul_efficiency, rel=1e-3)
    assert compute.gemm_efficiency(c, 1.0) < compute.gemm_efficiency(c, 100.0)
    m = load_model("gpt-175b")
    assert sum(compute.layer_gemm_flops(m, 1, 4)) == pytest.approx(2 * 2048 * 12 * 12288 ** 2 / 4)
    assert compute.attention_flops(m, 1, 4) == pytest.approx(4 * 2048 ** 2 * 12288 / 4)


def test_bubble_fraction_is_p_minus_1_over_m():
    w = make_workload("gpt-175b", 16, FRONTIER, 640)
    pr = predict(lay(4, 16, 2), w)
    tb = pr.time_breakdown
    per_mb = sum(tb[k] for k in ("gemm", "attention", "elementwise", "tp_comm", "p2p", "microbatch_overhead"))
    assert tb["bubble"] / per_mb == pytest.approx(15 / 320)
    assert sum(tb.values()) == pytest.approx(pr.step_time_s)


def test_tflops_mfu_and_memory_are_consistent():
    w = make_workload("gpt-22b", 2, FRONTIER, 640)
    pr = predict(lay(1, 8, 2), w)
    assert isinstance(pr, Prediction)
    assert pr.tflops_per_gpu * pr.step_time_s * 16 * 1e12 == pytest.approx(megatron_flops(w.model, 640, True))
    assert pr.mfu == pytest.approx(pr.tflops_per_gpu * 3 / 4 / FRONTIER.peak_tflops)
    assert pr.peak_fraction == pytest.approx(pr.tflops_per_gpu / FRONTIER.peak_tflops)
    assert sum(pr.memory_breakdown.values()) == pytest.approx(pr.memory_gb)
    assert pr.samples_per_second == pytest.approx(640 / pr.step_time_s)
    d = pr.as_dict()
    assert d["breakdown"]["time_s"] and d["breakdown"]["memory_gb"]


# ------------------------------------------------------------------------ the study and its findings
STUDY = [("gpt-22b", 2, 640, lay(1, 8, 2), 73.5), ("gpt-175b", 16, 640, lay(4, 16, 2), 69.2),
         ("gpt-1t", 128, 1024, lay(4, 128, 2), 61.2)]


@pytest.mark.parametrize("model, nodes, gb, layout, study", STUDY)
def test_study_layouts_fit_and_are_close(model, nodes, gb, layout, study):
    w = make_workload(model, nodes, FRONTIER, gb)
    assert why_invalid(layout, w) is None
    pr = predict(layout, w)
    assert pr.fits and pr.reason == ""
    assert pr.tflops_per_gpu == pytest.approx(study, rel=0.05)


def test_175b_stage0_memory_close_to_measured():
    pr = predict(lay(4, 16, 2), make_workload("gpt-175b", 16, FRONTIER, 640))
    assert pr.memory_stage == 0 and pr.as_dict()["memory_stage"] == 0
    assert pr.memory_gb == pytest.approx(33.9, rel=0.15)


def test_tp_across_nodes_is_slower_than_tp_in_node():
    for model in ("gpt-1.4b", "gpt-22b", "gpt-175b"):
        for cluster in (FRONTIER, A100):
            w = make_workload(model, 2, cluster, 64)
            tp16 = predict(lay(16, 1, 1), w)
            tp8 = predict(lay(8, 1, 2), w)
            assert tp16.step_time_s > tp8.step_time_s, (model, cluster.name)


def test_tp2_is_the_fastest_tp_group_on_frontier():
    w = make_workload("gpt-175b", 32, FRONTIER, 64 * 8)
    times = {t: predict(lay(t, 16, 256 // (16 * t)), make_workload("gpt-175b", 32, FRONTIER, 64 * 256 // (16 * t)))
             for t in (2, 4, 8, 16)}
    assert max(times, key=lambda t: times[t].tflops_per_gpu) == 2
    assert w.gpus == 256
    # the same physics on a flat NVSwitch-like node removes TP=2's edge in bandwidth
    flat = dataclasses.replace(FRONTIER, group_bandwidth_gbps=None, intra_node_bandwidth_gbps=200.0)
    assert comm.group_bandwidth(flat, 2, 1) == comm.group_bandwidth(flat, 8, 1)


def test_bubbles_shrink_with_more_micro_batches():
    shares = []
    for gb in (32, 64, 128, 640):
        pr = predict(lay(4, 16, 2), make_workload("gpt-175b", 16, FRONTIER, gb))
        shares.append(pr.time_breakdown["bubble"] / pr.step_time_s)
    assert shares == sorted(shares, reverse=True)


def test_an_interleaved_pipeline_pays_the_micro_batch_overhead_once_per_model_chunk():
    """Megatron's interleaved schedule runs micro-batches x chunks forward and backward steps, each dispatched on its
    own (schedules.py at d98e8a64dd line 949): vp chunks pay vp times the fixed cost of one micro-batch's step."""
    w = make_workload("gpt-175b", 16, FRONTIER, framework="megatron-core")
    cost = {v: predict(Layout(tp=4, sequence_parallel=True, pp=16, virtual_pipeline=v, dp=2, micro_batch=1),
                       w).time_breakdown["microbatch_overhead"] for v in (1, 3, 6)}
    m = micro_batches_per_pipeline(Layout(tp=4, pp=16, dp=2, micro_batch=1), w.global_batch)
    assert cost[1] == pytest.approx(m * FRONTIER.microbatch_overhead_ms * 1e-3)
    assert cost[3] == pytest.approx(3 * cost[1]) and cost[6] == pytest.approx(6 * cost[1])


def test_weak_scaling_175b():
    base = predict(lay(4, 16, 2), make_workload("gpt-175b", 16, FRONTIER, 640)).tflops_per_gpu
    big = predict(lay(4, 16, 16), make_workload("gpt-175b", 128, FRONTIER, 320 * 16)).tflops_per_gpu
    assert big / base >= 0.95


def test_not_fitting_has_a_reason():
    pr = predict(lay(1, 1, 16), make_workload("gpt-175b", 2, FRONTIER, 64))
    assert not pr.fits and "GB" in pr.reason and "stage 0" in pr.reason


def test_other_clusters_predict_from_their_files():
    for name in ("a100", "h100", "local"):
        c = load_cluster(name)
        w = make_workload("tiny" if name == "local" else "gpt-1.4b", 1, c, 16 if name == "local" else 512)
        pr = predict(lay(1, 1, c.gpus_per_node), w)
        assert pr.step_time_s > 0 and 0 < pr.mfu < 1 and pr.fits


def test_rank_weighs_speed_by_the_chance_of_fitting():
    """plan's order: layouts not ruled out by expected speed (samples/s x p_fit), then the ruled-out ones; a
    layout that probably fits is not buried under slower ones that surely fit (issue 24)."""
    w = make_workload("gpt-175b", 16, FRONTIER, 640)
    preds = rank(load_space().enumerate_layouts(w), w)
    ruled_out = [not p.fits for p in preds]
    assert ruled_out == sorted(ruled_out) and any(ruled_out)
    expected = [expected_speed(p) for p in preds if p.fits]
    assert expected == sorted(expected, reverse=True)
    tight = next(i for i, p in enumerate(preds) if p.fits and not keeps_headroom(p, w))
    slower_sure = [p for p in preds[tight + 1:] if keeps_headroom(p, w)
                   and p.samples_per_second < preds[tight].samples_per_second]
    assert slower_sure, "a tight layout must rank above surely-fitting slower ones"
    assert risk(preds[tight], w).startswith(f"stage {preds[tight].memory_stage}: ")
    assert all(risk(p, w) == "" for p in preds if keeps_headroom(p, w))


# ------------------------------------------------------------------------ properties
WORKLOADS = [("tiny", "local", 1, 16), ("small", "frontier", 1, 32), ("gpt-1.4b", "frontier", 4, 320),
             ("gpt-22b", "a100", 4, 512), ("gpt-175b", "frontier", 16, 640), ("gpt-175b", "h100", 32, 1536)]


@functools.lru_cache(maxsize=None)
def _space(i):
    model, cluster, nodes, gb = WORKLOADS[i]
    w = make_workload(model, nodes, cluster, gb)
    return w, load_space().enumerate_layouts(w)


layouts_st = st.integers(0, len(WORKLOADS) - 1).flatmap(
    lambda i: st.sampled_from(_space(i)[1]).map(lambda lay_: (i, lay_)))


def _variant(layout, **kw):
    return Layout(**{**layout.as_dict(), **kw})


@settings(max_examples=150, deadline=None)
@given(layouts_st)
def test_prediction_is_sane(case):
    i, layout = case
    w = _space(i)[0]
    pr = predict(layout, w)
    assert math.isfinite(pr.step_time_s) and pr.step_time_s > 0
    assert 0 < pr.mfu < 1 and pr.tflops_per_gpu > 0
    assert pr.memory_gb > 0 and pr.fits == (pr.p_fit >= PRUNE_BELOW) and 0 <= pr.p_fit <= 1
    assert (pr.p_fit >= 0.5) == (pr.memory_gb <= w.cluster.memory_gb)
    assert all(v >= 0 for v in pr.time_breakdown.values())


@settings(max_examples=150, deadline=None)
@given(layouts_st)
def test_memory_grows_with_micro_batch(case):
    i, layout = case
    w = _space(i)[0]
    bigger = _variant(layout, micro_batch=layout.micro_batch * 2)
    if why_invalid(bigger, w):
        return
    assert predict(bigger, w).memory_gb >= predict(layout, w).memory_gb - 1e-9


@settings(max_examples=150, deadline=None)
@given(layouts_st)
def test_zero_stages_order_memory(case):
    i, layout = case
    w = _space(i)[0]
    mems = []
    for z in (0, 1, 2, 3):
        v = _variant(layout, zero_stage=z)
        if why_invalid(v, w) is None:
            mems.append(round(predict(v, w).memory_gb, 9))    # ZeRO 1 and 2 can peak in the same step phase (2 + 20/d)
    assert mems == sorted(mems, reverse=True)


@settings(max_examples=150, deadline=None)
@given(layouts_st)
def test_checkpointing_lowers_activation_memory(case):
    i, layout = case
    w = _space(i)[0]
    m = micro_batches_per_pipeline(layout, w.global_batch)
    on, off = _variant(layout, recompute="full"), _variant(layout, recompute="none")
    for stage in (0, layout.pp - 1):
        a_on = memory.stage_activation_bytes(w.model, on, stage, m, shape_of(on, w), w.cluster.flash_attention)
        a_off = memory.stage_activation_bytes(w.model, off, stage, m, shape_of(off, w), w.cluster.flash_attention)
        assert a_on <= a_off + 1e-6


def test_each_modern_dimension_has_its_term_in_the_breakdown():
    """Llama 3 70B on 64 H100 nodes: each dimension moves the term it should, by the amount it should."""
    w = make_workload("llama3-70b", 64, "h100")
    base = Layout(tp=4, pp=4, dp=32, micro_batch=1, recompute="none")
    p0 = predict(base, w)
    # interleaving: the bubble is (p - 1)/v stage times, the p2p v times as many messages
    inter = predict(dataclasses.replace(base, virtual_pipeline=5), w)
    stage = sum(v for k, v in p0.time_breakdown.items() if k not in (
        "bubble", "dp_grad_reduce", "dp_param_gather", "embedding_sync", "optimizer", "step_overhead"))
    m = micro_batches_per_pipeline(base, w.global_batch)
    assert p0.time_breakdown["bubble"] == pytest.approx(3 * stage / m)
    assert inter.time_breakdown["bubble"] < p0.time_breakdown["bubble"] / 4.5
    assert inter.memory_breakdown["activations"] > p0.memory_breakdown["activations"]
    # sequence parallelism: same TP traffic (hidden under the GEMMs on h100), less element-wise work and memory
    no_overlap = dataclasses.replace(w, framework="megatron-deepspeed")       # overlaps nothing
    sp = dataclasses.replace(base, sequence_parallel=True)
    assert predict(sp, no_overlap).time_breakdown["tp_comm"] == pytest.approx(predict(base, no_overlap).time_breakdown["tp_comm"])
    assert predict(sp, w).time_breakdown["tp_comm"] < predict(base, w).time_breakdown["tp_comm"]
    assert predict(sp, w).time_breakdown["elementwise"] < p0.time_breakdown["elementwise"]
    assert predict(sp, w).memory_breakdown["activations"] < p0.memory_breakdown["activations"]
    # context parallelism: half the sequence per rank, a ring term, half the activations
    cp_lay = dataclasses.replace(base, context_parallel=2, dp=16)
    cp = predict(cp_lay, w)
    assert "cp_comm" in cp.time_breakdown and "cp_comm" not in p0.time_breakdown
    # the ring (K and V round the CP group, 3 passes without recompute) is real traffic, shown only where it
    # outlasts the attention it overlaps: zero here (NVLink, 8K sequence), positive on a slow link
    m70 = w.model
    kv = 2 * 2.0 * m70.seq_length * 0.5 * m70.kv_size / 4
    ring = comm.cp_ring_time(w.cluster, 4, 2, kv)
    # (what hides costs the attention beside it NCCL's p2p SMs: comm.sm_share)
    m_cp = micro_batches_per_pipeline(cp_lay, w.global_batch)
    assert ring > 0 and cp.time_breakdown["cp_comm"] == pytest.approx(
        80 / 4 * m_cp * comm.sm_share(w.cluster, 3 * ring, comm.NCCL_P2P_CTAS))
    slow_link = dataclasses.replace(w, cluster=dataclasses.replace(
        w.cluster, intra_node_bandwidth_gbps=0.05, latency_us=500.0))
    assert predict(cp_lay, slow_link).time_breakdown["cp_comm"] > 0
    assert cp.memory_breakdown["activations"] == pytest.approx(p0.memory_breakdown["activations"] / 2, rel=0.02)
    # selective recompute: one more attention forward, nothing else
    sel = predict(dataclasses.replace(base, recompute="selective"), w)
    assert sel.time_breakdown["attention"] > p0.time_breakdown["attention"]
    assert sel.time_breakdown["gemm"] == pytest.approx(p0.time_breakdown["gemm"])
    # FP8: GEMMs at up to twice the rate, an FP8 weight copy, MFU still against the bf16 peak
    f8 = predict(base, dataclasses.replace(w, precision="fp8"))
    assert p0.time_breakdown["gemm"] / 2 < f8.time_breakdown["gemm"] < p0.time_breakdown["gemm"] * 0.75
    assert f8.memory_breakdown["fp8_weights"] > 0 and "fp8_weights" not in p0.memory_breakdown
    assert f8.mfu == pytest.approx(p0.mfu * p0.step_time_s / f8.step_time_s)


def test_nvfp4_keeps_four_bit_copies_of_weights_and_saved_inputs():
    """TransformerEngine's NVFP4 (module/linear.py, tensor/nvfp4_tensor.py @ d0067d0da): the cached weight copy is
    row- and column-wise, 4 bits plus an E4M3 scale per 16 each (1.125 bytes per parameter, FP8's 1); a saved GEMM
    input is its column-wise copy alone (0.5625 bytes per element, FP8's 1)."""
    m = load_model("llama3-70b")
    sbh = m.seq_length * m.hidden_size
    f8 = memory.activation_bytes_per_layer(m, Shape(1, 1, fp8="fp8"), True)
    f4 = memory.activation_bytes_per_layer(m, Shape(1, 1, fp8="fp4"), True)
    assert f8 - f4 == pytest.approx((2 + 1 + m.ffn_hidden_size / m.hidden_size) * (1 - 0.5625) * sbh)
    w = make_workload(m, 16, load_cluster("gb200"), 256, precision="nvfp4", framework="megatron-core")
    lay = Layout(tp=1, pp=4, virtual_pipeline=5, dp=16, micro_batch=1, recompute="none")
    first = memory.stage_memory(lay, w, 0, 16)
    emb = memory.outside_layer_params(m, lay, 0) * 2 / 1e9           # stage 0: the word embedding stays bf16, uncopied
    assert emb > 0 and first["fp8_weights"] == pytest.approx((first["weights"] - emb) / 2 * 1.125)
    middle = memory.stage_memory(lay, w, 1, 16)
    assert middle["fp8_weights"] == pytest.approx(middle["weights"] / 2 * 1.125)   # no --fp4-param-gather: bf16 kept


def test_fp8_backward_gemms_run_without_fast_accumulation_on_hopper_only():
    """Transformer Engine and torchao run FP8 dgrad / wgrad with the split accumulator (no cuBLASLt fast
    accumulation): on H100 a layer's GEMM seconds are fwd * (1 + 2 * SPLIT_ACCUMULATOR); bf16, and FP8 on
    Blackwell (block-scaled tensor cores, no such mode) and on ROCm, keep backward = 2 x forward."""
    model = load_model("llama3-8b")
    h100, b200, mi300x = load_cluster("h100"), load_cluster("b200"), load_cluster("mi300x")
    fwd = sum(compute.gemm_time(h100, f, "fp8") for f in compute.layer_gemm_flops(model, 1, 1))
    split = compute.backward_gemm_factor(h100, "fp8")
    fp8 = compute.layer_times(model, h100, Shape(b=1, fp8="fp8", backward_gemm=split))
    assert fp8["gemm"] == pytest.approx(fwd * (1 + 2 * compute.SPLIT_ACCUMULATOR))
    assert compute.SPLIT_ACCUMULATOR > 1
    assert compute.backward_gemm_factor(h100, "fp8") == compute.SPLIT_ACCUMULATOR
    assert compute.backward_gemm_factor(h100, False) == 1.0
    assert compute.backward_gemm_factor(b200, "fp8") == 1.0 and compute.backward_gemm_factor(b200, "fp4") == 1.0
    assert compute.backward_gemm_factor(mi300x, "fp8") == 1.0
    w = make_workload(model, 1, h100, precision="fp8")
    assert compute.shape_of(Layout(tp=1, pp=1, dp=8, micro_batch=1), w).backward_gemm == compute.SPLIT_ACCUMULATOR
    slower = predict(Layout(tp=1, pp=1, dp=8, micro_batch=1), w).time_breakdown["gemm"]
    faster = predict(Layout(tp=1, pp=1, dp=8, micro_batch=1),
                     dataclasses.replace(w, cluster=dataclasses.replace(h100, block_scaled=True))).time_breakdown["gemm"]
    assert slower > faster
