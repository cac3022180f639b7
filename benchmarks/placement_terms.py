"""Why NVIDIA's Llama 3 70B recipe is not in plan's top 5: every layout predicted faster, term by term (issue 24).

Run: python benchmarks/placement_terms.py   (deterministic, a few CPU seconds; no seed)

`tuner plan --model llama3-70b --cluster h100 --nodes 8 --global-batch 128` ranks NVIDIA's recipe (tp4 sp cp2 pp4
vp5 mb1, the distributed optimizer, no recompute; dgxc-benchmarking's Llama 3.1 70B, measured 14.61-14.72 s per
step) below layouts the model predicts faster. This prints each of them with its predicted step and, per term of
the perfmodel's step-time breakdown (`tuner predict`'s `time` line), its seconds minus the recipe's: a negative
figure is a term that favours the layout. Layouts whose predictions are identical in every term (cp 2 with twice
the micro-batch of cp 1, ...) are printed once, with the ranks they hold. The last block splits the GEMM term into
the GEMM size each layout runs (the per-GEMM GFLOP of a layer's four GEMMs) and the efficiency the cluster's
curve gives it, and the GEMM term's difference into its two causes: the knee of h100.toml's guessed curve
(eta(F) = eta_max F / (F + knee): every GEMM call pays knee / (eta_max peak) seconds, 87 us at 0.7 / 60 GFLOP, so
fewer, larger GEMMs -- micro-batch 2, pp 1 -- pay less) and the FLOPs the slowest stage runs (the LM head on the
last of pp stages). Then the same placement under the GEMM microbenchmarks' curve (0.818 / 5.5 GFLOP,
benchmarks/h100_gap.py's MEASURED) and, for each Megatron-FSDP layout predicted faster, the seconds its
all-gathers and reduce-scatters run under compute per step and the compute slowdown while they run that would
close its lead (a break-even, not a fitted figure). Nothing here is fitted; it reads the model as `plan` runs it.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from h100_gap import MEASURED, RECIPE, Variant  # noqa: E402
from tuner.frameworks import megatron_fsdp, of as framework_of  # noqa: E402
from tuner.layout import micro_batches_per_pipeline  # noqa: E402
from tuner.perfmodel import compute, fsdp_time, rank, shape_of  # noqa: E402
from tuner.space import load_space, valid_layouts  # noqa: E402
from tuner.specs import load_cluster, load_model, make_workload  # noqa: E402

TERMS = ("gemm", "attention", "elementwise", "tp_comm", "cp_comm", "p2p", "microbatch_overhead", "bubble",
         "dp_grad_reduce", "dp_param_gather", "optimizer")


def workload(cluster: str = "h100"):
    return make_workload(load_model("llama3-70b"), 8, load_cluster(cluster), 128, precision="bf16",
                         framework="megatron-core")


def is_recipe(layout) -> bool:
    return all(getattr(layout, k) == v for k, v in RECIPE.items()) and layout.pipeline_split == "auto"


def name(lay) -> str:
    parts = [f"tp{lay.tp}", "sp" if lay.sequence_parallel else "", f"cp{lay.context_parallel}",
             f"pp{lay.pp}", f"vp{lay.virtual_pipeline}", "" if lay.pipeline_split == "auto" else lay.pipeline_split,
             f"dp{lay.dp}", f"mb{lay.micro_batch}", f"z{lay.zero_stage}", lay.recompute]
    return " ".join(p for p in parts if p)


def above_recipe(w, offload: bool = True) -> tuple[list, object, int]:
    """The layouts predicted faster than the recipe (shorter step, not ruled out by memory), fastest first; the
    recipe's prediction; its place in plan's order (rank_key: speed x p_fit), which p_fit also moves. `offload` False:
    among the layouts that offload no activations to the host (the default space's offloaded twins left out)."""
    ranked = [pr for pr in rank(valid_layouts(load_space("default"), w), w) if offload or not pr.layout.offload_layers]
    place = next(i for i, pr in enumerate(ranked, 1) if is_recipe(pr.layout))
    recipe = ranked[place - 1]
    faster = sorted((pr for pr in ranked if pr.fits and pr.step_time_s < recipe.step_time_s),
                    key=lambda pr: pr.step_time_s)
    return faster, recipe, place


def grouped(preds: list) -> list[tuple[list[int], object]]:
    """Predictions identical in every term, printed once with their ranks."""
    out: list[tuple[list[int], object]] = []
    for i, pr in enumerate(preds, 1):
        key = tuple(round(pr.time_breakdown.get(k, 0.0), 9) for k in TERMS) + (round(pr.p_fit, 6),)
        for ranks, first in out:
            if first[0] == key:
                ranks.append(i)
                break
        else:
            out.append(([i], (key, pr)))
    return [(ranks, pr) for ranks, (_, pr) in out]


def gemm_line(w, pr) -> str:
    sh = shape_of(pr.layout, w)
    flops = compute.layer_gemm_flops(w.model, sh.tokens, sh.t)
    effs = [compute.gemm_efficiency(w.cluster, f / 1e9) for f in flops]
    return ("GFLOP " + " / ".join(f"{f / 1e9:5.0f}" for f in flops) + "   efficiency "
            + " / ".join(f"{e:.3f}" for e in effs))


def knee_free(w, layouts: list) -> dict:
    """Each layout's GEMM seconds per step with h100.toml's knee removed (eta_max kept): what is left of the GEMM
    term is FLOPs over a constant rate."""
    with Variant({"gemm_knee_gflop": 1e-9}, False):
        wk = workload()
        ranked = {pr.layout: pr for pr in rank(layouts, wk)}
    return {lay: ranked[lay].time_breakdown["gemm"] for lay in layouts}


def fsdp_busy(w, pr) -> float:
    """A Megatron-FSDP layout's all-gather + reduce-scatter seconds per step, none hidden (fsdp_time with no
    compute to hide under: what runs beside the layers' compute when it is hidden)."""
    m = micro_batches_per_pipeline(pr.layout, w.global_batch)
    out = fsdp_time(pr.layout, w, 0.0, m, framework_of(w).grad_bytes(w), gathers=pr.layout.zero_stage >= 3)
    return out["grad_reduce"] + out["param_gather"]


def under_measured_curve() -> None:
    """The placement under the GEMM microbenchmarks' curve, without and with Transformer Engine's TP-overlap cost."""
    for label, tp_cost in (("", False), (" + Transformer Engine's TP-overlap cost (h100_gap.tp_overlap_seconds)", True)):
        with Variant(MEASURED, tp_cost):
            wm = workload()
            faster, rec_m, place_m = above_recipe(wm)
        sure = [pr for pr in faster if pr.p_fit >= 0.5]
        print(f"== under the GEMM microbenchmarks' curve {MEASURED}{label}: recipe step {rec_m.step_time_s:.3f} s, "
              f"{place_m}th in plan's order; {len(faster)} layouts predicted faster ({len(sure)} with p_fit >= 0.5):")
        for ranks, pr in grouped(faster):
            print(f"  {','.join(map(str, ranks)):<8} {name(pr.layout):<46} step {pr.step_time_s:.3f} s, "
                  f"p_fit {pr.p_fit:.3f}")


def main() -> None:
    w = workload()
    above, recipe, place = above_recipe(w)
    base = recipe.time_breakdown
    print(f"== Llama 3 70B, 8 H100 nodes, global batch 128: the recipe is {place}th in plan's order (speed x p_fit); "
          f"{len(above)} layouts that may fit are predicted faster, fastest first")
    print(f"recipe ({name(recipe.layout)}): step {recipe.step_time_s:.3f} s, p_fit {recipe.p_fit:.4f}; per term: "
          + ", ".join(f"{k} {base.get(k, 0.0):.3f}" for k in TERMS))
    head = "speed ranks  layout                                         step_s  p_fit   " + " ".join(
        f"{k[:9]:>9}" for k in TERMS)
    print(head)
    for ranks, pr in grouped(above):
        d = [pr.time_breakdown.get(k, 0.0) - base.get(k, 0.0) for k in TERMS]
        print(f"{','.join(map(str, ranks)):<12} {name(pr.layout):<46} {pr.step_time_s:6.3f} {pr.p_fit:6.4f} "
              + " ".join(f"{x:+9.3f}" for x in d))
    print("== the GEMM term: a layer's qkv / proj / fc1 / fc2 GEMM per micro-batch and the curve's efficiency "
          f"(matmul_efficiency {w.cluster.matmul_efficiency}, gemm_knee_gflop {w.cluster.gemm_knee_gflop})")
    print(f"  recipe {name(recipe.layout):<46} {gemm_line(w, recipe)}")
    groups = grouped(above)
    for ranks, pr in groups:
        print(f"  {ranks[0]:>6} {name(pr.layout):<46} {gemm_line(w, pr)}")
    flat = knee_free(w, [recipe.layout] + [pr.layout for _, pr in groups])
    base_gemm, base_flat = recipe.time_breakdown["gemm"], flat[recipe.layout]
    print("== the GEMM term's difference from the recipe's, split: the knee's per-call cost | the FLOPs (LM head) "
          "(s per step)")
    for ranks, pr in groups:
        d = pr.time_breakdown["gemm"] - base_gemm
        dflat = flat[pr.layout] - base_flat
        print(f"  {ranks[0]:>6} {name(pr.layout):<46} gemm {d:+7.3f} = knee {d - dflat:+7.3f} + flops {dflat:+7.3f}")
    under_measured_curve()
    print("== Megatron-FSDP layouts predicted faster: their collectives beside compute and the break-even slowdown")
    for ranks, pr in groups:
        if not megatron_fsdp(pr.layout, w):
            continue
        busy, lead = fsdp_busy(w, pr), recipe.step_time_s - pr.step_time_s
        print(f"  {ranks[0]:>6} {name(pr.layout):<46} lead {lead:.3f} s; all-gather + reduce-scatter {busy:.2f} s "
              f"per step: a compute slowdown of {100 * lead / busy:.1f} % while they run closes the lead")


if __name__ == "__main__":
    main()
