"""NCCL's kernels hold SMs while an overlapped collective runs: compute beside them slowed (issue 24). A model term
since issue 24 round 13 (tuner.perfmodel.comm.sm_share, NCCL_CTAS / NCCL_P2P_CTAS); before, a variant this file built.

Run: python benchmarks/overlap_contention.py [--ctas N] [--only NAME ...] [--placement-only]
     (NVIDIA's Llama 3 70B recipe's place in `tuner plan --model llama3-70b --cluster h100 --nodes 8 --global-batch 128`
     without the term and with it at N CTAs, then the published-run benchmarks -- moe, framework, llama, hardware,
     scaling -- at N CTAs (--ctas 0: the model without the term). Deterministic; no seed.)

The question (docs/benchmarks.md, issue 24): the layouts `plan` places above the recipe (tp4 sp cp2 pp4 vp5 mb1) are
mostly Megatron-FSDP tp8 dp8 mb2 (its per-layer all-gathers and reduce-scatters run 6-13 s of a 13-14 s step beside
compute) and tp8 pp2 / pp4 vp8 3D layouts. The model counts an overlapped collective only where it outlasts the
compute it hides under, and the compute as if the collective took nothing from it. Where that is not so, from source:

- NCCL's kernels launch one CTA per channel, and a CTA holds its SM alone: "NCCL CTAs won't share an SM with compute
  kernels" (NCCL maintainer, NVIDIA/nccl issue #689, 2023-08; it takes all of an SM's registers). So compute beside a
  collective runs on sm_count - CTAS SMs: it loses hidden x CTAS / sm_count seconds (the term moe_exchange.sm_contention
  already charges DeepEP's 20 SMs with, here for NCCL's collectives).
- How many CTAs an H100's collective launches: NCCL's init logs on 8-GPU Hopper nodes print "16 coll channels"
  (NVIDIA/nccl #892 on H800, deepseek-ai/DeepEP #106 on a multi-node Hopper run), and the maintainer gives 16 SMs for
  a DGX with 8 NICs (#689); an H100 nsys trace of an all-gather beside a GEMM shows 24 blocks (NVIDIA developer forum,
  'Compute-Communication Overlap Causes Severe GEMM Performance Degradation because of Tail Effect'). CTAS 16 is the
  default, --ctas 24 the other reading; point-to-point (the CP ring) launches 2 channels per peer ("2 p2p channels per
  peer", the same logs), 4 CTAs for a ring's send and receive.
- What it leaves out: HBM and L2 bandwidth the collective's copies take from the compute, and the wave quantisation
  the forum trace shows (a one-wave GEMM pushed into a second): a characterisation on 4-GPU A100 / H100 nodes
  measures compute 18.9 % slower on average (40 % at most) while communication overlaps it (arXiv 2507.03114). The
  SM share alone (12 % at 16 of 132 SMs) is the part a source gives a number to.

Where it is charged: the data-parallel gradient reduce-scatter / parameter all-gather Megatron-Core overlaps with the
last backward / first forward, Megatron-FSDP's and FSDP2's per-layer all-gathers and reduce-scatters (the seconds of
each that hide under compute: the collective's whole time less what the model shows), and the CP ring under the
attention core (every framework's: the model hides the ring under attention for all); on clusters whose file states
sm_count (h100, h200: the Hopper machines those sources measured).
Not charged: Transformer Engine's TP overlap (userbuffers, not NCCL; its own SM counts are costed in
benchmarks/h100_gap.py) and the MoE exchange (the flex dispatcher's term exists; the alltoall dispatcher's NCCL
kernels are left in the cluster's efficiencies as moe_exchange says). The lost compute is added to the step (the
breakdown's dp_grad_reduce and cp_comm carry it), not re-overlapped: a first-order charge.

What it moved as a variant (docs/benchmarks.md, issue 24; clean export of 9801381, before Transformer Engine's
TP collectives were each bound to their own GEMM): the recipe from 25th to 17th in plan's order
(18th at 24 CTAs); every Megatron-FSDP layout falls behind it, the tp8 pp2 / pp4-vp8 3D family stays ahead (the LM head
on the last of 4 stages and the GEMM knee, untouched by it). Why it was not applied then: seen rows got better in most
families (FSDP bf16 7.2 -> 7.0 %, Megatron-Core fp8 6.4 -> 6.2 %, weak scaling 0.028 -> 0.024) but worse in others --
torchtitan fp8 6.9 -> 7.2 %, llama_accuracy bf16 every row 5.9 -> 6.0 %, MoE 'current' worst -36.3 -> -40.0 % -- and
the one H100 Megatron-FSDP run in the data (Llama 3 8B on 8 GPUs, Megatron-Bridge 25.11) is already predicted too
slow, -9.3 -> -11.1 % (framework_accuracy). Applied in round 13 as a term from source, decided before any benchmark
ran with it, as the collectives' other physics (each TP collective under its own GEMM, tuner.perfmodel.tp_overlap)
went in: a source-backed term is not left out for what a few rows say; its figures are in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from tuner.perfmodel import comm  # noqa: E402

class Variant:
    """The model with NCCL's SM share at `ctas` CTAs a collective and `p2p_ctas` for the CP ring (0, 0: the model
    without the term); restores tuner.perfmodel.comm's constants on exit."""

    def __init__(self, ctas: int = comm.NCCL_CTAS, p2p_ctas: int = comm.NCCL_P2P_CTAS):
        self.ctas, self.p2p_ctas = ctas, p2p_ctas

    def __enter__(self):
        self.saved = (comm.NCCL_CTAS, comm.NCCL_P2P_CTAS)
        comm.NCCL_CTAS, comm.NCCL_P2P_CTAS = self.ctas, self.p2p_ctas
        return self

    def __exit__(self, *exc):
        comm.NCCL_CTAS, comm.NCCL_P2P_CTAS = self.saved


def placement(ctas: int) -> None:
    """The recipe's place and the layouts above it, without and with the term."""
    import placement_terms as pt
    for label, variant in (("without the term", Variant(0, 0)),
                           (f"NCCL's SM share ({ctas} CTAs, {comm.NCCL_P2P_CTAS} for the CP ring)", Variant(ctas))):
        variant.__enter__()
        try:
            w = pt.workload()
            faster, recipe, place = pt.above_recipe(w)
            ahead = [pr for pr in faster if pr.p_fit >= recipe.p_fit * pr.step_time_s / recipe.step_time_s]
            print(f"== {label}: recipe step {recipe.step_time_s:.3f} s ({name_terms(recipe)}), {_ordinal(place)} in plan's "
                  f"order; {len(faster)} layouts that may fit predicted faster, {len(ahead)} of them ahead in plan")
            for ranks, pr in pt.grouped(faster):
                print(f"  {','.join(map(str, ranks)):<8} {pt.name(pr.layout):<52} step {pr.step_time_s:.3f} s, "
                      f"p_fit {pr.p_fit:.3f}, dp {pr.time_breakdown['dp_grad_reduce']:.3f} "
                      f"cp {pr.time_breakdown.get('cp_comm', 0.0):.3f}")
        finally:
            variant.__exit__()


def _ordinal(n: int) -> str:
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


def name_terms(pr) -> str:
    t = pr.time_breakdown
    return f"dp_grad_reduce {t['dp_grad_reduce']:.3f}, cp_comm {t.get('cp_comm', 0.0):.3f}"


def main(argv=None) -> None:
    import framework_accuracy
    import hardware_accuracy
    import llama_accuracy
    import moe_accuracy
    import scaling_accuracy
    benches = {"moe": moe_accuracy, "framework": framework_accuracy, "llama": llama_accuracy,
               "hardware": hardware_accuracy, "scaling": scaling_accuracy}
    ap = argparse.ArgumentParser(description="NCCL's SM share beside overlapped collectives: the recipe's place and the "
                                             "published-run benchmarks at another CTA count (0: without the term)")
    ap.add_argument("--ctas", type=int, default=comm.NCCL_CTAS,
                    help="CTAs (SMs) one NCCL collective holds (default: the model's, 16)")
    ap.add_argument("--only", nargs="+", choices=sorted(benches), help="run only these benchmarks")
    ap.add_argument("--placement-only", action="store_true", help="only the recipe's place, no benchmark")
    args = ap.parse_args(argv)
    placement(args.ctas)
    if args.placement_only:
        return
    with Variant(args.ctas):
        for name in args.only or benches:
            print()
            benches[name].main() if name != "scaling" else benches[name].main([])


if __name__ == "__main__":
    main()
