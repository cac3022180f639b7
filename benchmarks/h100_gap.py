"""The H100 step time the model misses under a measured GEMM curve, and what Megatron-Core's TP overlap accounts for.

Run: python benchmarks/h100_gap.py   (deterministic, a few CPU seconds; no seed)

h100.toml's GEMM curve (matmul_efficiency 0.7, gemm_knee_gflop 60) is a guess; GEMM microbenchmarks give 0.818 and
5.5 GFLOP (XLA's sm_90 cuBLAS table, tensorflow/tensorflow @ 372d578bb861, and Stas Bekman's MAMF finder: h100.toml
says how). This prints the published Megatron-Core dense runs on H100 / H200 (benchmarks/framework_accuracy.py's
rows) under four models, none of them fitted to a row:
  guess     the cluster files as they are;
  measured  the microbenchmark curve on H100 and H200 (the same die);
  +tp       either curve plus the cost of Transformer Engine's TP overlap itself (`tp_overlap_seconds`): each GEMM
            run as NeMo's H100 recipe sets it, chunked along the tokens and beside communication kernels that hold
            SMs.
Every choice is made on the TUNING rows (all but published.clean's), grouped by tp and cp; the held-out rows are
printed after, once, as they come out. The last lines place NVIDIA's Llama 3 70B recipe (tp4 sp cp2 pp4 vp5 mb1)
in `tuner plan --model llama3-70b --cluster h100 --nodes 8 --global-batch 128` under each model (issue 24).
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import framework_accuracy as fa  # noqa: E402
import published  # noqa: E402
from tuner.perfmodel import compute, rank, tp_overlap  # noqa: E402
from tuner.cluster_spec import ClusterSpec  # noqa: E402
from tuner.space import load_space, valid_layouts  # noqa: E402
from tuner.specs import load_cluster, load_model, make_workload  # noqa: E402

#: GEMM microbenchmarks' curve of an H100 SXM (h100.toml's comment gives the sources); H200 is the same die.
MEASURED = {"matmul_efficiency": 0.818, "gemm_knee_gflop": 5.5}
MACHINES = ("h100", "h200")
# Transformer Engine's userbuffers TP overlap binds each TP collective to one GEMM and runs it one of three ways
# (NVIDIA/TransformerEngine @ d0067d0d, transformer_engine/common/comm_gemm_overlap/comm_gemm_overlap.cpp):
# "ring" (ring_exchange, aggregate off: the GEMM split into tp chunks along the tokens, one per p2p step on copy
# engines), "pipeline" (split into num_splits chunks on sm_count - num_sm SMs: `_math_sms = sm_count - num_comm_sm`
# with set_sm_margin, line 143, while a reduce-scatter kernel holds num_sm SMs), "bulk" (the whole GEMM on every SM
# beside an all-gather / reduce-scatter kernel of num_sm SMs launched first, which holds them until its transfer ends).
# NeMo's H100 settings for Llama 3 70B (NVIDIA/NeMo @ 26005325d0, nemo/collections/llm/recipes/tp_overlap_configs/
# userbuffers.py, userbuffers_{bf16,fp8}_h100_h8192_tp4_mbs1_seqlen8192), per GEMM (qkv, proj, fc1, fc2) and pass:
# (method, chunks: 0 = tp, SMs the communication holds). FP8 runs proj and fc2 fprop as ring exchanges too.
TP_OVERLAP = {"fprop": (("ring", 0, 0), ("pipeline", 4, 24), ("ring", 0, 0), ("pipeline", 4, 16)),
              "dgrad": (("bulk", 1, 4), ("ring", 0, 0), ("bulk", 1, 2), ("ring", 0, 0)),
              "wgrad": (("bulk", 1, 24), None, ("bulk", 1, 4), None)}
TP_OVERLAP_FP8_FPROP = (("ring", 0, 0),) * 4
SMS = 132                   # an H100 SXM's (and H200's) SMs, what those counts are out of
RECIPE = dict(tp=4, sequence_parallel=True, context_parallel=2, pp=4, virtual_pipeline=5, micro_batch=1,
              zero_stage=1, recompute="none")


#: TP_OVERLAP by precision, as tp_overlap_seconds takes a machine's settings.
H100_SETTINGS = {"bf16": TP_OVERLAP, "fp8": {**TP_OVERLAP, "fprop": TP_OVERLAP_FP8_FPROP}}


def tp_overlap_seconds(model, cluster, shape: compute.Shape, settings: dict = H100_SETTINGS, sms: int = SMS) -> float:
    """A dense layer's GEMM seconds per micro-batch (forward, its recompute, both backward GEMMs) under `settings`
    (per precision, per pass: H100_SETTINGS, or tp_overlap.BLACKWELL_USERBUFFERS) out of `sms` SMs: the model's
    account, tuner.perfmodel.tp_overlap.overlapped_gemm_seconds (chunks one after another on the GEMM curve; a
    pipeline's SMs lost for the whole GEMM, a bulk transfer's while it lasts)."""
    return tp_overlap.overlapped_gemm_seconds(model, cluster, shape, settings, sms)


class Variant:
    """One of the three models: the cluster files' constants replaced on H100 / H200, and the TP-overlap cost on
    layers whose TP group runs Megatron-Core's overlap (sequence parallelism, inside the node)."""

    def __init__(self, curve: dict | None, tp_cost: bool):
        self.curve, self.tp_cost = curve, tp_cost

    def __enter__(self):
        self.saved = (ClusterSpec.__dict__["from_dict"], compute.layer_times)
        from_dict, layer_times = self.saved[0].__func__, self.saved[1]
        curve = self.curve

        def read(cls, d, *args, **kwargs):       # every reader of a cluster file (the rows', plan's) comes here
            return from_dict(cls, {**d, **curve} if curve and d.get("name") in MACHINES else d, *args, **kwargs)

        def layers(model, cl, shape):
            out = layer_times(model, cl, shape)
            if self.tp_cost and shape.sp and 1 < shape.t <= cl.gpus_per_node and cl.software == "cuda":
                out = {**out, "gemm": tp_overlap_seconds(model, cl, shape)}
            return out

        ClusterSpec.from_dict, compute.layer_times = classmethod(read), layers
        return self

    def __exit__(self, *exc):
        ClusterSpec.from_dict, compute.layer_times = self.saved


def rows() -> list[dict]:
    """framework_accuracy's distinct Megatron-Core dense configurations on H100 / H200."""
    return [r for r in fa.load_rows() if r["framework"] == "megatron-core" and not r.get("num_experts")
            and r.get("machine", r["cluster"]) in MACHINES]


def line(label: str, errors: list[float]) -> str:
    if not errors:
        return f"  {label:<22} no rows"
    a = [abs(e) for e in errors]
    return (f"  {label:<22} {len(a):3d} rows, median |error| {100 * statistics.median(a):5.1f} %, mean "
            f"{100 * statistics.fmean(errors):+6.1f} %, worst {100 * max(errors, key=abs):+6.1f} %")


def recipe_rank(cluster) -> tuple[int, int]:
    """The recipe's place in `tuner plan`'s order (rank_key) for Llama 3 70B on 8 H100 nodes, global batch 128."""
    w = make_workload(load_model("llama3-70b"), 8, cluster, 128, precision="bf16", framework="megatron-core")
    ranked = rank(valid_layouts(load_space("default"), w), w)
    for i, pr in enumerate(ranked, 1):
        lay = pr.layout
        if all(getattr(lay, k) == v for k, v in RECIPE.items()) and lay.pipeline_split == "auto":
            return i, len(ranked)
    return -1, len(ranked)


VARIANTS = {"guess": (None, False), "guess +tp": (None, True), "measured": (MEASURED, False),
            "measured +tp": (MEASURED, True)}


def main() -> dict:
    out = {}
    data = rows()
    for name, (curve, tp_cost) in VARIANTS.items():
        with Variant(curve, tp_cost):
            ev = [(r, fa.evaluate(r)) for r in data]
            out[name] = {"rows": ev, "rank": recipe_rank(load_cluster("h100"))}
    print("== Megatron-Core dense runs on H100 / H200 (tokens/s/GPU: predicted / measured - 1), TUNING rows")
    groups = {"tp 1, cp 1": (lambda l: l.tp == 1 and l.context_parallel == 1),
              "tp 1, cp > 1": (lambda l: l.tp == 1 and l.context_parallel > 1),
              "tp > 1, cp 1": (lambda l: l.tp > 1 and l.context_parallel == 1),
              "tp > 1, cp > 1": (lambda l: l.tp > 1 and l.context_parallel > 1), "all": (lambda l: True)}
    for name in VARIANTS:
        print(f"{name}:")
        for g, pred in groups.items():
            print(line(g, [e["error"] for r, e in out[name]["rows"]
                           if not e["refused"] and not published.clean(r, "speed") and pred(e["layout"])]))
    print("== the same, held-out rows (published.clean; printed after the tuning lines, no choice made on them)")
    for name in VARIANTS:
        held = [e["error"] for r, e in out[name]["rows"] if not e["refused"] and published.clean(r, "speed")]
        print(line(name, held))
    print("== NVIDIA's Llama 3 70B recipe (tp4 sp cp2 pp4 vp5 mb1) in plan's order, 8 H100 nodes, global batch 128")
    for name in VARIANTS:
        i, n = out[name]["rank"]
        print(f"  {name:<12} rank {i} of {n}")
    return out


if __name__ == "__main__":
    main()
