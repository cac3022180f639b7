"""Megatron-Core's CPU activation offloading as a layout dimension (offload_layers, issue 25 item 2): the key unchanged
at 0, refused where Megatron-Core refuses it and on the other frameworks, memory down and time up with N as
TransformerEngine's schedule says, plan's batched memory equal to memory_fit's, and the launch flag."""

from __future__ import annotations

import dataclasses
import re

import pytest

from pathlib import Path

from tuner.layout import Layout, why_invalid
from tuner.perfmodel import memory_fit, predict
from tuner.perfmodel.memory_batch import screen_memory, supported
from tuner.perfmodel.offload import exposed_seconds, resident_layers, shared_rates, spans, windows
from tuner.render import mcore
from tuner.specs import make_workload

LAY = Layout(tp=1, pp=1, dp=64, micro_batch=1, zero_stage=3, recompute="none")


def _w(cluster="b200", nodes=8, framework="megatron-core", precision="fp8"):
    return make_workload("llama3-70b", nodes, cluster, 128, precision=precision, framework=framework)

ROOT = Path(__file__).resolve().parents[1]


def test_the_key_names_offloading_only_when_set():
    assert "off" not in LAY.key() and LAY.offload_layers == 0
    assert LAY.key() == "tp1-pp1-dp64-mb1-z3-rcnone"
    assert dataclasses.replace(LAY, offload_layers=20).key() == "tp1-pp1-dp64-mb1-z3-rcnone-off20"
    assert Layout.from_dict({k: v for k, v in LAY.as_dict().items() if k != "offload_layers"}) == LAY


def test_refused_where_megatron_core_refuses_it_and_elsewhere():
    w, off = _w(), dataclasses.replace(LAY, offload_layers=20)
    assert why_invalid(off, w) is None
    assert "use --offload-layers 79 or less" in why_invalid(dataclasses.replace(off, offload_layers=80), w)
    assert "with pp 2" in why_invalid(dataclasses.replace(off, pp=2, dp=32, zero_stage=1), w)
    assert "with recompute selective" in why_invalid(dataclasses.replace(off, recompute="selective"), w)
    tt = why_invalid(off, _w(framework="torchtitan", precision="bf16"))
    assert tt.startswith("torchtitan has no CPU activation offloading") and "--framework megatron-core" in tt


def test_transformer_engines_windows_and_spans():
    assert windows(80, 40) == [2 * g + 1 for g in range(40)] and spans(80, 40) == [1] + [2] * 39
    assert windows(10, 3)[-1] == 9 and sum(spans(10, 3)) == 9          # the last group freed at the last layer
    # a copy shorter than the compute it runs under is hidden; a longer one shows its excess, forward and backward
    assert exposed_seconds(80, 20, 0.010, 0.010, 0.005, 0.010) == 0.0
    assert exposed_seconds(80, 40, 0.012, 0.012, 0.005, 0.010) == pytest.approx((0.007 + 0.002) + 39 * 0.002)
    assert exposed_seconds(80, 0, 1.0, 1.0, 0.0, 0.0) == 0.0 and resident_layers(80, 0) == 80
    # each direction at its own rate: the copies to the host under the forward, the reloads under the backward
    assert exposed_seconds(80, 40, 0.012, 0.006, 0.005, 0.010) == pytest.approx(0.007 + 39 * 0.002)


def test_memory_drops_and_time_rises_with_the_layers_offloaded():
    w = _w()
    preds = [predict(dataclasses.replace(LAY, offload_layers=n), w) for n in (0, 10, 20, 40, 79)]
    acts = [p.memory_breakdown["activations"] for p in preds]
    assert all(a > b for a, b in zip(acts, acts[1:]))
    steps = [p.step_time_s for p in preds]
    assert all(a <= b for a, b in zip(steps, steps[1:])) and steps[-1] > steps[0] * 1.5
    assert "cpu_offload" not in preds[0].time_breakdown and preds[-1].time_breakdown["cpu_offload"] > 0
    # NVLink-C2C (gb200's host link) hides what PCIe Gen5 shows
    fast = predict(dataclasses.replace(LAY, offload_layers=40), _w("gb200", 16)).time_breakdown["cpu_offload"]
    assert fast < preds[3].time_breakdown["cpu_offload"] / 3


def test_copies_move_at_what_a_gpu_gets_while_every_gpu_of_the_node_copies():
    """Eight DGX H100 GPUs offloading at once get 44.8 GB/s each to the host and 55.2 back (the measured
    all_to_host / host_to_all figures h100.toml cites), not PCIe Gen5's 64-a-direction peak: the copies show more."""
    w = make_workload("llama3-70b", 8, "h100", 128, precision="bf16", framework="megatron-core")
    assert (w.cluster.host_d2h, w.cluster.host_h2d) == (44.8, 55.2) < (w.cluster.host_link,) * 2
    w = dataclasses.replace(w, cluster=dataclasses.replace(w.cluster, nic_shares_host_link=None))   # rates alone
    peak = dataclasses.replace(w, cluster=dataclasses.replace(w.cluster, host_d2h_gbps=None, host_h2d_gbps=None))
    assert peak.cluster.host_d2h == peak.cluster.host_h2d == 64.0
    lay = Layout(tp=4, pp=1, dp=16, micro_batch=1, zero_stage=3, recompute="none", offload_layers=40)
    shared, alone = (predict(lay, x).time_breakdown["cpu_offload"] for x in (w, peak))
    assert shared > alone * 1.2 > 0


def test_the_nics_data_parallel_traffic_slows_the_copies_on_the_same_pcie_link():
    """HGX H100: each GPU's one x16 link carries its NIC's GPUDirect traffic too (nic_shares_host_link): while the
    NIC runs (40 GB/s: 400 Gb/s x network_efficiency) a copy gets the 24 of the link's 64 it leaves, otherwise its own
    rate. A Megatron-FSDP layout gathering and reduce-scattering across nodes copies slower; one whose data-parallel
    group stays on NVLink (one node), or a cluster without the key, is charged as before."""
    assert shared_rates(44.8, 55.2, 64.0, 40.0, 0.0, 0.0) == (44.8, 55.2)
    assert shared_rates(44.8, 55.2, 64.0, 40.0, 1.0, 1.0) == pytest.approx((24.0, 24.0))
    assert shared_rates(44.8, 55.2, 64.0, 40.0, 0.5, 0.25) == pytest.approx((34.4, 47.4))
    lay = Layout(tp=4, sequence_parallel=True, pp=1, dp=16, micro_batch=2, zero_stage=3, recompute="none",
                 offload_layers=40)
    for nodes, slower in ((8, True), (1, False)):
        w = make_workload("llama3-70b", nodes, "h100", 16 * nodes, precision="bf16", framework="megatron-core")
        if nodes == 1:
            lay = dataclasses.replace(lay, tp=2, dp=4)
        assert w.cluster.nic_shares_host_link
        apart = dataclasses.replace(w, cluster=dataclasses.replace(w.cluster, nic_shares_host_link=None))
        shared, alone = (predict(lay, x).time_breakdown["cpu_offload"] for x in (w, apart))
        assert (shared > alone * 1.5) if slower else (shared == alone)


def test_a_nic_that_fills_the_shared_host_link_is_refused_in_one_line(tuner, tmp_path):
    """With nic_shares_host_link the copies get what the NIC leaves of the link; a NIC at or above the link would leave
    them nothing (a step that never ends): the cluster file is refused naming the fix, not predicted."""
    text = (ROOT / "workloads" / "clusters" / "h100.toml").read_text()
    assert re.search(r"^host_link_gbps = 64\.0", text, re.M) and re.search(r"^nic_shares_host_link = true", text, re.M)
    path = tmp_path / "pcie-nic.toml"
    path.write_text(re.sub(r"^host_link_gbps = 64\.0", "host_link_gbps = 30.0", text, flags=re.M))
    code, _, err = tuner("plan", "--model", "llama3-8b", "--cluster", str(path), "--nodes", "2", "--top", "1")
    assert code == 2 and err.count("\n") == 1 and "nic_shares_host_link" in err and "host_link_gbps" in err, err


def test_dgx_a100_pairs_share_one_gen4_uplink_so_their_copies_move_at_half_a_gpus_rate():
    """DGX A100: two GPUs behind each PCIe Gen4 switch share one x16 uplink, so with every GPU copying each gets
    half of the ~25 GB/s one A100 moves alone (a100.toml's ESTIMATE, 12.5 each way), not the 32 GB/s peak."""
    w = make_workload("llama3-8b", 2, "a100", 32, precision="bf16", framework="megatron-core")
    assert (w.cluster.host_d2h, w.cluster.host_h2d) == (12.5, 12.5) and w.cluster.host_link == 32.0
    peak = dataclasses.replace(w, cluster=dataclasses.replace(w.cluster, host_d2h_gbps=None, host_h2d_gbps=None))
    lay = Layout(tp=2, pp=1, dp=8, micro_batch=1, zero_stage=1, recompute="none", offload_layers=16)
    halved, alone = (predict(lay, x).time_breakdown["cpu_offload"] for x in (w, peak))
    assert halved > alone * 2 > 0


def test_frontier_gcds_copy_to_the_host_over_infinity_fabric_at_36_gb_s():
    """A Frontier GCD reaches the CPU's memory over Infinity Fabric at 36 GB/s each way (OLCF Frontier User Guide), not
    PCIe Gen5's 64 (HOST_LINK_GBPS, what a file without host_link_gbps gets); its 512 GB of DDR4 is 64 GB a GCD. An
    MI250X's compute hides a layer's copy at either rate; on a GCD eight times faster the copies show, and show more
    over the slower link."""
    w = make_workload("llama3-8b", 4, "frontier", 128, precision="bf16", framework="megatron-core")
    assert w.cluster.host_d2h == w.cluster.host_h2d == w.cluster.host_link == 36.0 and w.cluster.host_memory_gb == 64.0
    fast = dataclasses.replace(w, cluster=dataclasses.replace(w.cluster, peak_tflops=w.cluster.peak_tflops * 8))
    pcie = dataclasses.replace(fast, cluster=dataclasses.replace(fast.cluster, host_link_gbps=None))
    assert pcie.cluster.host_link == 64.0
    lay = Layout(tp=1, pp=1, dp=32, micro_batch=1, zero_stage=1, recompute="none", offload_layers=16)
    assert predict(lay, w).time_breakdown["cpu_offload"] == 0.0
    fabric, gen5 = (predict(lay, x).time_breakdown["cpu_offload"] for x in (fast, pcie))
    assert fabric > 2 * gen5 > 0


def test_plans_batched_memory_equals_memory_fit_with_offloading():
    w = _w()
    if not supported(w):
        pytest.skip("screen_memory answers on Python < 3.12 only")
    lays = [dataclasses.replace(LAY, offload_layers=n, micro_batch=mb) for n in (0, 1, 7, 40) for mb in (1, 2)]
    mem, p_fit = screen_memory(lays, w)
    for lay, gb, p in zip(lays, mem, p_fit):
        _, _, _, bd, pf = memory_fit(lay, w)
        assert (gb, p) == (bd["total"], pf)


def test_launch_writes_megatron_cores_flag():
    from tests.test_launch_frameworks import MCORE_FLAGS
    w = _w()
    args = mcore.pretrain_args(dataclasses.replace(LAY, offload_layers=20, zero_stage=1), w)
    i = args.index("--cpu-offloading-num-layers")
    assert args[i + 1] == "20" and "--cpu-offloading" not in args
    assert {a for a in args if a.startswith("--")} <= set(MCORE_FLAGS)
    assert "--cpu-offloading-num-layers" not in mcore.pretrain_args(dataclasses.replace(LAY, zero_stage=1), w)
    # TransformerEngine >= 2.10 runs the schedule the model charges only with NVTE_CPU_OFFLOAD_V1=1
    assert mcore.launch_env(dataclasses.replace(LAY, offload_layers=20), w)["NVTE_CPU_OFFLOAD_V1"] == "1"
    assert "NVTE_CPU_OFFLOAD_V1" not in mcore.launch_env(dataclasses.replace(LAY, tp=2, dp=32), w)


def test_predict_takes_the_flag_and_refuses_it_on_torchtitan_in_one_line(tuner):
    base = ["predict", "--model", "llama3-70b", "--cluster", "b200", "--nodes", "8", "--global-batch", "128",
            "--tp", "1", "--pp", "1", "--micro-batch", "1", "--recompute", "none", "--offload-layers", "20"]
    code, out, err = tuner(*base, "--framework", "megatron-core", "--zero-stage", "1")
    assert code == 0, err
    code, out, err = tuner(*base, "--framework", "torchtitan", "--zero-stage", "3")
    assert code == 2 and "Traceback" not in err and "--offload-layers 0" in err and len(err.strip().splitlines()) == 1


def test_the_space_gives_offloaded_twins_only_where_they_rescue_a_layout():
    from tuner.space import SearchSpace, valid_layouts
    from tuner.space_offload import SURELY_FITS, offload_counts
    w = _w("gb200", 16)
    assert offload_counts(80) == [20, 40, 60]
    dims = {"tp": [1, 8], "pp": [1], "micro_batch": [1, 2, 4], "zero_stage": [3], "recompute": ["none", "full"],
            "sequence_parallel": [False, True]}
    space = SearchSpace("t", dims, {})
    plain = space.enumerate_layouts(w)
    got = valid_layouts(space, w)
    twins = [lay for lay in got if lay.offload_layers]
    assert twins and len(got) == len(plain) + len(twins)
    for base in {_plain(t) for t in twins}:                         # right after the layout they rescue, fewest first
        mine = [t for t in twins if _plain(t) == base]
        assert base.recompute == "none" and got[got.index(base) + 1:][:len(mine)] == sorted(
            mine, key=lambda x: x.offload_layers)
    for t in twins:
        base = _plain(t)
        assert memory_fit(base, w)[4] < SURELY_FITS <= memory_fit(t, w)[4]
        fewer = [n for n in offload_counts(80) if n < t.offload_layers]
        rescued = [n for n in fewer if memory_fit(dataclasses.replace(t, offload_layers=n), w)[4] >= SURELY_FITS]
        # every count from the fewest that rescues it up: the next one is what a run out of memory at that one tries
        assert all(dataclasses.replace(t, offload_layers=n) in got for n in rescued)
    assert any(sum(_plain(x) == _plain(t) for x in twins) > 1 for t in twins)     # a layout with more than one twin
    assert not [lay for lay in valid_layouts(space.pinned({"offload_layers": 0}), w) if lay.offload_layers]
    tt = _w("gb200", 16, framework="torchtitan", precision="bf16")
    assert not [lay for lay in valid_layouts(SearchSpace("t", {**dims, "sequence_parallel": [True]}, {}), tt)
                if lay.offload_layers]


def _plain(lay):
    return dataclasses.replace(lay, offload_layers=0)


def test_plan_pinned_to_offloading_names_the_refusal(tuner):
    base = ["plan", "--model", "llama3-70b", "--cluster", "h100", "--nodes", "8", "--offload-layers", "20"]
    code, _, err = tuner(*base, "--framework", "torchtitan")
    assert code == 2 and "torchtitan has no CPU activation offloading" in err and "Traceback" not in err
    code, _, err = tuner(*base, "--framework", "megatron-core", "--pp", "4")
    assert code == 2 and "refuses CPU offloading with pp 4" in err


def test_offloading_beyond_the_hosts_memory_does_not_fit_and_says_why():
    """The host copies (memory.offload_host_gb) must fit the host memory per GPU the cluster states (host_memory_gb:
    a GB200 superchip's 480 GB Grace memory for two GPUs); where it states none, nothing is checked."""
    from tuner.perfmodel import memory
    from tuner.space import load_space, valid_layouts
    w = make_workload("llama3-70b", 16, "gb200", 512, precision="bf16", framework="megatron-core")
    big = Layout(tp=1, pp=1, dp=64, micro_batch=2, zero_stage=3, recompute="none", offload_layers=60)
    m, sh, _, _, p_fit = memory_fit(big, w)
    assert memory.offload_host_gb(big, w, sh) > w.cluster.host_memory_gb == 240.0 and p_fit == 0.0
    assert screen_memory([big, LAY], w)[1][0] == 0.0 < screen_memory([big, LAY], w)[1][1]   # plan's batch, the same
    pred = predict(big, w)
    assert not pred.fits and "host memory" in pred.reason and "--offload-layers" in pred.reason
    small = dataclasses.replace(big, offload_layers=20)
    assert memory.offload_host_gb(small, w, memory_fit(small, w)[1]) < 240.0 < memory.offload_host_gb(big, w, sh)
    unchecked = make_workload("llama3-70b", 8, "h800", 512, precision="bf16", framework="megatron-core")
    assert unchecked.cluster.host_memory_gb is None and memory_fit(dataclasses.replace(big, dp=64), unchecked)[4] > 0
    proposed = [lay for lay in valid_layouts(load_space("default"), w) if lay.offload_layers]
    assert proposed and all(memory.offload_host_gb(lay, w, memory_fit(lay, w)[1]) <= 240.0 for lay in proposed)
