"""The scale-up domain (issue 26): a node (what Slurm allocates) apart from the NVLink / Infinity Fabric
domain, groups placed by the framework's rank order, and a GB200 NVL72 rack charged as one NVLink domain."""

from __future__ import annotations

import dataclasses
import math

import pytest

from tuner.errors import SpecError
from tuner.frameworks import RANK_ORDER
from tuner.layout import Layout
from tuner.perfmodel import comm, compute, predict
from tuner.space import load_space, valid_layouts
from tuner.specs import ClusterSpec, load_cluster, make_workload

NVLINK = 900.0          # gb200.toml: NVLink 5 per GPU, per direction


def _pair(model: str, nodes: int, precision: str = "bf16", global_batch: int | None = None):
    """The workload on GB200 NVL72 and on the same cluster with an NVLink domain of 8 GPUs (two trays)."""
    nvl72 = make_workload(model, nodes, "gb200", global_batch, precision=precision)
    nvl8 = make_workload(model, nodes, dataclasses.replace(load_cluster("gb200"), scale_up_domain_gpus=8),
                         global_batch, precision=precision)
    return nvl72, nvl8


def _sample(layouts: list, most: int = 1200) -> list:
    step = max(1, len(layouts) // most)
    return layouts[::step]


def _inside_rack(w, size: int, stride: int) -> bool:
    """The group's ranks sit in one aligned block of the job's NVLink domain."""
    block, dom = size * stride, w.cluster.domain_gpus
    return block <= dom and dom % block == 0


@pytest.mark.parametrize("model, nodes, gb", [("qwen3-30b-a3b", 18, 576), ("mixtral-8x7b", 16, None)])
def test_nvl72_charges_moe_groups_inside_the_rack_at_nvlink_speed(model, nodes, gb):
    w72, w8 = _pair(model, nodes, global_batch=gb)
    layouts = _sample(valid_layouts(load_space(None), w72))
    across_trays = slower = 0
    for lay in layouts:
        pl = comm.placement(lay, w72)
        ep, etp = lay.expert_parallel, lay.expert_tensor_parallel
        if lay.tp > 1 and _inside_rack(w72, lay.tp, 1):
            assert pl["tp"]["inside"] and pl["tp"]["bandwidth_gbps"] == NVLINK, lay.key()
        if ep > 1 and _inside_rack(w72, ep, etp):
            assert pl["ep"]["inside"] and pl["ep"]["bandwidth_gbps"] == NVLINK, lay.key()
            # the token all-to-all: nothing through the NICs, all of it at NVLink speed
            n = 1e9
            nvlink_only = n * (ep - 1) / ep / (NVLINK * 1e9 * w72.cluster.network_efficiency) \
                + w72.cluster.latency_us * 1e-6
            assert comm.alltoall_time(w72.cluster, n, ep, etp) == pytest.approx(nvlink_only, rel=1e-12)
            across_trays += ep * etp > w72.cluster.gpus_per_node
        a, b = predict(lay, w72).step_time_s, predict(lay, w8).step_time_s
        assert b >= a * (1 - 1e-12), f"{lay.key()}: domain 8 predicted faster ({b} < {a})"
        slower += b > a * 1.001
    assert across_trays > 0, "no layout put an EP group across trays: the test would prove nothing"
    assert slower > 0, "a smaller NVLink domain never cost anything"


def test_nvl72_charges_dense_tp_and_cp_groups_inside_the_rack_at_nvlink_speed():
    w72, w8 = _pair("llama3-70b", 16, "fp8")
    layouts = _sample(valid_layouts(load_space(None), w72))
    crossing_tp = 0
    for lay in layouts:
        pl = comm.placement(lay, w72)
        t, c = lay.tp, lay.context_parallel
        if t > 1 and _inside_rack(w72, t, 1):
            assert pl["tp"]["inside"] and pl["tp"]["bandwidth_gbps"] == NVLINK, lay.key()
        if c > 1 and _inside_rack(w72, c, t):
            assert pl["cp"]["inside"] and pl["cp"]["bandwidth_gbps"] == NVLINK, lay.key()
        if t * c > w72.cluster.gpus_per_node and _inside_rack(w72, t * c, 1):
            crossing_tp += 1
        assert predict(lay, w8).step_time_s >= predict(lay, w72).step_time_s * (1 - 1e-12), lay.key()
    assert crossing_tp > 0, "no tp*cp group spanned trays: the test would prove nothing"


def test_tp_overlap_is_credited_inside_the_rack_not_beyond():
    w72, w8 = _pair("llama3-70b", 16)
    lay = Layout(tp=16, sequence_parallel=True, pp=4, dp=1, micro_batch=1, recompute="selective")
    t72, t8 = predict(lay, w72).time_breakdown, predict(lay, w8).time_breakdown
    assert comm.leaves_domain(w8.cluster, 16, 1) and not comm.leaves_domain(w72.cluster, 16, 1)
    assert t72["tp_comm"] < t8["tp_comm"]


def test_a_job_gets_the_segment_of_the_rack_slurm_gives_it():
    c = load_cluster("gb200")
    assert c.domain_gpus == 72 and c.segment_nodes == 18 and c.gpus_per_node == 4
    got = {n: make_workload("llama3-8b", n, c).cluster.segment_nodes for n in (1, 4, 16, 18, 36, 64)}
    assert got == {1: 1, 4: 4, 16: 16, 18: 18, 36: 18, 64: 16}
    # 64 trays = 4 racks of 16: a 64-GPU EP group stays in a rack, a 128-GPU one crosses the network
    w = make_workload("llama3-8b", 64, c)
    assert not comm.leaves_domain(w.cluster, 64, 1) and comm.leaves_domain(w.cluster, 128, 1)
    assert comm.group_bandwidth(w.cluster, 8, 64) == c.nic_bandwidth == 50.0   # DP across racks: one NIC each


def test_the_domain_defaults_to_the_node_and_changes_nothing_there():
    h100 = load_cluster("h100")
    assert h100.domain_gpus == 8 and h100.domain_bandwidth == h100.intra_node_bandwidth_gbps
    assert set(h100.as_dict()) == {f.name for f in dataclasses.fields(ClusterSpec)} - {
        "scale_up_domain_gpus", "scale_up_bandwidth_gbps", "peak_tflops_fp4", "block_scaled", "software",
        "matmul_efficiency_fp8", "matmul_efficiency_fp4", "operations",
        "tp_overlap_gemm_cost", "device"}   # each stored only when set (ClusterSpec.as_dict)
    said = dataclasses.replace(h100, scale_up_domain_gpus=8, scale_up_bandwidth_gbps=450.0)
    w0, w1 = make_workload("mixtral-8x7b", 8, h100), make_workload("mixtral-8x7b", 8, said)
    for lay in _sample(valid_layouts(load_space(None), w0), 300):
        assert predict(lay, w0).step_time_s == predict(lay, w1).step_time_s, lay.key()


def test_groups_follow_each_frameworks_rank_order():
    lay = Layout(tp=2, context_parallel=2, pp=2, dp=4, micro_batch=1)
    for fw in ("megatron-core", "torchtitan"):
        assert RANK_ORDER[fw][0] == "tp"
        assert comm.strides(lay, fw) == {"tp": 1, "cp": 2, "dp": 4, "pp": 16, "ep": 1}
    flat = Layout(tp=2, pp=2, dp=4, micro_batch=1)
    assert comm.strides(flat, "megatron-deepspeed") == {"tp": 1, "dp": 2, "pp": 8, "cp": 2, "ep": 1}


def _base() -> dict:
    return {k: v for k, v in load_cluster("gb200").as_dict().items() if v is not None}


def test_the_domain_keys_are_checked():
    with pytest.raises(SpecError, match="multiple of gpus_per_node"):
        ClusterSpec.from_dict({**_base(), "scale_up_domain_gpus": 70})
    with pytest.raises(SpecError, match="disagree"):
        ClusterSpec.from_dict({**_base(), "scale_out_bandwidth_gbps": 50.0, "inter_node_bandwidth_gbps": 100.0})
    no_net = {k: v for k, v in _base().items() if k != "inter_node_bandwidth_gbps"}
    with pytest.raises(SpecError, match="scale_out_bandwidth_gbps"):
        ClusterSpec.from_dict(no_net)
    per_gpu = ClusterSpec.from_dict({**no_net, "scale_out_bandwidth_gbps": 100.0})
    assert per_gpu.inter_node_bandwidth_gbps == 400.0 and per_gpu.nic_bandwidth == 100.0
    stored = ClusterSpec.from_dict(load_cluster("gb200").as_dict())      # a stored study reads back the same
    assert stored == load_cluster("gb200")


# ---- the presets of the machines people train on in 2026 -------------------------------------------------
from tuner.presets import shipped_presets  # noqa: E402

NEW = {"b200": (8, 8), "b300": (8, 8), "gb200": (4, 72), "gb300": (4, 72), "h800": (8, 8),
       "mi300x": (8, 8), "mi325x": (8, 8), "mi355x": (8, 8), "mi300a": (4, 4)}
AMD = {"mi300x", "mi325x", "mi355x", "mi300a"}


@pytest.mark.parametrize("name", sorted(NEW))
def test_each_preset_loads_with_its_node_and_domain(name):
    c = load_cluster(name)
    assert (c.gpus_per_node, c.domain_gpus) == NEW[name]
    assert c.software == ("rocm" if name in AMD else "cuda")
    assert c.peak_tflops_fp8 and c.peak_tflops_fp8 >= 2 * c.peak_tflops * 0.99
    assert c.nic_bandwidth > 0 and c.domain_bandwidth >= c.nic_bandwidth * 2


@pytest.mark.parametrize("name", sorted(NEW))
def test_every_constant_of_a_new_preset_is_cited_or_marked_an_estimate(name):
    text = shipped_presets("clusters")[name].read_text()
    assert "Sources" in text
    refs, lines = set(), text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("[slurm]"):
            break                                                  # the scheduler's table, not a hardware constant
        key = line.split("=")[0].strip()
        if line.startswith("#") or "=" not in line or key in ("name", "framework", "software"):
            continue
        above = lines[:i]
        start = max((j for j, x in enumerate(above) if not x.strip()), default=-1) + 1
        block = "\n".join(above[start:])                          # the comment paragraph above this line
        block = "" if "Sources" in block else block                # (not the file's header)
        said = line.split("#", 1)[1] if "#" in line else ""
        assert "[" in said or "ESTIMATE" in said or "ESTIMATE" in block or "as h100" in block \
            or "h100.toml's" in block or "mi300x.toml's" in block or key in ("block_scaled", "flash_attention"), \
            f"{name}: {key} has no source and is not marked an estimate"
        refs |= {r for r in "123456" if f"[{r}]" in said}
    for r in refs:
        assert f"[{r}] " in text.split("\nname")[0], f"{name}: [{r}] is not in its Sources"


@pytest.mark.parametrize("name", ["b200", "gb200", "mi300x", "mi355x", "h800"])
def test_cluster_takes_each_new_preset_by_name(tuner, name):
    code, out, err = tuner("plan", "--model", "llama3-8b", "--cluster", name, "--nodes", "2", "--top", "1")
    assert code == 0, err
    assert name in out


#: OpenXLA's measured GEMM table for sm_100 (b200.toml [9]: tensorflow/tensorflow @ a305421c45a1,
#: third_party/xla/xla/backends/gpu/cost_model/matmul_interpolator_data.h): bf16 TFLOPS at b 1, m 4,096, by (n, k)
XLA_SM100_BF16 = {(2048, 512): 652.3, (4096, 512): 805.3, (256, 1024): 283.7, (512, 1024): 490.6, (1024, 1024): 715.6,
                  (2048, 1024): 913.8, (4096, 1024): 1075.6, (256, 2048): 458.8, (512, 2048): 762.4,
                  (1024, 2048): 990.3, (2048, 2048): 1170.0, (4096, 2048): 1277.8, (256, 4096): 645.1,
                  (512, 4096): 991.5, (1024, 4096): 1204.9, (2048, 4096): 1343.5, (4096, 4096): 1416.9}


def test_the_b200_gemm_curve_follows_the_measured_sweep_by_shape():
    """b200.toml's eta(F) reproduces XLA's sm_100 sweep (17 shapes, 2-137 GFLOP) within 0.1 rms in log; the knee
    taken from two large shapes alone (3.1 GFLOP) missed it by 0.42 (0.28 of peak at 2 GFLOP where 0.13 was measured)."""
    c = load_cluster("b200")
    errors = [math.log(compute.gemm_efficiency(c, 2 * 4096 * n * k / 1e9) * c.peak_tflops / tflops)
              for (n, k), tflops in XLA_SM100_BF16.items()]
    assert math.sqrt(sum(e * e for e in errors) / len(errors)) < 0.1
    assert compute.gemm_efficiency(c, 824.6) * c.peak_tflops == pytest.approx(1512.8, rel=0.03)   # vLLM's [5]
