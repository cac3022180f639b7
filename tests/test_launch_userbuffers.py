"""`tuner launch` for Megatron-Core runs the TP-overlap settings the prediction charged (issues 25 / 26): on a cluster
whose file charges Transformer Engine's userbuffers table (b200, gb200: tuner.perfmodel.tp_overlap.charged_table), it
writes that table as the YAML file Megatron-LM reads (`--tp-comm-overlap-cfg`, tuner.render.userbuffers) and passes
it; elsewhere, and without --tp-comm-overlap, neither."""

from __future__ import annotations

import dataclasses

import pytest
import yaml
from click.testing import CliRunner

from test_launch_frameworks import MCORE_FLAGS
from tuner.cli import cli
from tuner.launch import Source
from tuner.layout import Layout
from tuner.perfmodel import tp_overlap
from tuner.render import userbuffers
from tuner.render.launch import launch_files
from tuner.specs import make_workload

TP4 = Layout(tp=4, pp=1, dp=16, micro_batch=1, zero_stage=1, sequence_parallel=True)
TP1 = Layout(tp=1, pp=1, dp=64, micro_batch=1, zero_stage=1)
MOCK = {"mock_data": True, "train_iters": 10}
# initialize_ub's ub_cfgs (NVIDIA/TransformerEngine @ d0067d0d transformer_engine/pytorch/module/base.py): the GEMM
# names of its default methods (lines 349-359; its docstring, lines 184-208, leaves fc1_wgrad out) and the keys of
# get_default_config (lines 381-395) that a user's entry updates (line 567)
TE_GEMMS = {"qkv_fprop", "qkv_dgrad", "qkv_wgrad", "proj_fprop", "proj_dgrad", "proj_wgrad", "fc1_fprop", "fc1_dgrad",
            "fc1_wgrad", "fc2_dgrad", "fc2_fprop", "fc2_wgrad"}
TE_KEYS = {"method", "is_reduce_scatter", "num_sm", "cga_size", "set_sm_margin", "num_splits", "aggregate",
           "atomic_gemm", "use_ce", "fp8_buf", "comm_priority", "gemm_priority", "pipeline_rs_overlap_first_gemm"}
TE_METHODS = {"ring": "ring_exchange", "pipeline": "pipeline", "bulk": "bulk"}


def _launch(lay: Layout, cluster: str, precision: str = "bf16") -> tuple[dict, list[str]]:
    w = make_workload("llama3-70b", 8, cluster, precision=precision, framework="megatron-core")
    lay = dataclasses.replace(lay, dp=w.gpus // lay.tp)       # 8 nodes: 64 GPUs, 32 on a 4-GPU-tray rack
    files = launch_files(lay, w, framework="megatron-core", **MOCK)
    return files, files["megatron_args.txt"].splitlines()


@pytest.mark.parametrize("cluster,precision,table", [("b200", "bf16", "bf16"), ("b200", "fp8", "fp8"),
                                                     ("gb200", "mxfp8", "fp8")])
def test_a_blackwell_tp_overlap_launch_writes_the_charged_table_and_passes_it(cluster, precision, table):
    files, args = _launch(TP4, cluster, precision)
    assert "--tp-comm-overlap" in args
    i = args.index(userbuffers.FLAG)
    assert args[i + 1] == userbuffers.FILE == "tp_comm_overlap_cfg.yaml"
    assert " tp_comm_overlap_cfg.yaml " in files["launch.sbatch"]        # the script runs those arguments
    cfg = yaml.safe_load(files[userbuffers.FILE])                         # as Megatron-LM reads it
    assert set(cfg) <= TE_GEMMS and all(set(v) <= TE_KEYS for v in cfg.values())
    want = tp_overlap.BLACKWELL_USERBUFFERS[table]
    n = 0
    for p in ("fprop", "dgrad", "wgrad"):
        for gemm, how in zip(("qkv", "proj", "fc1", "fc2"), want[p]):
            name = f"{gemm}_{p}"
            if how is None:
                assert name not in cfg                   # TE's default for it, as in Megatron-Bridge's table
                continue
            n += 1
            method, chunks, held = how
            got = cfg[name]
            assert got["method"] == TE_METHODS[method], name
            if method == "ring":
                assert got["set_sm_margin"] is False and got["aggregate"] is False, name
            else:
                assert got["num_sm"] == held and got["cga_size"] == 2, name
                assert got["set_sm_margin"] is (method == "pipeline"), name
            if method == "pipeline":
                assert got["num_splits"] == chunks, name
    assert n == len(cfg) == 10
    assert {"--tp-comm-overlap", userbuffers.FLAG} <= set(MCORE_FLAGS)     # checked against Megatron-LM's arguments


def test_the_file_is_rendered_from_the_models_table(monkeypatch):
    """One table: a change to the perfmodel's constant is what launch writes (the SMs of bf16 qkv_wgrad's bulk)."""
    bf16 = dict(tp_overlap.BLACKWELL_USERBUFFERS["bf16"])
    bf16["wgrad"] = (("bulk", 1, 20),) + bf16["wgrad"][1:]
    monkeypatch.setitem(tp_overlap.BLACKWELL_USERBUFFERS, "bf16", bf16)
    files, _ = _launch(TP4, "b200")
    assert yaml.safe_load(files[userbuffers.FILE])["qkv_wgrad"]["num_sm"] == 20
    with pytest.raises(ValueError, match="ring exchange"):
        userbuffers.ub_cfgs({**bf16, "fprop": (("ring", 2, 0),) + bf16["fprop"][1:]})


@pytest.mark.parametrize("lay,cluster,overlap", [
    (TP1, "b200", False),                                               # tp 1: no TP overlap
    (dataclasses.replace(TP4, sequence_parallel=False), "b200", False),  # no sequence parallelism: none either
    (TP4, "h100", True),     # the overlap with TE's defaults: the guessed curve charges no table (docs/hardware.md)
    (TP4, "gb300", True),    # no sm_count: no table charged
    (TP4, "mi300x", False),  # ROCm: no TP overlap
])
def test_no_settings_file_where_the_model_charges_no_table(lay, cluster, overlap):
    files, args = _launch(lay, cluster)
    assert userbuffers.FILE not in files and userbuffers.FLAG not in args
    assert ("--tp-comm-overlap" in args) is overlap


def test_cli_writes_the_file_and_a_later_launch_without_it_removes_it(tmp_path, monkeypatch):
    import tuner.cli.report as report
    picks = iter([TP4, TP1])

    def pick(store, name, model, nodes, cluster, precision="bf16", framework=None, *rest):
        return next(picks), make_workload(model, nodes, cluster, framework=framework), Source(kind="model")
    monkeypatch.setattr(report, "pick_layout", pick)
    out = tmp_path / "run"
    base = ["launch", "--model", "llama3-70b", "--cluster", "b200", "--nodes", "8", "--framework", "megatron-core",
            "--train-iters", "10", "--mock-data", "--db", f"sqlite:///{tmp_path}/none.db", "--out", str(out)]
    r = CliRunner().invoke(cli, base)
    assert r.exit_code == 0, r.output
    assert (out / userbuffers.FILE).exists() and str(out / userbuffers.FILE) in r.output
    r = CliRunner().invoke(cli, [*base, "--force"])
    assert r.exit_code == 0, r.output
    assert not (out / userbuffers.FILE).exists() and userbuffers.FILE not in r.output     # stale file gone
    assert "--tp-comm-overlap-cfg" not in (out / "megatron_args.txt").read_text()
