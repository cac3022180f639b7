"""The training precisions a study may ask for, what each needs of the machine and of the stack. Pure.

- bf16: every GPU, every framework.
- fp8: FP8 GEMMs with per-tensor scaling (Transformer Engine's delayed / hybrid recipe; torchtitan's float8):
  a GPU with an FP8 rate (`peak_tflops_fp8`: Hopper, Blackwell; CDNA 3/4 through ROCm Transformer Engine and
  torchao's e4m3fnuz), run by every framework (Megatron-DeepSpeed only in its TE model, tuner.frameworks).
- mxfp8: FP8 GEMMs with a scale per 32-element block (OCP MX), which the tensor cores apply in hardware on
  Blackwell and CDNA 4 (`block_scaled`). Megatron-Core: `--fp8-format e4m3 --fp8-recipe mxfp8`
  (transformer_config.py lines 587, 594 @ d98e8a64ddf3: "mxfp8 for Blackwell architecture only"; NVIDIA's
  Megatron-Bridge recipe bf16_with_mxfp8_mixed, src/megatron/bridge/training/mixed_precision.py line 255 @
  067f987df03b). torchtitan: converter "quantize.linear.mx" (recipe mxfp8_cublas), "MXFP8 is only supported
  on CUDA SM100 or later, or ROCm gfx950 or later" and not with TP under torch.compile
  (torchtitan/components/quantization/mx.py lines 42, 50 @ 238fa9953e4a). Megatron-DeepSpeed: none.
- nvfp4: NVIDIA's 4-bit format (E2M1 values, an FP8 scale per 16 elements, a tensor scale) at the FP4 rate
  (`peak_tflops_fp4`) on Blackwell: only Megatron-Core trains with it, `--fp4-format e2m1 --fp4-recipe nvfp4`
  (transformer_config.py lines 674, 679; Megatron-Bridge bf16_with_nvfp4_mixed, mixed_precision.py line 405).
  AMD's MXFP4 (CDNA 4) is another format, not modelled.
MFU is stated against the bf16 peak in every precision (tuner.perfmodel).

The performance model reads a precision as the GEMMs' rate (`GEMM_RATE`) and the quantisation traffic of
the GEMM inputs (`CAST_COPIES`: MX and NVFP4 quantise each input along both GEMM dimensions, a rowwise and a
columnwise copy, where per-tensor FP8 transposes one: an ESTIMATE of twice the cast traffic, except Transformer
Engine's CUDA MXFP8 kernel, which writes both copies in one pass: tuner.perfmodel.compute.cast_units). tuner runs
every layer's GEMMs at the FP4 rate (the cluster's matmul_efficiency_fp4 where measured): as NVIDIA's Llama
and DeepSeek-V3 performance recipes run (bf16_with_nvfp4_mixed, no bf16 layers: Megatron-Bridge
src/megatron/bridge/perf_recipes/_common.py _perf_precision @ 067f987df03b), an upper bound for recipes that
keep layers in bf16 (Nemotron 3 Super the last 14, GPT-OSS the last 4). The NVFP4 recipe's quantisation work
beyond the two casts (Transformer Engine's Hadamard transforms of weight-gradient inputs, stochastic
rounding) is not modelled. The low-precision weight copies' memory is counted as FP8's for all three.
"""

from __future__ import annotations

PRECISIONS = ("bf16", "fp8", "mxfp8", "nvfp4")
#: the GEMM rate each precision runs at: the cluster's peak_tflops, peak_tflops_fp8 or peak_tflops_fp4
GEMM_RATE = {"bf16": "bf16", "fp8": "fp8", "mxfp8": "fp8", "nvfp4": "fp4"}
#: quantised copies of each GEMM input per pass (ESTIMATE, see above)
CAST_COPIES = {"bf16": 0.0, "fp8": 1.0, "mxfp8": 2.0, "nvfp4": 2.0}
#: framework -> the software stacks it trains each low precision on
SUPPORT = {
    "fp8": {"megatron-deepspeed": ("cuda", "rocm"), "megatron-core": ("cuda", "rocm"), "torchtitan": ("cuda", "rocm")},
    "mxfp8": {"megatron-core": ("cuda", "rocm"), "torchtitan": ("cuda", "rocm")},
    "nvfp4": {"megatron-core": ("cuda",)},
}


def quantized(precision: str) -> bool:
    """Whether the layers' GEMMs run in a low precision (the casts, the FP8 weight copies)."""
    return GEMM_RATE.get(precision, "bf16") != "bf16"


def gemm_format(precision: str) -> str | bool:
    """What tuner.perfmodel.compute.Shape.fp8 holds: False in bf16, else the GEMM rate ("fp8", "fp4")."""
    rate = GEMM_RATE.get(precision, "bf16")
    return False if rate == "bf16" else rate


def refusal(precision: str, cluster, framework: str) -> str | None:
    """Why `framework` cannot train in `precision` on `cluster` (one line naming the fix), or None."""
    if precision not in PRECISIONS:
        return f"--precision must be one of {', '.join(PRECISIONS)} (got {precision!r})"
    if precision == "bf16":
        return None
    c = cluster
    if not c.peak_tflops_fp8:
        return (f"cluster '{c.name}' has no peak_tflops_fp8 (its GPUs run no FP8 GEMMs, e.g. MI250X): use "
                "--precision bf16, or add peak_tflops_fp8 to the cluster file")
    if precision in ("mxfp8", "nvfp4") and not c.block_scaled:
        return (f"--precision {precision} needs tensor cores that scale MX blocks (Blackwell, CDNA 4; cluster key "
                f"block_scaled): cluster '{c.name}' has none; use --precision fp8")
    if precision == "nvfp4" and (not c.peak_tflops_fp4 or c.software != "cuda"):
        return (f"--precision nvfp4 is NVIDIA Blackwell's FP4 (peak_tflops_fp4 on a cuda cluster); cluster "
                f"'{c.name}' has {'no FP4 rate' if not c.peak_tflops_fp4 else 'another FP4 (MXFP4)'}: use "
                "--precision mxfp8 or fp8")
    stacks = SUPPORT[precision].get(framework, ())
    if c.software not in stacks:
        who = [fw for fw, sw in SUPPORT[precision].items() if c.software in sw]
        return (f"{framework} does not train in {precision} on {c.software.upper()}"
                + (f"; use --framework {' or '.join(who)}" if who else "; use --precision fp8"))
    return None
