"""Fused attention's rate by sequence length on Hopper, as a model VARIANT that is not applied (issue 25).

Run: python benchmarks/attention_curve.py   (the published-run benchmarks -- moe, framework, llama, hardware -- with
     the curve below in place of the flat constant; the model itself is left as it was. Deterministic, ~1 min.)

The question (docs/benchmarks.md, MoE round 5): the Megatron-MoE-ModelZoo's Qwen3-235B-A22B long-context H100 rows
are predicted 15-28 % too slow, more so as the sequence grows, and attention is most of their step. h100.toml
runs attention at one constant, attention_efficiency 0.7 of Megatron's full-s^2 count, while fused kernels fill
the GPU better at long sequences. The variant: on a GPU whose kernels were measured by sequence, the time of one
counted attention FLOP is

    forward:  share_fwd / (peak * attention_efficiency) * R_fwd(anchor) / R_fwd(s_k, cp)
    backward: share_bwd / (peak * attention_efficiency) * R_bwd(anchor) / R_bwd(s_k, cp)

with R the kernels' measured rates at the kernel's sequence s_k = s / cp (linear in log2 s, held beyond the
measured 512-16k), (share_fwd, share_bwd) the anchor's forward + backward time (1 + FLASH_BACKWARD_FLOPS) split as
the kernels split it (their backward / forward time ratio, 3.3 at 2k, instead of the FLOP ratio 2.5), and the
anchor -- causal, cp 1 -- the sequence the cluster constant was set for: 2048 (ANCHOR_SEQUENCE). Context
parallelism (Transformer Engine's p2p ring over load-balanced chunks, torchtitan's ring): 1/cp of a rank's work
runs causal (the diagonal step), the rest unmasked. Only the curves' shape is taken from the microbenchmarks;
nothing is fitted on training throughput.

Why it is not applied (figures in docs/benchmarks.md): it moves the ModelZoo rows as expected (16k / 32k / 64k /
128k: -14.8 / -20.6 / -25.1 / -27.5 % -> -9.0 / -10.1 / -10.0 / -8.5 %), but every other long-context H100 family
the other way: NeMo 24.03's Llama 2 7B rows (16K-1M, CP 1-32; fresh, committed before any prediction) +8.2..+11.9 %
-> +19.0..+50.1 %, llm-foundry's MPT rows at 16k-65k -8..+3 % -> +3..+25 %, torchtitan's rows at 32k-262k -24..+3 % ->
-4..+33 %, and the 8k rows 2-8 points faster. The kernels' gain from 2k to long sequences does not show in
training runs other than the ModelZoo's; what the ModelZoo rows miss is something else (or their kernels' era).
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from tuner.perfmodel import compute, moe  # noqa: E402
from tuner.perfmodel.compute import FLASH_BACKWARD_FLOPS  # noqa: E402
from tuner.specs import ClusterSpec, load_cluster  # noqa: E402  (ClusterSpec: annotations)

# The sequence h100.toml's attention_efficiency 0.7 was set for: it came with the model's first commit
# (0e77068), when every preset workload was GPT-3-style at seq_length 2048 (gpt-1.4b / 22b / 175b / 1t, the
# Frontier study's); h200 / h800 / h100-gt copied it.
ANCHOR_SEQUENCE = 2048

# H100 80GB SXM5, BF16, head dim 128, hidden 2048 (16 heads), batch x sequence = 16k tokens: FlashAttention-3
# paper (Shah, Bikshandi, Zhang, Thakkar, Ramani, Dao, arXiv 2407.08608 v2), Figure 5 (forward, the panels "with
# causal mask" and "without causal mask", head dim 128) and Figure 6 (backward, head dim 128, no causal mask), the
# cuDNN bars: the kernel Megatron-Core runs on Hopper, where Transformer Engine's get_attention_backend disables
# FlashAttention "to give FusedAttention preference on Hopper+ for performance reasons"
# (NVIDIA/TransformerEngine transformer_engine/pytorch/attention/dot_product_attention/utils.py).
# TFLOPS (on each pass's real FLOPs) at sequence 512, 1k, 2k, 4k, 8k, 16k.
SEQUENCES = (512, 1024, 2048, 4096, 8192, 16384)
H100_CUDNN_FWD_CAUSAL = (315.0, 410.0, 484.0, 518.0, 529.0, 539.0)
H100_CUDNN_FWD_FULL = (497.0, 574.0, 617.0, 609.0, 600.0, 595.0)
H100_CUDNN_BWD_FULL = (305.0, 408.0, 465.0, 499.0, 518.0, 516.0)
# The paper gives no causal backward panel: ESTIMATE, the backward's causal / unmasked ratio taken as the
# forward's at the same sequence (the masked diagonal tiles are the same share of either pass).
H100_CUDNN_BWD_CAUSAL = tuple(b * c / f for b, c, f in zip(H100_CUDNN_BWD_FULL, H100_CUDNN_FWD_CAUSAL,
                                                           H100_CUDNN_FWD_FULL))
# PyTorch SDPA's FlashAttention-2 (torchtitan; compute.FA2_ON_HOPPER) keeps the same shape: the same figures'
# FlashAttention-2 bars over cuDNN's, causal forward, are 0.616 / 0.634 / 0.630 / 0.622 at 2k / 4k / 8k / 16k,
# flat within 2 %, so one curve serves both and FA2_ON_HOPPER stays their ratio.

#: Hopper-class GPUs (CUDA, an FP8 peak, no block-scaled tensor cores): H100, H100 on Grand Teton, H800 and
#: H200 (the same GH100 SMs; H200 differs in HBM, which fused attention at these sequences does not bind on).
HOPPER = {"fwd_causal": H100_CUDNN_FWD_CAUSAL, "fwd_full": H100_CUDNN_FWD_FULL,
          "bwd_causal": H100_CUDNN_BWD_CAUSAL, "bwd_full": H100_CUDNN_BWD_FULL}


def rates_of(cluster: ClusterSpec) -> dict | None:
    """The measured kernel curves that describe `cluster`'s fused attention, or None (the flat constant: Blackwell,
    AMD, Frontier and A100 presets, whose kernels were not found measured by sequence)."""
    if cluster.flash_attention and cluster.software == "cuda" and cluster.peak_tflops_fp8 \
            and not cluster.block_scaled:
        return HOPPER
    return None


def _at(curve: tuple[float, ...], seq: float) -> float:
    """A curve's rate at `seq`, linear in log2(seq) between the measured sequences, held beyond them."""
    x = math.log2(max(SEQUENCES[0], min(SEQUENCES[-1], seq)))
    xs = [math.log2(s) for s in SEQUENCES]
    for i in range(len(xs) - 1):
        if x <= xs[i + 1]:
            w = (x - xs[i]) / (xs[i + 1] - xs[i])
            return curve[i] + w * (curve[i + 1] - curve[i])
    return curve[-1]


def _time_per_flop(rates: dict, kind: str, seq: float, cp: int) -> float:
    """1 / rate of a rank's causal share at context parallel cp: 1/cp causal, the rest unmasked."""
    causal = 1.0 / max(1, cp)
    return causal / _at(rates[kind + "_causal"], seq) + (1.0 - causal) / _at(rates[kind + "_full"], seq)


def attention_passes(cluster: ClusterSpec, seq_length: int, cp: int, backward_flops: float) -> tuple[float, float]:
    """(forward, backward) time of one counted forward attention FLOP, in units of 1 / (peak *
    attention_efficiency): (1, backward_flops) where the cluster has no curve; else the anchor's 1 +
    backward_flops split as the kernels split it, each scaled by its kernel's rate at s / cp against the
    anchor's (causal, cp 1)."""
    rates = rates_of(cluster)
    if rates is None:
        return 1.0, backward_flops
    seq = seq_length / max(1, cp)
    f_a = _time_per_flop(rates, "fwd", ANCHOR_SEQUENCE, 1)
    b_a = _time_per_flop(rates, "bwd", ANCHOR_SEQUENCE, 1)
    share_fwd = (1.0 + backward_flops) / (1.0 + backward_flops * b_a / f_a)
    share_bwd = (1.0 + backward_flops) - share_fwd
    return (share_fwd * _time_per_flop(rates, "fwd", seq, cp) / f_a,
            share_bwd * _time_per_flop(rates, "bwd", seq, cp) / b_a)


class Variant:
    """The model with the curve: every layer's attention time (compute._assemble, which moe.py also calls) re-split
    and re-scaled on the clusters `rates_of` knows; everything else as it was. Restores the model on exit."""

    def __enter__(self):
        self.saved = (compute._assemble, moe._assemble)
        original = compute._assemble

        def assemble(model, cluster, shape, gemm_fwd, elem_bytes):
            out = original(model, cluster, shape, gemm_fwd, elem_bytes)
            if rates_of(cluster) is None:
                return out
            again = compute._passes(shape)[1]
            counted = out["attention"] / (1.0 + again + FLASH_BACKWARD_FLOPS)
            fwd, bwd = attention_passes(cluster, model.seq_length, shape.c, FLASH_BACKWARD_FLOPS)
            return {**out, "attention": counted * (fwd * (1.0 + again) + bwd)}

        compute._assemble = moe._assemble = assemble
        return self

    def __exit__(self, *exc):
        compute._assemble, moe._assemble = self.saved


def main() -> None:
    import framework_accuracy
    import hardware_accuracy
    import llama_accuracy
    import moe_accuracy
    print("== fused attention by sequence on Hopper (variant, not applied): time per counted FLOP over the flat "
          "constant's, forward / backward / both, at each sequence and cp")
    h100 = load_cluster("h100")
    for seq, cp in ((1024, 1), (2048, 1), (4096, 1), (8192, 1), (16384, 1), (32768, 2), (131072, 8)):
        f, b = attention_passes(h100, seq, cp, FLASH_BACKWARD_FLOPS)
        both = (f + b) / (1 + FLASH_BACKWARD_FLOPS)
        print(f"  seq {seq:>6} cp {cp}: {f:.3f} / {b / FLASH_BACKWARD_FLOPS:.3f} / {both:.3f}")
    with Variant():
        for bench in (moe_accuracy, framework_accuracy, llama_accuracy, hardware_accuracy):
            print()
            bench.main()


if __name__ == "__main__":
    main()
