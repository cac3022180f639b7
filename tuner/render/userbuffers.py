"""The TP-overlap settings file `tuner launch` writes for Megatron-LM: the table the prediction charged. Pure: text.

Megatron-Core's `--tp-comm-overlap` runs Transformer Engine's userbuffers; with `--tp-comm-overlap-cfg PATH`
(NVIDIA/Megatron-LM @ d98e8a64dd megatron/training/arguments.py line 2880) Megatron-LM reads PATH with
`yaml.safe_load` (megatron/training/initialize.py line 213, `_initialize_tp_communicators`) and passes it as `ub_cfgs`
to Transformer Engine's `initialize_ub` (lines 240-246). Without it `ub_cfgs` is empty and every GEMM takes
`initialize_ub`'s defaults (NVIDIA/TransformerEngine @ d0067d0d transformer_engine/pytorch/module/base.py lines
384-386, `get_default_config`): 16 SMs with the SM margin for every pipeline and bulk overlap.

Where the model charges a table (tuner.perfmodel.tp_overlap.charged_table: Megatron-Bridge's B200 settings on a
cluster whose file sets `tp_overlap_gemm_cost` and `sm_count`, b200 / gb200), `ub_cfgs` renders it in those keys, one
entry per GEMM and pass (`<gemm>_<pass>`, base.py lines 151-208: qkv / proj / fc1 / fc2, fprop / dgrad / wgrad), each
merged over TE's default for that GEMM (base.py line 567, `ub_cfg.update`). How each of the model's methods is
written (METHODS) is what Megatron-Bridge's dataclasses set (NVIDIA-NeMo/Megatron-Bridge @ 067f987d
src/megatron/bridge/training/comm_overlap.py lines 44-77): a pipeline `num_sm` / `num_splits` from the table, cga 2,
the SM margin (PipelineOverlapCfg in every table); a bulk transfer `num_sm` from the table, cga 2, no margin
(BulkOverlapCfg); a ring exchange RingExchangeOverlapCfg's defaults (1 SM, cga 1, no margin, no aggregate), which
the model charges no SM for (its transfer runs on copy engines, `use_ce`). One deviation from Bridge's FP8 table,
where the model is the reference: its proj / fc2 fprop rings set the margin (1 of 148 SMs), which the model does not
charge, and the file leaves out. Entries the table holds none for (proj_wgrad, fc2_wgrad) keep TE's default.
"""

from __future__ import annotations

from tuner.perfmodel import tp_overlap
from tuner.precision import gemm_format
from tuner.specs import Workload

FILE = "tp_comm_overlap_cfg.yaml"       # the name Megatron-LM's own TP-overlap test case gives it
FLAG = "--tp-comm-overlap-cfg"
GEMMS = ("qkv", "proj", "fc1", "fc2")   # the order of a pass's entries in BLACKWELL_USERBUFFERS
PASSES = ("fprop", "dgrad", "wgrad")
METHODS = {"ring": {"method": "ring_exchange", "num_sm": 1, "cga_size": 1, "set_sm_margin": False,
                    "aggregate": False},
           "pipeline": {"method": "pipeline", "cga_size": 2, "set_sm_margin": True},
           "bulk": {"method": "bulk", "cga_size": 2, "set_sm_margin": False}}


def ub_cfgs(table: dict) -> dict[str, dict]:
    """{`<gemm>_<pass>`: Transformer Engine's ub_cfgs keys} for one precision's table (BLACKWELL_USERBUFFERS' form:
    per pass, per GEMM, (method, chunks: 0 = tp, SMs held) or None). ValueError for a ring exchange in chunks other
    than tp or one holding SMs, which TE's ring_exchange cannot be told to run."""
    out: dict[str, dict] = {}
    for p in PASSES:
        for gemm, how in zip(GEMMS, table[p]):
            if how is None:
                continue
            method, chunks, held = how
            if method == "ring" and (chunks, held) != (0, 0):
                raise ValueError(f"{gemm}_{p}: a ring exchange runs in tp chunks holding no SM, got {how}")
            cfg = {"method": METHODS[method]["method"]}
            if method != "ring":
                cfg["num_sm"] = held
            if method == "pipeline":
                cfg["num_splits"] = chunks
            out[f"{gemm}_{p}"] = {**cfg, **METHODS[method]}
    return out


def _scalar(v) -> str:
    return ("true" if v else "false") if isinstance(v, bool) else str(v)


def render(table: dict, precision: str, cluster: str) -> str:
    """The YAML file: a comment naming where the settings come from, then one mapping per GEMM."""
    lines = [f"# Transformer Engine userbuffers settings for Megatron-LM {FLAG} ({precision} on {cluster}):",
             "# Megatron-Bridge's B200 table (@ 067f987d training/comm_overlap.py,",
             "# userbuffers_*_b200_h16384_tp4_cp2_mbs1_seqlen8192) as tuner's prediction charged it",
             "# (tuner.perfmodel.tp_overlap.BLACKWELL_USERBUFFERS); entries left out keep Transformer Engine's",
             "# defaults."]
    for name, cfg in ub_cfgs(table).items():
        lines += [f"{name}:", *(f"  {k}: {_scalar(v)}" for k, v in cfg.items())]
    return "\n".join(lines) + "\n"


def table_for(workload: Workload) -> dict | None:
    """The table the model charges `workload`'s GEMMs with under --tp-comm-overlap (its precision's), else None."""
    return tp_overlap.charged_table(workload.cluster, gemm_format(workload.precision))


def files(workload: Workload, table: dict | None) -> dict[str, str]:
    """{FILE: its text} for `table`, or {} where there is none."""
    return {FILE: render(table, workload.precision, workload.cluster.name)} if table is not None else {}
