"""NCCL's kernels hold SMs while an overlapped collective runs: compute beside them slowed, as a model VARIANT that is
not applied (issue 24).

Run: python benchmarks/overlap_contention.py [--ctas N] [--only NAME ...] [--placement-only]
     (NVIDIA's Llama 3 70B recipe's place in `tuner plan --model llama3-70b --cluster h100 --nodes 8 --global-batch 128`
     and the break-evens without and with the term, then the published-run benchmarks -- moe, framework, llama,
     hardware, scaling -- with the term in place; the model itself is left as it was. Deterministic; no seed.)

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

What it moves (docs/benchmarks.md, issue 24; clean export of 9801381): the recipe from 25th to 17th in plan's order
(18th at 24 CTAs); every Megatron-FSDP layout falls behind it, the tp8 pp2 / pp4-vp8 3D family stays ahead (the LM head
on the last of 4 stages and the GEMM knee, untouched by it). Why it is not applied: seen rows get better in most
families (FSDP bf16 7.2 -> 7.0 %, Megatron-Core fp8 6.4 -> 6.2 %, weak scaling 0.028 -> 0.024) but worse in others --
torchtitan fp8 6.9 -> 7.2 %, llama_accuracy bf16 every row 5.9 -> 6.0 %, MoE 'current' worst -36.3 -> -40.0 % -- and
the one H100 Megatron-FSDP run in the data (Llama 3 8B on 8 GPUs, Megatron-Bridge 25.11) is already predicted too
slow, -9.3 -> -11.1 % (framework_accuracy).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import tuner.perfmodel as perfmodel  # noqa: E402
from tuner.perfmodel import stages  # noqa: E402

#: CTAs of one NCCL collective on an 8-GPU Hopper node ("16 coll channels"; sources in the docstring)
CTAS = 16
#: CTAs of the CP ring's point-to-point send + receive (2 p2p channels per peer, two peers)
P2P_CTAS = 4
_ZERO = {"gemm": 0.0, "attention": 0.0, "elementwise": 0.0}


class Variant:
    """The model with NCCL's SM share charged to the compute its overlapped collectives hide under; restores it on
    exit. `ctas`: one collective's CTAs; `p2p_ctas`: the CP ring's."""

    def __init__(self, ctas: int = CTAS, p2p_ctas: int = P2P_CTAS):
        self.ctas, self.p2p_ctas = ctas, p2p_ctas

    def __enter__(self):
        self.saved = (perfmodel.gradient_sync_time, stages.layer_comm)
        sync, layer_comm = self.saved
        ctas, p2p_ctas = self.ctas, self.p2p_ctas

        def gradient_sync_time(layout, workload, fw, slow, m, params_gpu, experts_gpu, hide=None):
            out = sync(layout, workload, fw, slow, m, params_gpu, experts_gpu, hide)
            sms = workload.cluster.sm_count
            if not sms:
                return out
            bare = sync(layout, workload, fw, {**slow, **_ZERO, stages.HIDDEN: 0.0, stages.SM_SHARE: 0.0}, m,
                        params_gpu, experts_gpu, hide)          # no compute to hide under: the collectives whole
            hidden = max(0.0, bare["grad_reduce"] + bare["param_gather"] - out["grad_reduce"] - out["param_gather"])
            return {**out, "grad_reduce": out["grad_reduce"] + hidden * ctas / sms}

        def comm_of_layer(layout, workload, sh, attention_s):
            out = layer_comm(layout, workload, sh, attention_s)
            sms = workload.cluster.sm_count
            if not sms or sh.c <= 1:
                return out
            ring = layer_comm(layout, workload, sh, 0.0)["cp_comm"]
            hidden = ring - out["cp_comm"]
            return {**out, "cp_comm": out["cp_comm"] + hidden * p2p_ctas / sms}

        perfmodel.gradient_sync_time, stages.layer_comm = gradient_sync_time, comm_of_layer
        return self

    def __exit__(self, *exc):
        perfmodel.gradient_sync_time, stages.layer_comm = self.saved


def placement(ctas: int) -> None:
    """The recipe's place and the layouts above it, without and with the term."""
    import placement_terms as pt
    for label, variant in (("the model as it is", None), (f"NCCL's SM share ({ctas} CTAs, {P2P_CTAS} for the CP ring)",
                                                          Variant(ctas))):
        if variant:
            variant.__enter__()
        try:
            w = pt.workload()
            faster, recipe, place = pt.above_recipe(w)
            ahead = [pr for pr in faster if pr.p_fit >= recipe.p_fit * pr.step_time_s / recipe.step_time_s]
            print(f"== {label}: recipe step {recipe.step_time_s:.3f} s ({name_terms(recipe)}), {place}th in plan's "
                  f"order; {len(faster)} layouts that may fit predicted faster, {len(ahead)} of them ahead in plan")
            for ranks, pr in pt.grouped(faster):
                print(f"  {','.join(map(str, ranks)):<8} {pt.name(pr.layout):<52} step {pr.step_time_s:.3f} s, "
                      f"p_fit {pr.p_fit:.3f}, dp {pr.time_breakdown['dp_grad_reduce']:.3f} "
                      f"cp {pr.time_breakdown.get('cp_comm', 0.0):.3f}")
        finally:
            if variant:
                variant.__exit__()


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
    ap = argparse.ArgumentParser(description="NCCL's SM share beside overlapped collectives as a variant (not applied)")
    ap.add_argument("--ctas", type=int, default=CTAS, help="CTAs (SMs) one NCCL collective holds (default 16)")
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
