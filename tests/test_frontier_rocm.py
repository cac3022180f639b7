"""Frontier runs ROCm (task F): its cluster file says software = "rocm", so its launches carry the ROCm notes for an
MI250X (gfx90a) on Slingshot, Megatron-Core is launched and predicted without Transformer Engine's userbuffers TP
overlap (CUDA only), and every AMD cluster file names the architecture `launch` writes for."""

from __future__ import annotations

import dataclasses

import pytest

from tuner.layout import Layout
from tuner.perfmodel import predict
from tuner.render import rocm
from tuner.render.launch import launch_files
from tuner.specs import make_workload

DATA = {"data_path": "/lustre/data/pile_text_document", "tokenizer": "gpt2"}
SP_LAYOUT = Layout(tp=2, sequence_parallel=True, pp=4, dp=4, micro_batch=1, zero_stage=1)


@pytest.mark.parametrize("cluster, arch", [("frontier", "gfx90a"), ("mi300a", "gfx942"), ("mi300x", "gfx942"),
                                           ("mi325x", "gfx942"), ("mi350x", "gfx950"), ("mi355x", "gfx950")])
def test_every_amd_cluster_file_says_rocm_and_its_architecture(cluster, arch):
    c = make_workload("22b", 2, cluster).cluster
    assert c.software == "rocm"
    assert rocm.arch(c) == arch


def test_frontier_launch_has_the_gfx90a_slingshot_notes_and_no_roce_or_primus_variables():
    w = make_workload("22b", 2, "frontier")
    files = launch_files(Layout(tp=2, sequence_parallel=True, pp=4, dp=2, micro_batch=2, zero_stage=1), w,
                         train_iters=10, **DATA)
    script = files["launch.sbatch"]
    assert "# ROCm: AMD Instinct gfx90a (CDNA 2)" in script
    assert "aws-ofi-rccl" in script
    for name in ("HSA_NO_SCRATCH_RECLAIM", "NVTE_CK_IS_V3_ATOMIC_FP32", "NCCL_IB_GID_INDEX", "NCCL_IB_HCA"):
        assert name not in script
    assert "export FI_CXI_ATS=0" in script                     # the site's own network variables stay
    assert rocm.launch_env(w) == {}


def test_a_roce_cluster_still_gets_the_gid_index_across_nodes():
    assert rocm.launch_env(make_workload("22b", 2, "mi300x")) == {**rocm.GFX942, **rocm.MULTI_NODE}
    assert not rocm.libfabric(make_workload("22b", 2, "mi300x").cluster)


def test_megatron_core_on_frontier_is_launched_and_predicted_without_the_tp_overlap():
    w = make_workload("175b", 4, "frontier", framework="megatron-core")
    args = launch_files(SP_LAYOUT, w, framework="megatron-core", train_iters=10, mock_data=True)["megatron_args.txt"]
    assert "--sequence-parallel" in args.split() and "--tp-comm-overlap" not in args.split()
    as_cuda = dataclasses.replace(w, cluster=dataclasses.replace(w.cluster, software="cuda"))
    rocm_tp, cuda_tp = (predict(SP_LAYOUT, x).time_breakdown["tp_comm"] for x in (w, as_cuda))
    assert rocm_tp > 1.5 * cuda_tp > 0                         # the userbuffers overlap hides TP comm on CUDA only
