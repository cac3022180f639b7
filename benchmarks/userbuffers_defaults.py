"""What Transformer Engine's TP-overlap defaults cost a layer's GEMMs against the settings table a recipe sets.

Run: python benchmarks/userbuffers_defaults.py   (deterministic, under a second; no seed, no published row)

`tuner launch` writes the table the model charges (tuner.render.userbuffers) on b200 / gb200, and no file elsewhere,
where Megatron-LM then runs `initialize_ub`'s defaults (NVIDIA/TransformerEngine @ d0067d0d
transformer_engine/pytorch/module/base.py lines 384-386: a ring exchange 1 SM, no margin; every pipeline and bulk
overlap 16 SMs with the SM margin, a pipeline in 4 splits). Each line is the model's own account of a dense layer's
GEMMs per micro-batch (tuner.perfmodel.tp_overlap.overlapped_gemm_seconds) under a table, as a share over the same
GEMMs whole on every SM: the recipes' table (B200: BLACKWELL_USERBUFFERS; H100: NeMo's Llama 3 70B table,
benchmarks/h100_gap.py, on its microbenchmark GEMM curve) and TE's defaults, written in the same form (a bulk transfer
with the margin runs its GEMM whole on sm_count - 16 SMs: a one-chunk "pipeline").
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import h100_gap  # noqa: E402
from tuner.perfmodel import compute, tp_overlap  # noqa: E402
from tuner.specs import load_cluster, load_model  # noqa: E402

_TE = {"fprop": (("ring", 0, 0), ("pipeline", 4, 16), ("ring", 0, 0), ("pipeline", 4, 16)),
       "dgrad": (("pipeline", 1, 16), ("ring", 0, 0), ("pipeline", 1, 16), ("ring", 0, 0)),
       "wgrad": (("pipeline", 1, 16), None, ("pipeline", 1, 16), None)}
TE_DEFAULTS = {"bf16": _TE, "fp8": _TE}       # the defaults do not depend on the precision
# (model, cluster, tp, cp, the recipes' table, its name, a GEMM curve other than the file's)
CASES = (("llama3-405b", "b200", 4, 2, tp_overlap.BLACKWELL_USERBUFFERS, "Megatron-Bridge B200", None),
         ("llama3-70b", "b200", 4, 1, tp_overlap.BLACKWELL_USERBUFFERS, "Megatron-Bridge B200", None),
         ("llama3-70b", "h100", 4, 2, h100_gap.H100_SETTINGS, "NeMo H100", h100_gap.MEASURED))


def shares(model: str, cluster: str, tp: int, cp: int, table: dict, curve: dict | None, fp8) -> tuple[float, float]:
    """(the table's, TE's defaults') GEMM seconds over the GEMMs whole, less 1, at micro-batch 1 with sequence
    parallelism."""
    m, c = load_model(model), load_cluster(cluster)
    c = dataclasses.replace(c, **curve) if curve else c
    sh = compute.Shape(b=1, t=tp, c=cp, sp=True, fp8=fp8)
    whole = compute.layer_times(m, c, sh)["gemm"]
    return tuple(tp_overlap.overlapped_gemm_seconds(m, c, sh, t, c.sm_count) / whole - 1.0
                 for t in (table, TE_DEFAULTS))


def main() -> None:
    for model, cluster, tp, cp, table, name, curve in CASES:
        for fp8 in (False, "fp8"):
            ours, te = shares(model, cluster, tp, cp, table, curve, fp8)
            print(f"{model} {cluster} tp{tp} cp{cp} mb1 {fp8 or 'bf16'}"
                  f"{' (microbenchmark GEMM curve)' if curve else ''}: {name} table {100 * ours:.1f} %, "
                  f"TE defaults {100 * te:.1f} % of the GEMMs")


if __name__ == "__main__":
    main()
