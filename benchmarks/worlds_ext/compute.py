"""Seconds of one transformer layer's forward and backward on one GPU, from measured kernel speeds.

- GEMMs: each forward (M, N, K), its data gradient (M, K, N) and its weight gradient (K, N, M) at the
  FLOP/s XLA measured for that shape (tables.gemm_flops) times the world's drawn clock factor (a GPU in an
  8-GPU node under its power cap runs below a lone benchmark GPU).
- Attention (FlashAttention kernels, head dim 128): the forward speed at the sequence length from
  FlashAttention-3's forward-speed figure for head dim 128 on H100 SXM5 (Shah et al. 2024, arXiv:2407.08608:
  FlashAttention-2 309-370 TFLOPS, cuDNN 497-617 TFLOPS over 512-16k tokens, non-causal), times a drawn
  causal factor and the occupancy of the kernel's grid (batch x heads x query blocks over the SMs, to a
  drawn power); the backward runs 2.5x the FLOPs (five products against two) at a drawn fraction of the
  forward's speed (FlashAttention-2, Dao 2023: its backward reaches a lower share of peak than its forward).
- Element-wise kernels: HBM bytes per token counted op by op (norms, residual adds, bias-dropout, GELU or
  SwiGLU, rotary), h-wide ones split by tp only with sequence parallelism, a drawn backward factor and a
  drawn fusion factor where the stack fuses them (Transformer Engine, torch.compile) or a drawn eager factor
  where it does not (eager PyTorch runs an RMSNorm as five kernels, each a pass over the tensor), at a drawn
  share of the HBM bandwidth.
- Host: a layer pass issues a drawn number of kernels at a drawn launch cost each; the pass takes the
  longer of GPU time and launch time.
"""

from __future__ import annotations

import math

import numpy as np

from worlds_ext import tables
from worlds_ext.geometry import Cut

#: FlashAttention-3 paper, forward speed for head dim 128 on H100 SXM5 (TFLOPS), non-causal.
FA_SEQ = (512, 1024, 2048, 4096, 8192, 16384)
FA_SPEED = {"fa2": (309, 350, 362, 368, 370, 370), "cudnn": (497, 574, 617, 609, 600, 595)}
FA_BLOCK = 128          # query rows per thread block


def gemm_s(ph, M: float, N: float, K: float) -> float:
    return 2.0 * M * N * K / (tables.gemm_flops(ph["hw"], "bf16", M, N, K) * ph["gemm_scale"])


def gemm_pass(ph, shapes) -> tuple[float, float]:
    """(forward, backward) seconds of GEMMs given as forward (M, N, K)."""
    fwd = sum(gemm_s(ph, M, N, K) for M, N, K in shapes)
    bwd = sum(gemm_s(ph, M, K, N) + gemm_s(ph, K, N, M) for M, N, K in shapes)
    return fwd, bwd


def attention_s(ph, c: Cut, kernel: str) -> tuple[float, float]:
    """(forward, backward) seconds of causal attention for one micro-batch on one rank."""
    curve = np.array(FA_SPEED[kernel], dtype=float) / max(FA_SPEED[kernel])
    rate = float(np.interp(math.log2(max(c.seq, 512)), np.log2(FA_SEQ), curve)) * ph["attn_peak_tflops"] * 1e12
    ctas = c.batch * c.heads * math.ceil(c.seq / FA_BLOCK)
    occupancy = ctas / (math.ceil(ctas / ph["sms"]) * ph["sms"])
    rate *= ph["causal"] * occupancy ** ph["attn_wave"]
    full = c.seq * c.cp                                               # a CP rank's queries meet every key
    flops = 2.0 * c.batch * c.heads * c.seq * full * c.head_dim       # causal: half of 4 b a s^2 d, / cp
    fwd = flops / rate
    return fwd, 2.5 * flops / (rate * ph["attn_bwd"])


def elementwise_bytes(c: Cut, llama: bool) -> float:
    """Forward HBM bytes of a layer's element-wise kernels for one micro-batch (bf16)."""
    h = c.hidden / (c.tp if c.sp else 1)          # h-wide ops: replicated on every TP rank without SP
    q, kv = c.heads * c.head_dim, c.kv_heads * c.head_dim
    if llama:      # two RMSNorms, rotary on q and k, SwiGLU, two residual adds
        per_token = 2 * 4 * h + 4 * (q + kv) + 6 * c.ffn + 2 * 6 * h
    else:          # two LayerNorms, two bias-dropout-residual (1-byte masks), bias-GELU
        per_token = 2 * 4 * h + 2 * 7 * h + 4 * c.ffn_in
    return per_token * c.tokens


def layer_compute(ph, c: Cut, llama: bool, fused: bool, kernel: str, gemms) -> dict:
    """Forward and backward GPU seconds of one layer (GEMMs, attention, element-wise) and its kernel count."""
    gf, gb = gemm_pass(ph, gemms)
    af, ab = attention_s(ph, c, kernel)
    hbm = ph["hbm_gbps"] * 1e9 * ph["hbm_eff"]
    ew = elementwise_bytes(c, llama) * (ph["fuse"] if fused else ph["eager_ew"]) / hbm
    return {"gemm_f": gf, "gemm_b": gb, "attn_f": af, "attn_b": ab, "ew_f": ew, "ew_b": ew * ph["ew_bwd"]}


def host_bound(gpu_s: float, kernels: float, ph) -> float:
    """A pass of `kernels` launches takes the longer of its GPU time and its launch time."""
    return max(gpu_s, kernels * ph["launch_us"] * 1e-6)
