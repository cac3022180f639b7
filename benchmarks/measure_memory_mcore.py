"""Measure the per-GPU peak memory of Megatron-Core's own GPT training step, without a GPU.

For each configuration in CONFIGS below, this script builds Megatron-Core's ``GPTModel`` with the LOCAL layer
spec (``get_gpt_layer_local_spec``: Megatron-Core's own modules, no Transformer Engine) at the real shapes,
wraps it in Megatron-Core's ``DistributedDataParallel`` (fp32 gradient buffer: ``grad_reduce_in_fp32=True``, as
Megatron-LM sets for bf16) and its optimizer (``get_megatron_optimizer``: bf16 params, fp32 main params, Adam),
and runs one training iteration -- the micro-batches through Megatron-Core's own schedule
(``get_forward_backward_func()``: 1F1B when pp > 1) and ``optimizer.step()`` -- for ONE rank of the job, all
under PyTorch's ``FakeTensorMode`` (no real storage) on a fake process group (``FakeStore`` + backend "fake":
collectives and p2p send/recv do nothing). ``torch.distributed._tools.mem_tracker.MemTracker`` follows every
storage and reports the peak bytes and their split into parameters, gradients, optimizer states, activations,
temporaries (allocations made during backward) and other.

The iteration measured is a steady-state one: before it, one optimizer step on zero gradients creates Adam's
two moments (as after the first iteration or a checkpoint load), so the forward/backward peak sees them.

Set-up (outside the repository; torch pinned so that pip takes the CPU build):

    python3 -m venv /work/mcorevenv && . /work/mcorevenv/bin/activate
    pip install torch==2.13.0 megatron-core==0.16.1
    python benchmarks/measure_memory_mcore.py [--out FILE] [--only N[,M...]] [--list] [--fresh | --fresh2 | --fresh3 | --fresh4 | --fresh5 | --pipeline]

Output: benchmarks/data/memory_measured_megatron-core.toml (one [[row]] per configuration that ran; failures are
printed at the end and written nowhere). Each configuration runs in a forked child process (fresh process
groups, parallel_state and fake mode per row).

What is patched, and why (all in ``_patch()``; nothing in megatron-core's files is edited):
  * a TorchFunctionMode rewrites every ``device=cuda...`` argument, ``Tensor.to('cuda')`` and ``Tensor.cuda()``
    to the CPU: Megatron-Core allocates on ``torch.cuda.current_device()`` / "cuda"; fake CUDA tensors cannot even
    be sliced on a CPU-only torch build. ``torch.cuda.current_device`` returns the CPU device. The same mode makes
    ``Tensor.type()`` answer 'torch.cuda.BFloat16Tensor' etc. for CPU tensors, since Megatron's optimizers accept
    only those type names.
  * ``torch.cuda.manual_seed``/``get_rng_state``/``set_rng_state`` and Megatron's ``_get_cuda_rng_state`` /
    ``_set_cuda_rng_state`` (the tensor-parallel RNG tracker, activation checkpointing) use the CPU generator /
    do nothing; ``torch.cuda.synchronize``, ``torch.cuda.Stream`` / ``Event`` / ``stream()`` / ``current_stream()``
    do nothing; ``pin_memory`` is dropped.
  * ``FakeTensor.item()`` returns the constant when fake mode knows it, else 1.0 (the grad norm, the loss: values
    only, no memory effect); ``dist.all_gather_object`` returns this rank's object for every rank (it cannot
    pickle fake tensors; Megatron uses it to align optimizer param-group keys, identical on every rank here).
  * ``torch.distributed._coalescing_manager`` in Megatron's param_and_grad_buffer becomes a no-op context (the
    coalesced all-gather / reduce-scatter op has no fake-tensor kernel; the individual collectives still run).
  * Megatron's fallback (no Apex / TE) ``multi_tensor_l2norm`` copies norms to a real tensor and its
    ``multi_tensor_scale`` makes a temporary copy of every tensor it scales: both are replaced by fake-safe,
    in-place equivalents (as Apex/TE's fused kernels are: they allocate nothing).
  * the local spec's norm (``WrappedTorchNorm``: torch.nn.LayerNorm / RMSNorm) refuses sequence parallelism
    (it does not mark its weights ``sequence_parallel`` for the TP all-reduce of their gradients), and on a CPU
    build torch's RMSNorm is the unfused composite that keeps fp32 intermediates. It is replaced by
    torch.nn.LayerNorm (native kernel: saves the input, fp32 mean / rstd) or an RMSNorm stand-in with the fused
    kernel's footprint (Apex / TE / CUDA torch: saves the input and the fp32 rstd, returns a bf16 output), both
    with their weights marked ``sequence_parallel`` as Megatron's FusedLayerNorm / TENorm do.
  * ``torch.nn.functional.dropout`` (training, out of place) calls ``torch.native_dropout`` as it does on CUDA
    (a 1-byte bool mask saved for backward); on a CPU build it would save a bf16 noise tensor (2 bytes).
  * Megatron-Core's ``jit_fuser`` is ``torch.compile``, which cannot trace under FakeTensorMode: its modules are
    imported with ``torch.compile`` replaced by an identity decorator. The fused bias+SwiGLU / bias+GeLU autograd
    Functions (Megatron-LM's default ``bias_activation_fusion``; they save only their input and bias) are
    Megatron's own, but the element-wise functions they call (``bias_gelu``, ``bias_gelu_back``, ``swiglu``,
    ``bias_swiglu``, ``swiglu_back``, ``bias_swiglu_back``), one fused kernel each on a GPU, are replaced by one
    allocation of the kernel's output (``_fused_activation_kernels``; eagerly they would allocate every
    intermediate: about seven FFN-wide tensors in a GeLU backward).
  * Megatron falls back to ``torch.optim.AdamW`` without TE/Apex; it is made ``fused=True`` (the in-place fused
    kernel, like TE/Apex FusedAdam on GPUs; the default for-loop Adam allocates per-tensor temporaries).
  * MemTracker's per-module hooks are reduced to its activation-checkpoint detection (its per-module snapshot
    bookkeeping refuses a second forward of the root module, i.e. more than one micro-batch, and cannot read
    Megatron DDP's ``.buffers`` attribute, a list). Peak and category accounting are MemTracker's own.

Attention (the ``attention`` key of a row): "local" is Megatron-Core's own ``DotProductAttention`` (the local
spec's core attention: baddbmm scores, fp32 softmax, bmm), which KEEPS the s x s scores (and, with attention
dropout, its mask); "flash-standin" replaces only the core attention by a torch.autograd.Function that does what
FlashAttention / TE fused attention does to memory: it returns a bf16 output, saves q, k, v, the output and the
fp32 log-sum-exp (b x heads x s), keeps no s x s tensor and no dropout mask, and allocates dq, dk, dv in backward.
Megatron-Core's DotProductAttention refuses context parallelism (only TE's attention has it), so cp > 1 rows use
the stand-in with ring attention's footprint (each CP rank keeps its s/cp of q, k, v, out, lse; two in-flight
K/V receive buffers are allocated while it runs). Numbers are allocated bytes (no caching-allocator
fragmentation, no CUDA context, no NCCL buffers).

One difference from a GPU run, found in issue 24 round 5 and left in the measurement (benchmarks/memory_accuracy.py
reads it): on a pipeline stage after the first, MemTracker keeps every finished micro-batch's received input and
sent input gradient alive (Megatron-Core drops them; memory_accuracy.tracker_retained_gb adds them to a 1F1B row's
prediction). The other found then -- the fused bias-GeLU / bias-SwiGLU running eagerly, its backward holding
element-wise temporaries a fused kernel does not -- is corrected (_fused_activation_kernels, issue 24).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import multiprocessing as mp
import sys
import time
import tomllib
import traceback
import warnings
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_OUT = REPO / "benchmarks" / "data" / "memory_measured_megatron-core.toml"
GiB = float(2 ** 30)

# ----------------------------------------------------------------------------------- the configurations
# Architectures (Megatron-Core TransformerConfig / GPTModel arguments). Llama-3-style: GQA, SwiGLU, RMSNorm,
# RoPE (base 5e5), untied embeddings, no biases, no dropout. GPT-style: GeLU, LayerNorm, learned absolute
# positions, tied embeddings, biases, dropout 0.1 (Megatron-LM's default hidden / attention dropout).
LLAMA = dict(ffn_type="swiglu", normalization="rmsnorm", position_embedding="rope", tie_embeddings=False,
             add_bias_linear=False, rope_theta=500000.0, dropout=0.0)
GPT = dict(ffn_type="gelu", normalization="layernorm", position_embedding="learned", tie_embeddings=True,
           add_bias_linear=True, dropout=0.1)
MIXTRAL = dict(LLAMA, rope_theta=1000000.0)
SHAPES = {
    "llama3-8b": dict(LLAMA, num_layers=32, hidden_size=4096, num_attention_heads=32, num_query_groups=8,
                      ffn_hidden_size=14336, vocab_size=128256),
    "llama3-70b": dict(LLAMA, num_layers=80, hidden_size=8192, num_attention_heads=64, num_query_groups=8,
                       ffn_hidden_size=28672, vocab_size=128256),
    "gpt-22b": dict(GPT, num_layers=48, hidden_size=6144, num_attention_heads=48, num_query_groups=48,
                    ffn_hidden_size=4 * 6144, vocab_size=50688),
    "gpt-175b": dict(GPT, num_layers=96, hidden_size=12288, num_attention_heads=96, num_query_groups=96,
                     ffn_hidden_size=4 * 12288, vocab_size=50688),
    "mixtral-8x7b": dict(MIXTRAL, num_layers=32, hidden_size=4096, num_attention_heads=32, num_query_groups=8,
                         ffn_hidden_size=14336, vocab_size=32000, num_experts=8, moe_router_topk=2,
                         moe_ffn_hidden_size=14336),
}


def C(shape, *, layers=None, tp=1, pp=1, cp=1, dp=1, ep=1, mb=1, m=1, seq=4096, sp=None, recompute="none",
      dist_opt=True, attention="flash-standin", stage=0, vp=1):
    """One configuration: a SHAPES entry (optionally cut to `layers` layers) and a layout."""
    c = dict(SHAPES[shape])
    c["shape"] = shape
    if layers is not None:
        c["num_layers"] = layers
    c.update(tp=tp, pp=pp, cp=cp, dp=dp, ep=ep, micro_batch=mb, num_microbatches=m, seq_length=seq,
             sequence_parallel=(tp > 1) if sp is None else sp, recompute=recompute, distributed_optimizer=dist_opt,
             attention=attention, stage=stage if stage >= 0 else pp + stage, vp=vp)
    return c


CONFIGS = [
    # --- llama3-8b (full 32 layers), pp = 1
    C("llama3-8b", tp=1, dp=8, mb=1, m=4, seq=8192),
    C("llama3-8b", tp=1, dp=8, mb=1, m=4, seq=8192, dist_opt=False),
    C("llama3-8b", tp=2, dp=4, mb=1, m=4, seq=8192),
    C("llama3-8b", tp=2, dp=4, mb=1, m=4, seq=8192, sp=False),
    C("llama3-8b", tp=4, dp=16, mb=2, m=2, seq=4096),
    C("llama3-8b", tp=4, dp=16, mb=2, m=2, seq=4096, sp=False),
    C("llama3-8b", tp=8, dp=64, mb=4, m=1, seq=2048),
    C("llama3-8b", tp=1, dp=64, mb=2, m=1, seq=4096),
    C("llama3-8b", tp=1, dp=1, mb=1, m=2, seq=4096, dist_opt=False),
    C("llama3-8b", tp=1, dp=16, mb=1, m=1, seq=8192, recompute="full"),
    C("llama3-8b", tp=1, dp=16, mb=1, m=1, seq=8192, recompute="selective"),
    C("llama3-8b", tp=2, dp=16, mb=2, m=2, seq=4096, recompute="full"),
    # the distributed optimizer's 12/d: the same layout over dp 1 / 4 / 16 / 64
    C("llama3-8b", tp=2, dp=1, mb=1, m=2, seq=4096),
    C("llama3-8b", tp=2, dp=4, mb=1, m=2, seq=4096),
    C("llama3-8b", tp=2, dp=16, mb=1, m=2, seq=4096),
    C("llama3-8b", tp=2, dp=64, mb=1, m=2, seq=4096),
    C("llama3-8b", tp=1, cp=2, dp=4, mb=1, m=2, seq=8192),
    C("llama3-8b", tp=2, cp=2, dp=4, mb=1, m=2, seq=8192),
    # s x s scores kept (Megatron's local DotProductAttention): pairs with rows above
    C("llama3-8b", tp=2, dp=16, mb=1, m=2, seq=2048, attention="local"),
    C("llama3-8b", tp=2, dp=16, mb=1, m=2, seq=2048),
    C("llama3-8b", tp=2, dp=16, mb=1, m=2, seq=2048, attention="local", recompute="selective"),
    C("llama3-8b", tp=4, dp=4, mb=1, m=2, seq=4096, attention="local"),
    C("llama3-8b", tp=4, dp=4, mb=1, m=2, seq=4096),
    # --- llama3-8b, pp > 1 (1F1B), first and last stage
    C("llama3-8b", tp=1, pp=2, dp=4, mb=1, m=8, seq=8192, stage=0),
    C("llama3-8b", tp=1, pp=2, dp=4, mb=1, m=8, seq=8192, stage=-1),
    C("llama3-8b", tp=2, pp=4, dp=4, mb=1, m=8, seq=4096, stage=0),
    C("llama3-8b", tp=2, pp=4, dp=4, mb=1, m=8, seq=4096, stage=-1),
    C("llama3-8b", tp=2, pp=4, dp=4, mb=1, m=3, seq=4096, stage=0),
    C("llama3-8b", tp=2, pp=2, dp=16, mb=2, m=4, seq=4096, recompute="full", stage=0),
    C("llama3-8b", tp=2, pp=2, dp=16, mb=2, m=4, seq=4096, recompute="full", stage=-1),
    # --- llama3-70b shape, cut to 8 layers (custom), tp 8, pp = 1
    C("llama3-70b", layers=8, tp=8, dp=4, mb=1, m=2, seq=8192),
    C("llama3-70b", layers=8, tp=8, dp=4, mb=1, m=2, seq=8192, sp=False),
    C("llama3-70b", layers=8, tp=8, dp=4, mb=1, m=2, seq=8192, dist_opt=False),
    C("llama3-70b", layers=8, tp=8, dp=4, mb=1, m=2, seq=8192, recompute="full"),
    C("llama3-70b", layers=8, tp=4, dp=16, mb=1, m=2, seq=4096),
    C("llama3-70b", layers=8, tp=8, cp=2, dp=2, mb=1, m=2, seq=8192),
    C("llama3-70b", layers=8, tp=8, dp=4, mb=1, m=2, seq=4096, attention="local"),
    # --- llama3-70b (full 80 layers), tp 8 pp 4
    C("llama3-70b", tp=8, pp=4, dp=4, mb=1, m=8, seq=8192, stage=0),
    C("llama3-70b", tp=8, pp=4, dp=4, mb=1, m=8, seq=8192, stage=-1),
    C("llama3-70b", tp=8, pp=4, dp=4, mb=1, m=8, seq=8192, recompute="full", stage=0),
    C("llama3-70b", tp=8, pp=4, cp=2, dp=2, mb=1, m=8, seq=8192, stage=0),
    # --- gpt-22b (full 48 layers)
    C("gpt-22b", tp=8, dp=4, mb=1, m=4, seq=2048),
    C("gpt-22b", tp=8, dp=4, mb=1, m=4, seq=2048, attention="local"),
    C("gpt-22b", tp=8, dp=4, mb=1, m=4, seq=2048, sp=False),
    C("gpt-22b", tp=8, dp=4, mb=1, m=4, seq=2048, attention="local", recompute="selective"),
    C("gpt-22b", tp=8, dp=4, mb=1, m=4, seq=2048, recompute="full"),
    C("gpt-22b", tp=8, dp=4, mb=1, m=4, seq=2048, dist_opt=False),
    C("gpt-22b", tp=4, dp=16, mb=2, m=2, seq=2048),
    C("gpt-22b", tp=8, dp=16, mb=4, m=2, seq=2048),
    C("gpt-22b", tp=2, pp=2, dp=16, mb=1, m=8, seq=2048, stage=0),
    C("gpt-22b", tp=2, pp=2, dp=16, mb=1, m=8, seq=2048, stage=-1),
    C("gpt-22b", tp=8, pp=4, dp=1, mb=4, m=8, seq=2048, stage=0),
    C("gpt-22b", tp=8, pp=4, dp=1, mb=4, m=8, seq=2048, stage=-1),
    # --- gpt-175b (full 96 layers), tp 8 pp 8
    C("gpt-175b", tp=8, pp=8, dp=1, mb=1, m=8, seq=2048, stage=0),
    C("gpt-175b", tp=8, pp=8, dp=1, mb=1, m=8, seq=2048, stage=-1),
    # --- gpt-175b shape cut to 8 layers (custom)
    C("gpt-175b", layers=8, tp=8, dp=8, mb=1, m=2, seq=2048),
    C("gpt-175b", layers=8, tp=8, dp=8, mb=1, m=2, seq=2048, attention="local"),
    # --- Mixtral 8x7B shape cut to 4 layers (custom): Megatron-Core MoE, SequentialMLP experts
    C("mixtral-8x7b", layers=4, tp=1, ep=8, dp=8, mb=1, m=2, seq=4096),
    C("mixtral-8x7b", layers=4, tp=2, ep=4, dp=4, mb=1, m=2, seq=4096),
    C("mixtral-8x7b", tp=1, ep=8, dp=8, mb=1, m=2, seq=4096),
    C("mixtral-8x7b", tp=2, pp=2, ep=4, dp=4, mb=1, m=8, seq=4096, stage=0),
    C("mixtral-8x7b", tp=2, pp=2, ep=4, dp=4, mb=1, m=8, seq=4096, stage=-1),
]

#: --fresh (issue 24 round 4): 24 dense configurations no choice has seen, for the held-out reliability of the
#: allocated-bytes p_fit, drawn at run time by benchmarks/draw_memory_batch.py --mcore (its MCORE_GRID, less CONFIGS,
#: from the held-out third, 8 per recompute mode), seed 463727410 (os.urandom); committed before any is measured and
#: before Megatron-Core's allocated-bytes spread is chosen. Written to data/memory_measured_megatron-core_fresh.toml.
FRESH = [
    C("llama3-70b", layers=8, tp=8, pp=2, dp=16, mb=2, m=2, seq=8192, recompute="none", stage=-1),
    C("llama3-70b", layers=8, tp=1, pp=2, dp=16, mb=2, m=4, seq=4096, recompute="none", stage=-1),
    C("llama3-8b", tp=8, pp=2, dp=16, mb=2, m=4, seq=8192, recompute="none"),
    C("llama3-70b", layers=8, tp=2, pp=2, dp=4, mb=1, m=4, seq=2048, recompute="none"),
    C("llama3-8b", tp=4, pp=1, dp=16, mb=1, m=4, seq=8192, recompute="none"),
    C("llama3-70b", layers=8, tp=8, pp=1, dp=16, mb=1, m=2, seq=4096, recompute="none"),
    C("llama3-70b", layers=8, tp=1, pp=2, dp=16, mb=2, m=4, seq=8192, recompute="none", stage=-1),
    C("gpt-22b", layers=8, tp=4, pp=1, dp=4, mb=1, m=2, seq=8192, recompute="none"),
    C("llama3-70b", layers=8, tp=2, pp=1, dp=4, mb=2, m=4, seq=2048, recompute="selective"),
    C("llama3-8b", tp=2, pp=2, dp=16, mb=1, m=4, seq=2048, recompute="selective", stage=-1),
    C("gpt-22b", layers=8, tp=8, pp=2, dp=4, mb=1, m=2, seq=2048, recompute="selective", stage=-1),
    C("gpt-22b", layers=8, tp=4, pp=1, dp=16, mb=2, m=4, seq=8192, recompute="selective"),
    C("llama3-70b", layers=8, tp=2, pp=2, dp=4, mb=2, m=4, seq=8192, recompute="selective", stage=-1),
    C("llama3-70b", layers=8, tp=2, pp=2, dp=4, mb=2, m=2, seq=8192, recompute="selective", stage=-1),
    C("llama3-8b", tp=1, pp=2, dp=4, mb=2, m=4, seq=2048, recompute="selective"),
    C("llama3-70b", layers=8, tp=2, pp=2, dp=16, mb=2, m=2, seq=4096, recompute="selective"),
    C("gpt-22b", layers=8, tp=8, pp=2, dp=16, mb=1, m=2, seq=8192, recompute="full"),
    C("llama3-8b", tp=8, pp=1, dp=16, mb=2, m=2, seq=8192, recompute="full"),
    C("llama3-8b", tp=8, pp=1, dp=4, mb=1, m=2, seq=2048, recompute="full"),
    C("llama3-8b", tp=4, pp=2, dp=16, mb=1, m=2, seq=4096, recompute="full"),
    C("llama3-70b", layers=8, tp=2, pp=2, dp=4, mb=1, m=4, seq=4096, recompute="full"),
    C("gpt-22b", layers=8, tp=2, pp=1, dp=4, mb=2, m=2, seq=8192, recompute="full"),
    C("llama3-8b", tp=1, pp=2, dp=16, mb=2, m=4, seq=2048, recompute="full", stage=-1),
    C("gpt-22b", layers=8, tp=2, pp=2, dp=4, mb=1, m=4, seq=2048, recompute="full", stage=-1),
]
FRESH_OUT = REPO / "benchmarks" / "data" / "memory_measured_megatron-core_fresh.toml"

#: --fresh2 (issue 24 round 5): 24 dense configurations drawn by benchmarks/draw_memory_batch.py --mcore (its MCORE_GRID,
#: less CONFIGS, FRESH and PIPELINE, from the held-out third, 8 per recompute mode), seed 1350905612 (os.urandom), after
#: Megatron-Core's loss phase and SP gather buffer (5391df6) and its bias / sd chosen again on CONFIGS and FRESH; committed
#: before any is measured. Written to data/memory_measured_megatron-core_fresh2.toml.
FRESH2 = [
    C("gpt-22b", layers=8, tp=4, pp=2, dp=16, mb=2, m=2, seq=2048, recompute="none", stage=-1),
    C("llama3-8b", tp=2, pp=2, dp=4, mb=1, m=4, seq=8192, recompute="none", stage=-1),
    C("gpt-22b", layers=8, tp=2, pp=2, dp=4, mb=2, m=2, seq=8192, recompute="none"),
    C("gpt-22b", layers=8, tp=4, pp=2, dp=4, mb=1, m=4, seq=8192, recompute="none"),
    C("gpt-22b", layers=8, tp=1, pp=1, dp=4, mb=1, m=4, seq=8192, recompute="none"),
    C("gpt-22b", layers=8, tp=4, pp=2, dp=4, mb=1, m=2, seq=2048, recompute="none", stage=-1),
    C("gpt-22b", layers=8, tp=8, pp=2, dp=16, mb=1, m=4, seq=4096, recompute="none", stage=-1),
    C("llama3-8b", tp=1, pp=2, dp=4, mb=2, m=2, seq=2048, recompute="none"),
    C("gpt-22b", layers=8, tp=8, pp=2, dp=16, mb=2, m=4, seq=8192, recompute="selective", stage=-1),
    C("llama3-70b", layers=8, tp=2, pp=2, dp=4, mb=2, m=2, seq=8192, recompute="selective"),
    C("llama3-70b", layers=8, tp=8, pp=1, dp=16, mb=1, m=4, seq=2048, recompute="selective"),
    C("llama3-70b", layers=8, tp=2, pp=2, dp=4, mb=2, m=4, seq=2048, recompute="selective"),
    C("gpt-22b", layers=8, tp=4, pp=1, dp=16, mb=1, m=4, seq=8192, recompute="selective"),
    C("gpt-22b", layers=8, tp=2, pp=2, dp=16, mb=1, m=2, seq=2048, recompute="selective", stage=-1),
    C("llama3-8b", tp=1, pp=2, dp=4, mb=2, m=4, seq=8192, recompute="selective"),
    C("llama3-70b", layers=8, tp=2, pp=2, dp=4, mb=2, m=4, seq=4096, recompute="selective"),
    C("llama3-8b", tp=2, pp=2, dp=4, mb=1, m=2, seq=2048, recompute="full"),
    C("llama3-8b", tp=2, pp=2, dp=16, mb=1, m=4, seq=8192, recompute="full", stage=-1),
    C("gpt-22b", layers=8, tp=4, pp=2, dp=16, mb=2, m=4, seq=4096, recompute="full"),
    C("llama3-8b", tp=1, pp=1, dp=16, mb=1, m=4, seq=4096, recompute="full"),
    C("gpt-22b", layers=8, tp=1, pp=1, dp=16, mb=1, m=2, seq=8192, recompute="full"),
    C("llama3-8b", tp=8, pp=1, dp=16, mb=1, m=2, seq=4096, recompute="full"),
    C("gpt-22b", layers=8, tp=4, pp=1, dp=16, mb=2, m=4, seq=2048, recompute="full"),
    C("llama3-70b", layers=8, tp=4, pp=2, dp=16, mb=2, m=4, seq=4096, recompute="full", stage=-1),
]
FRESH2_OUT = REPO / "benchmarks" / "data" / "memory_measured_megatron-core_fresh2.toml"

#: --fresh3 (issue 24 round 8): 24 dense configurations drawn by benchmarks/draw_memory_batch.py --mcore (its MCORE_GRID,
#: outside every configuration of CONFIGS, FRESH, FRESH2 and PIPELINE and every one a memory choice has seen, from the
#: held-out third, 8 per recompute mode), seed 193059340 (os.urandom), after Megatron-Core's layer backward and its bias /
#: sd chosen again on CONFIGS, FRESH and FRESH2 (7427b75); committed before any is measured. Written to
#: data/memory_measured_megatron-core_fresh3.toml.
FRESH3 = [
    C("llama3-70b", layers=8, tp=1, pp=2, dp=4, mb=1, m=4, seq=8192, recompute="none", stage=-1),
    C("llama3-8b", tp=4, pp=1, dp=16, mb=1, m=2, seq=8192, recompute="none"),
    C("llama3-8b", tp=1, pp=2, dp=16, mb=1, m=4, seq=4096, recompute="none"),
    C("gpt-22b", layers=8, tp=8, pp=2, dp=16, mb=1, m=4, seq=2048, recompute="none", stage=-1),
    C("llama3-8b", tp=1, pp=2, dp=16, mb=1, m=2, seq=2048, recompute="none", stage=-1),
    C("llama3-70b", layers=8, tp=2, pp=1, dp=4, mb=2, m=4, seq=2048, recompute="none"),
    C("gpt-22b", layers=8, tp=2, pp=2, dp=16, mb=2, m=2, seq=8192, recompute="none", stage=-1),
    C("llama3-8b", tp=8, pp=2, dp=4, mb=2, m=4, seq=8192, recompute="none", stage=-1),
    C("gpt-22b", layers=8, tp=8, pp=1, dp=16, mb=2, m=2, seq=4096, recompute="selective"),
    C("gpt-22b", layers=8, tp=8, pp=1, dp=4, mb=2, m=2, seq=4096, recompute="selective"),
    C("llama3-8b", tp=4, pp=2, dp=16, mb=1, m=2, seq=4096, recompute="selective", stage=-1),
    C("llama3-70b", layers=8, tp=8, pp=2, dp=16, mb=1, m=4, seq=2048, recompute="selective", stage=-1),
    C("gpt-22b", layers=8, tp=1, pp=2, dp=4, mb=2, m=2, seq=4096, recompute="selective"),
    C("llama3-8b", tp=2, pp=1, dp=16, mb=2, m=4, seq=8192, recompute="selective"),
    C("llama3-8b", tp=4, pp=1, dp=4, mb=1, m=2, seq=4096, recompute="selective"),
    C("llama3-8b", tp=2, pp=2, dp=16, mb=1, m=2, seq=8192, recompute="selective", stage=-1),
    C("gpt-22b", layers=8, tp=2, pp=2, dp=16, mb=1, m=2, seq=4096, recompute="full"),
    C("llama3-70b", layers=8, tp=2, pp=2, dp=4, mb=1, m=2, seq=2048, recompute="full"),
    C("llama3-8b", tp=8, pp=2, dp=4, mb=1, m=4, seq=8192, recompute="full"),
    C("gpt-22b", layers=8, tp=4, pp=2, dp=16, mb=2, m=2, seq=8192, recompute="full", stage=-1),
    C("llama3-70b", layers=8, tp=4, pp=2, dp=16, mb=1, m=4, seq=8192, recompute="full"),
    C("llama3-70b", layers=8, tp=1, pp=1, dp=4, mb=1, m=2, seq=8192, recompute="full"),
    C("gpt-22b", layers=8, tp=4, pp=2, dp=4, mb=2, m=4, seq=2048, recompute="full", stage=-1),
    C("llama3-8b", tp=1, pp=2, dp=16, mb=1, m=2, seq=4096, recompute="full"),
]
FRESH3_OUT = REPO / "benchmarks" / "data" / "memory_measured_megatron-core_fresh3.toml"

#: --fresh4 (issue 24 round 8, second pass): 24 dense configurations drawn by benchmarks/draw_memory_batch.py --mcore
#: (FRESH3's rule, outside FRESH3 too), seed 998366673 (os.urandom), after full recompute's recomputed output, the
#: harness read as it ran and Megatron-Core's bias / sd chosen again on CONFIGS, FRESH, FRESH2 and FRESH3 (f2725a0);
#: committed before any is measured. Written to data/memory_measured_megatron-core_fresh4.toml.
FRESH4 = [
    C("llama3-8b", tp=8, pp=1, dp=16, mb=1, m=4, seq=4096, recompute="none"),
    C("llama3-8b", tp=2, pp=2, dp=4, mb=1, m=4, seq=4096, recompute="none"),
    C("gpt-22b", layers=8, tp=1, pp=1, dp=4, mb=1, m=4, seq=2048, recompute="none"),
    C("llama3-70b", layers=8, tp=2, pp=2, dp=16, mb=2, m=4, seq=2048, recompute="none", stage=-1),
    C("llama3-8b", tp=8, pp=2, dp=16, mb=1, m=4, seq=4096, recompute="none"),
    C("llama3-70b", layers=8, tp=4, pp=2, dp=16, mb=1, m=4, seq=8192, recompute="none", stage=-1),
    C("llama3-70b", layers=8, tp=1, pp=1, dp=16, mb=2, m=2, seq=2048, recompute="none"),
    C("llama3-70b", layers=8, tp=8, pp=1, dp=4, mb=1, m=4, seq=4096, recompute="none"),
    C("gpt-22b", layers=8, tp=4, pp=2, dp=16, mb=2, m=4, seq=2048, recompute="selective"),
    C("llama3-8b", tp=4, pp=1, dp=16, mb=2, m=2, seq=8192, recompute="selective"),
    C("llama3-70b", layers=8, tp=4, pp=1, dp=16, mb=1, m=2, seq=8192, recompute="selective"),
    C("llama3-8b", tp=8, pp=2, dp=16, mb=1, m=4, seq=2048, recompute="selective"),
    C("llama3-70b", layers=8, tp=4, pp=1, dp=4, mb=2, m=2, seq=4096, recompute="selective"),
    C("gpt-22b", layers=8, tp=1, pp=2, dp=16, mb=2, m=4, seq=2048, recompute="selective"),
    C("llama3-8b", tp=1, pp=2, dp=16, mb=2, m=2, seq=8192, recompute="selective", stage=-1),
    C("llama3-70b", layers=8, tp=4, pp=1, dp=4, mb=1, m=2, seq=2048, recompute="selective"),
    C("llama3-70b", layers=8, tp=1, pp=2, dp=16, mb=2, m=2, seq=4096, recompute="full", stage=-1),
    C("gpt-22b", layers=8, tp=8, pp=2, dp=4, mb=2, m=4, seq=4096, recompute="full"),
    C("gpt-22b", layers=8, tp=4, pp=1, dp=16, mb=2, m=4, seq=4096, recompute="full"),
    C("gpt-22b", layers=8, tp=8, pp=1, dp=4, mb=1, m=2, seq=8192, recompute="full"),
    C("gpt-22b", layers=8, tp=1, pp=2, dp=4, mb=1, m=4, seq=8192, recompute="full"),
    C("llama3-8b", tp=8, pp=1, dp=4, mb=1, m=4, seq=8192, recompute="full"),
    C("llama3-70b", layers=8, tp=1, pp=2, dp=4, mb=2, m=4, seq=4096, recompute="full"),
    C("llama3-8b", tp=1, pp=2, dp=16, mb=1, m=4, seq=4096, recompute="full", stage=-1),
]
FRESH4_OUT = REPO / "benchmarks" / "data" / "memory_measured_megatron-core_fresh4.toml"

#: --fresh5 (issue 24 round 9): 24 dense configurations drawn by benchmarks/draw_memory_batch.py --mcore (FRESH3's rule,
#: outside FRESH4 too and every configuration the empirical spread rule's choice saw: published.SEEN), seed 3982451815
#: (os.urandom); committed before any is measured. Written to data/memory_measured_megatron-core_fresh5.toml.
FRESH5 = [
    C("llama3-8b", tp=8, pp=2, dp=4, mb=2, m=2, seq=2048, recompute="none"),
    C("llama3-70b", layers=8, tp=2, pp=2, dp=16, mb=2, m=2, seq=4096, recompute="none", stage=-1),
    C("llama3-8b", tp=1, pp=2, dp=4, mb=2, m=4, seq=4096, recompute="none"),
    C("llama3-70b", layers=8, tp=4, pp=2, dp=16, mb=1, m=4, seq=4096, recompute="none", stage=-1),
    C("llama3-8b", tp=2, pp=2, dp=16, mb=1, m=2, seq=8192, recompute="none"),
    C("gpt-22b", layers=8, tp=1, pp=2, dp=16, mb=2, m=2, seq=4096, recompute="none"),
    C("llama3-8b", tp=4, pp=2, dp=4, mb=1, m=2, seq=8192, recompute="none", stage=-1),
    C("llama3-70b", layers=8, tp=1, pp=2, dp=4, mb=1, m=4, seq=4096, recompute="none", stage=-1),
    C("llama3-8b", tp=8, pp=2, dp=4, mb=2, m=4, seq=4096, recompute="selective"),
    C("gpt-22b", layers=8, tp=2, pp=2, dp=4, mb=2, m=2, seq=2048, recompute="selective"),
    C("llama3-70b", layers=8, tp=2, pp=1, dp=4, mb=1, m=4, seq=4096, recompute="selective"),
    C("gpt-22b", layers=8, tp=2, pp=1, dp=4, mb=1, m=2, seq=4096, recompute="selective"),
    C("llama3-70b", layers=8, tp=4, pp=2, dp=16, mb=2, m=2, seq=8192, recompute="selective", stage=-1),
    C("gpt-22b", layers=8, tp=4, pp=1, dp=16, mb=2, m=2, seq=2048, recompute="selective"),
    C("llama3-8b", tp=4, pp=2, dp=16, mb=1, m=4, seq=8192, recompute="selective"),
    C("gpt-22b", layers=8, tp=8, pp=1, dp=4, mb=2, m=4, seq=4096, recompute="selective"),
    C("llama3-70b", layers=8, tp=8, pp=1, dp=16, mb=1, m=2, seq=8192, recompute="full"),
    C("llama3-8b", tp=2, pp=2, dp=16, mb=1, m=2, seq=8192, recompute="full", stage=-1),
    C("gpt-22b", layers=8, tp=4, pp=2, dp=16, mb=2, m=4, seq=8192, recompute="full", stage=-1),
    C("llama3-8b", tp=1, pp=2, dp=4, mb=2, m=4, seq=8192, recompute="full", stage=-1),
    C("llama3-8b", tp=8, pp=2, dp=4, mb=2, m=4, seq=4096, recompute="full"),
    C("llama3-70b", layers=8, tp=4, pp=1, dp=16, mb=2, m=4, seq=8192, recompute="full"),
    C("llama3-70b", layers=8, tp=1, pp=2, dp=4, mb=1, m=2, seq=8192, recompute="full"),
    C("llama3-70b", layers=8, tp=2, pp=1, dp=4, mb=2, m=2, seq=4096, recompute="full"),
]
FRESH5_OUT = REPO / "benchmarks" / "data" / "memory_measured_megatron-core_fresh5.toml"

#: --pipeline (issue 24 round 5): what a pipelined stage keeps per pass in flight, with deallocate_pipeline_outputs on
#: as Megatron-LM sets it -- interleaved stages of one or two layers per virtual stage (vp 2 and 4, where a per-pass
#: term is a large share), first and last stage, SP, full recompute, a GPT (LayerNorm, dropout) and the same cut under
#: plain 1F1B. Listed (and committed) before any is measured, after tuner.perfmodel.memory stopped charging a boundary
#: tensor per pass for Megatron-Core (95daa1c). Written to data/memory_measured_megatron-core_pipeline.toml.
PIPELINE = [
    C("llama3-8b", layers=8, tp=1, pp=4, vp=2, dp=1, mb=1, m=8, seq=4096, stage=0),
    C("llama3-8b", layers=8, tp=1, pp=4, vp=2, dp=1, mb=1, m=8, seq=4096, stage=-1),
    C("llama3-8b", layers=16, tp=1, pp=4, vp=4, dp=1, mb=1, m=8, seq=4096, stage=0),
    C("llama3-8b", layers=8, tp=2, pp=2, vp=2, dp=2, mb=1, m=4, seq=8192, stage=0),
    C("llama3-8b", layers=8, tp=1, pp=4, vp=2, dp=1, mb=1, m=8, seq=4096, recompute="full", stage=0),
    C("llama3-70b", layers=8, tp=8, pp=4, vp=2, dp=1, mb=1, m=8, seq=8192, stage=0),
    C("gpt-22b", layers=8, tp=2, pp=4, vp=2, dp=1, mb=1, m=8, seq=2048, stage=0),
    C("llama3-8b", layers=8, tp=1, pp=4, dp=1, mb=1, m=8, seq=4096, stage=0),
]
PIPELINE_OUT = REPO / "benchmarks" / "data" / "memory_measured_megatron-core_pipeline.toml"

# ----------------------------------------------------------------------------------- patches


def _patch():
    """Make Megatron-Core run on fake CPU tensors (see the module docstring). Returns the device redirect mode."""
    import torch
    import torch.distributed as dist
    from torch._subclasses.fake_tensor import FakeTensor
    from torch.overrides import TorchFunctionMode

    warnings.filterwarnings("ignore")
    cpu = torch.device("cpu")
    torch.cuda.current_device = lambda: cpu
    torch.cuda.synchronize = lambda *a, **k: None
    torch.cuda.manual_seed = lambda *a, **k: None
    torch.cuda.manual_seed_all = lambda *a, **k: None
    torch.cuda.get_rng_state = lambda *a, **k: torch.get_rng_state()
    torch.cuda.set_rng_state = lambda *a, **k: None

    class _Stream:                      # CUDA streams / events: no-ops
        def __init__(self, *a, **k):
            pass

        def __getattr__(self, name):
            return lambda *a, **k: None

        def __eq__(self, other):
            return True

        def __hash__(self):
            return 0

    _the_stream = _Stream()
    torch.cuda.Stream = _Stream
    torch.cuda.Event = _Stream
    torch.cuda.current_stream = lambda *a, **k: _the_stream
    torch.cuda.default_stream = lambda *a, **k: _the_stream
    torch.cuda.stream = lambda *a, **k: contextlib.nullcontext()

    from torch._subclasses.fake_tensor import unset_fake_temporarily

    def _item(self):
        for attr in ("_mc_value", "constant"):
            const = getattr(self, attr, None)
            if const is not None:
                with unset_fake_temporarily():
                    return const.item()
        return 1.0

    FakeTensor.item = _item

    def _tolist(self):
        const = getattr(self, "_mc_value", None)
        if const is None:
            const = getattr(self, "constant", None)
        if const is None:
            raise RuntimeError(f"tolist() of a data-dependent fake tensor {tuple(self.shape)} {self.dtype}")
        with unset_fake_temporarily():
            return const.tolist()

    FakeTensor.tolist = _tolist

    def _all_gather_object(object_list, obj, group=None):
        for i in range(len(object_list)):
            object_list[i] = obj

    dist.all_gather_object = _all_gather_object

    import torch.nn.functional as F
    cpu_dropout = F.dropout

    def _dropout(input, p=0.5, training=True, inplace=False):
        # CUDA's out-of-place dropout is the fused native_dropout (saves a 1-byte bool mask); on a CPU build
        # F.dropout multiplies by a noise tensor of the input's dtype (2 bytes, bf16) instead.
        if training and not inplace and 0.0 < p < 1.0 and isinstance(input, torch.Tensor):
            return torch.native_dropout(input, p, True)[0]
        return cpu_dropout(input, p, training, inplace)

    F.dropout = _dropout

    class _FusedAdamW(torch.optim.AdamW):
        def __init__(self, *a, **k):
            k.setdefault("fused", True)
            super().__init__(*a, **k)

    class _FusedAdam(torch.optim.Adam):
        def __init__(self, *a, **k):
            k.setdefault("fused", True)
            super().__init__(*a, **k)

    torch.optim.AdamW, torch.optim.Adam = _FusedAdamW, _FusedAdam

    # Megatron-Core's jit_fuser is torch.compile: import its modules with an identity decorator instead, so
    # that the fused-activation autograd Functions (bias_swiglu_impl / bias_gelu_impl) run eagerly.
    real_compile = torch.compile

    def _no_compile(fn=None, *a, **k):
        return fn if callable(fn) else (lambda f: f)

    torch.compile = _no_compile
    try:
        import megatron.core.jit  # noqa: F401  (binds jit_fuser to the identity)
        import megatron.core.models.gpt  # noqa: F401
        import megatron.core.fusions.fused_bias_dropout  # noqa: F401
        import megatron.core.fusions.fused_bias_gelu  # noqa: F401
        import megatron.core.fusions.fused_bias_swiglu  # noqa: F401
        import megatron.core.transformer.moe.moe_layer  # noqa: F401
        import megatron.core.transformer.moe.token_dispatcher  # noqa: F401
        import megatron.core.transformer.moe.router  # noqa: F401
        import megatron.core.transformer.moe.experts  # noqa: F401
        import megatron.core.optimizer  # noqa: F401
        import megatron.core.distributed  # noqa: F401
        import megatron.core.pipeline_parallel  # noqa: F401
    finally:
        torch.compile = real_compile

    import megatron.core.transformer.moe.moe_utils as mmoe
    if not hasattr(mmoe, "te_general_gemm"):    # referenced unguarded in RouterGatingLinearFunction without TE
        mmoe.te_general_gemm = None

    import megatron.core.distributed.param_and_grad_buffer as mpgb
    import megatron.core.optimizer.clip_grads as mclip
    import megatron.core.optimizer.optimizer as mopt
    import megatron.core.tensor_parallel.random as mrand

    mrand._get_cuda_rng_state = lambda *a, **k: torch.get_rng_state()
    mrand._set_cuda_rng_state = lambda *a, **k: None

    class _Handle:
        def wait(self):
            pass

    @contextlib.contextmanager
    def _no_coalescing(*a, **k):
        yield _Handle()

    mpgb._coalescing_manager = _no_coalescing

    def _l2norm(chunk, noop, tensor_lists, per_tensor, *a):
        norms = [torch.norm(t) for lst in tensor_lists for t in lst]
        return (torch.stack(norms).norm().reshape(1) if norms else torch.zeros(1)), None

    def _scale(chunk, noop, tensor_lists, scale):
        for src, dst in zip(tensor_lists[0], tensor_lists[1]):
            if src is not dst:
                dst.copy_(src)
            dst.mul_(scale)

    import megatron.core.transformer.torch_norm as mnorm
    mnorm.WrappedTorchNorm.__new__ = staticmethod(_norm_new())
    _fused_activation_kernels()

    mclip.l2_norm_impl = _l2norm
    mclip.multi_tensor_scale_impl = _scale
    mopt.multi_tensor_scale_impl = _scale

    def _is_cuda(d):
        if isinstance(d, str):
            return d.startswith("cuda")
        if isinstance(d, torch.device):
            return d.type == "cuda"
        return isinstance(d, int) and not isinstance(d, bool)

    from torch.utils._pytree import tree_flatten, tree_map

    _FACTORIES = {torch.full, torch.arange, torch.zeros, torch.ones, torch.tensor}

    def _value_of(x):
        return getattr(x, "_mc_value", None) if isinstance(x, FakeTensor) else x

    def _carry_value(func, args, kwargs, res):
        """Small integer tensors (MoE token counts / split sizes under drop-and-pad, which are static) carry
        their real value along (computed on real tensors next to the fake ones), so that .tolist() / .item()
        on them give the real numbers."""
        if not isinstance(res, FakeTensor) or res.dtype.is_floating_point or res.numel() > 65536:
            return
        leaves = [x for x in tree_flatten((args, kwargs))[0] if isinstance(x, torch.Tensor)]
        if not leaves and func not in _FACTORIES:
            return
        if any(_value_of(x) is None for x in leaves):
            return
        real_args, real_kwargs = tree_map(_value_of, (args, kwargs))
        if "device" in real_kwargs:
            real_kwargs = dict(real_kwargs, device=cpu)
        with unset_fake_temporarily():
            try:
                real = func(*real_args, **real_kwargs)
            except Exception:
                return
        if isinstance(real, torch.Tensor) and real.shape == res.shape:
            res._mc_value = real

    class CudaToCpu(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if "device" in kwargs and _is_cuda(kwargs["device"]):
                kwargs = dict(kwargs, device=cpu)
            if kwargs.get("pin_memory"):
                kwargs = dict(kwargs, pin_memory=False)
            if func is torch.Tensor.cuda or func is torch.Tensor.pin_memory:
                return args[0]
            if func is torch.Tensor.to:
                args = tuple(cpu if i > 0 and not isinstance(a, (torch.Tensor, torch.dtype)) and _is_cuda(a) else a
                             for i, a in enumerate(args))
            if func is torch.Tensor.type and len(args) == 1 and not kwargs:
                name = func(*args)
                return name if name.startswith("torch.cuda.") else name.replace("torch.", "torch.cuda.", 1)
            res = func(*args, **kwargs)
            if isinstance(res, FakeTensor):
                _carry_value(func, args, kwargs, res)
            return res

    return CudaToCpu


def _fused_activation_kernels():
    """Give Megatron-Core's fused bias-GeLU / bias-SwiGLU kernels the footprint they have on a GPU.

    megatron-core 0.16.1 megatron/core/fusions/fused_bias_gelu.py and fused_bias_swiglu.py: GeLUFunction /
    BiasSwiGLUFunction / SwiGLUFunction save only their input (and the bias) and call ``jit_fuser`` functions
    (``torch.compile``: one fused element-wise kernel each) -- ``bias_gelu`` / ``swiglu`` / ``bias_swiglu``
    return one tensor of the output's shape, ``bias_gelu_back`` / ``swiglu_back`` / ``bias_swiglu_back`` one
    tensor of the input's shape, and nothing else is allocated. Run eagerly (torch.compile cannot trace under
    FakeTensorMode) they allocate every element-wise intermediate (about seven FFN-wide tensors in a GeLU
    backward). Under fake tensors only shapes and dtypes matter, so each is replaced by the one allocation the
    fused kernel makes; the autograd Functions around them (what is saved for backward) are Megatron's own.
    """
    import torch
    import megatron.core.fusions.fused_bias_gelu as mgelu
    import megatron.core.fusions.fused_bias_swiglu as mswiglu

    def _dtype(y, others):
        dtype = y.dtype
        for t in others:
            dtype = torch.promote_types(dtype, t.dtype)
        return dtype

    def _like(y, *others):
        return y.new_empty(y.shape, dtype=_dtype(y, others))

    def _half(y, *others):
        return y.new_empty((*y.shape[:-1], y.shape[-1] // 2), dtype=_dtype(y, others))

    mgelu.bias_gelu = lambda bias, y: _like(y, bias)
    mgelu.bias_gelu_back = lambda g, bias, y: _like(y, g, bias)
    mswiglu.swiglu = lambda y: _half(y)
    mswiglu.bias_swiglu = lambda y, bias: _half(y, bias)
    mswiglu.swiglu_back = lambda g, y: _like(y, g)
    mswiglu.bias_swiglu_back = lambda g, y, bias: _like(y, g, bias)


def _tracker_class():
    import weakref

    from torch.distributed._tools.mem_tracker import MemTracker

    class Tracker(MemTracker):
        """MemTracker with its per-module snapshots off (see the docstring); AC detection kept."""

        def _pre_fw_hook(self, module, inputs):
            if self._mod_tracker.is_bw and self._ac_mod is None:
                self._ac_mod = weakref.ref(module)
                self._in_ac = True

        def _post_fw_hook(self, module, inputs, outputs):
            if self._mod_tracker.is_bw and self._ac_mod is not None and self._ac_mod() is module:
                self._ac_mod = None
                self._in_ac = False

        def _pre_bw_hook(self, module, args):
            pass

        def _post_bw_hook(self, module, args):
            pass

        def tag(self, tensor, reftype):
            self._update_and_maybe_create_winfos(tensor, reftype)

        def retag_all(self, old, new):
            from torch.distributed._tools.mem_tracker import _UpdateType
            for winfo, _ in list(self._WINFO.values()):
                if winfo.reftype == old:
                    winfo.reftype = new
                    self._update_snap(_UpdateType.REF, winfo, old_reftype=old)

        def reset_peak(self):
            snap = self.get_tracker_snapshot()
            self._peak_mem_snap = snap
            self._peak_mem = {dev: s["Total"] for dev, s in snap.items()}

    return Tracker


def _flash_standin_class():
    """A core-attention module with FlashAttention's memory footprint (see the docstring)."""
    import torch
    from megatron.core import parallel_state
    from megatron.core.transformer.module import MegatronModule

    class _FlashFn(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v, cp):
            sq, b, heads, hn = q.shape
            out = q.new_empty(sq, b, heads * hn)
            lse = torch.empty(b, heads, sq, dtype=torch.float32, device=q.device)
            if cp > 1:      # ring attention: the next two K/V chunks in flight while one is computed on
                bufs = [torch.empty_like(k), torch.empty_like(v), torch.empty_like(k), torch.empty_like(v)]
                del bufs
            ctx.cp = cp
            ctx.save_for_backward(q, k, v, out, lse)
            return out

        @staticmethod
        def backward(ctx, dout):
            q, k, v, out, lse = ctx.saved_tensors
            if ctx.cp > 1:  # ring backward: K/V chunks and their dK/dV accumulators travel the ring
                bufs = [torch.empty_like(k), torch.empty_like(v), torch.empty_like(k), torch.empty_like(v)]
                del bufs
            return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), None

    class FlashStandinAttention(MegatronModule):
        def __init__(self, config, layer_number, attn_mask_type, attention_type, attention_dropout=None,
                     softmax_scale=None, cp_comm_type=None, pg_collection=None):
            super().__init__(config=config)
            self.cp = config.context_parallel_size

        def forward(self, query, key, value, attention_mask, attn_mask_type=None, attention_bias=None,
                    packed_seq_params=None):
            return _FlashFn.apply(query, key, value, self.cp)

    del parallel_state
    return FlashStandinAttention


def _norm_new():
    """Replacement for megatron.core.transformer.torch_norm.WrappedTorchNorm.__new__ (see the docstring)."""
    import torch

    class _RMSNormFn(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, weight, eps):
            rstd = torch.empty(x.shape[:-1] + (1,), dtype=torch.float32, device=x.device)
            ctx.save_for_backward(x, weight, rstd)
            return torch.empty_like(x)

        @staticmethod
        def backward(ctx, dy):
            x, weight, rstd = ctx.saved_tensors
            return torch.empty_like(x), torch.empty_like(weight), None

    class FusedRMSNormStandin(torch.nn.Module):
        def __init__(self, hidden_size, eps, dtype):
            super().__init__()
            self.eps = eps
            self.weight = torch.nn.Parameter(torch.ones(hidden_size, dtype=dtype))

        def forward(self, x):
            return _RMSNormFn.apply(x, self.weight, self.eps)

    def __new__(cls, config, hidden_size, eps=1e-5, persist_layer_norm=False, zero_centered_gamma=False,
                normalization="LayerNorm"):
        if config.normalization == "RMSNorm":
            norm = FusedRMSNormStandin(hidden_size, eps, config.params_dtype)
        else:
            norm = torch.nn.LayerNorm(hidden_size, eps=eps, dtype=config.params_dtype)
        for p in norm.parameters():      # as Megatron's FusedLayerNorm / TENorm mark them
            setattr(p, "sequence_parallel", config.sequence_parallel)
        return norm

    return __new__


# ----------------------------------------------------------------------------------- one configuration


def _rank_of(c):
    """Global rank of tp-rank 0, cp-rank 0, dp-rank 0 on the measured pipeline stage (order tp-cp-ep-dp-pp)."""
    return c["stage"] * c["tp"] * c["cp"] * c["dp"]


def measure(c, redirect_mode):
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.mem_tracker import _MemRefType
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from megatron.core import parallel_state
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.distributed import finalize_model_grads
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.pipeline_parallel import get_forward_backward_func
    import megatron.core.pipeline_parallel.schedules as schedules
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
    from megatron.core.transformer import TransformerConfig

    tp, pp, cp, dp, ep = c["tp"], c["pp"], c["cp"], c["dp"], c["ep"]
    world = tp * pp * cp * dp
    rank = _rank_of(c)
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world)
    vp = c.get("vp", 1)
    parallel_state.initialize_model_parallel(tp, pp, virtual_pipeline_model_parallel_size=vp if vp > 1 else None,
                                             context_parallel_size=cp, expert_model_parallel_size=ep,
                                             create_gloo_process_groups=False)
    assert parallel_state.get_pipeline_model_parallel_rank() == c["stage"], "wrong rank for the stage"
    model_parallel_cuda_manual_seed(1234)

    moe = c.get("num_experts", 0) > 0
    norm = "RMSNorm" if c["normalization"] == "rmsnorm" else "LayerNorm"
    kw = {}
    if c["recompute"] == "full":
        kw.update(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1)
    elif c["recompute"] == "selective":
        kw.update(recompute_granularity="selective")
    if moe:
        kw.update(num_moe_experts=c["num_experts"], moe_router_topk=c["moe_router_topk"],
                  moe_ffn_hidden_size=c["moe_ffn_hidden_size"], moe_token_dispatcher_type="alltoall",
                  moe_grouped_gemm=False, moe_router_load_balancing_type="aux_loss", moe_aux_loss_coeff=1e-2,
                  moe_expert_capacity_factor=1.0, moe_pad_expert_input_to_capacity=True,
                  expert_model_parallel_size=ep)
    swiglu = c["ffn_type"] == "swiglu"
    cfg = TransformerConfig(
        num_layers=c["num_layers"], hidden_size=c["hidden_size"], num_attention_heads=c["num_attention_heads"],
        num_query_groups=c["num_query_groups"], ffn_hidden_size=c["ffn_hidden_size"],
        gated_linear_unit=swiglu, activation_func=F.silu if swiglu else F.gelu, normalization=norm,
        add_bias_linear=c["add_bias_linear"], hidden_dropout=c["dropout"], attention_dropout=c["dropout"],
        bf16=True, params_dtype=torch.bfloat16, pipeline_dtype=torch.bfloat16,
        tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp, context_parallel_size=cp,
        virtual_pipeline_model_parallel_size=vp if vp > 1 else None, sequence_parallel=c["sequence_parallel"],
        # Megatron-LM's defaults where they run without CUDA: fused bias+SwiGLU / bias+GeLU (autograd
        # Functions that save only their input), bias-dropout-add; CUDA-only kernels off: the masked-softmax
        # kernel (local attention), TE's fused RoPE, gradient-accumulation fusion, persistent LayerNorm.
        bias_activation_fusion=True, bias_dropout_fusion=True,
        masked_softmax_fusion=False, apply_rope_fusion=False, gradient_accumulation_fusion=False,
        persist_layer_norm=False,
        deallocate_pipeline_outputs=True,     # as Megatron-LM sets it
        **kw)

    spec = get_gpt_layer_local_spec(num_experts=c.get("num_experts") or None, moe_grouped_gemm=False,
                                    normalization=norm)
    if c["attention"] == "flash-standin":
        spec = copy.deepcopy(spec)
        spec.submodules.self_attention.submodules.core_attention = _flash_standin_class()
    elif cp > 1:
        raise ValueError("Megatron-Core's local DotProductAttention has no context parallelism")

    s, b, m, V = c["seq_length"], c["micro_batch"], c["num_microbatches"], c["vocab_size"]
    s_local = s // cp
    Tracker = _tracker_class()
    counts = {"fwd": 0, "bwd": 0, "max_in_flight": 0, "p2p_ops": 0}
    orig_backward_step = schedules.backward_step

    def counting_backward_step(*a, **k):
        counts["bwd"] += 1
        return orig_backward_step(*a, **k)

    schedules.backward_step = counting_backward_step
    orig_batch_p2p = dist.batch_isend_irecv

    def counting_batch_p2p(ops):
        counts["p2p_ops"] += len(ops)
        return orig_batch_p2p(ops)

    dist.batch_isend_irecv = counting_batch_p2p

    t0 = time.time()
    with redirect_mode(), FakeTensorMode(allow_non_fake_inputs=True):
        mt = Tracker()
        with mt:
            gpts, cast = _model_chunks(c, cfg, spec, GPTModel, parallel_state)
            n_params = sum(p.numel() for gpt in gpts for p in gpt.parameters())
            ddp_cfg = DistributedDataParallelConfig(grad_reduce_in_fp32=True,
                                                    use_distributed_optimizer=c["distributed_optimizer"])
            # one DDP per virtual stage, bucketing only the first's (Megatron-LM's training.get_model)
            models = [DistributedDataParallel(cfg, ddp_cfg, gpt, disable_bucketing=i > 0) for i, gpt in enumerate(gpts)]
            opt = get_megatron_optimizer(
                OptimizerConfig(optimizer="adam", bf16=True, use_distributed_optimizer=c["distributed_optimizer"],
                                lr=1e-4, weight_decay=0.1, clip_grad=1.0),
                models, use_gloo_process_groups=False)
            # Categorise what construction allocated: bf16 params, the fp32 grad buffers, fp32 main params.
            for gpt, model in zip(gpts, models):
                for p in gpt.parameters():
                    mt.tag(p, _MemRefType.PARAM)
                for buf in list(model.buffers) + list(model.expert_parallel_buffers):
                    mt.tag(buf.grad_data, _MemRefType.GRAD)
                    if buf.param_data is not None:
                        mt.tag(buf.param_data, _MemRefType.PARAM)
            for sub in getattr(opt, "chained_optimizers", [opt]):
                groups = getattr(sub, "shard_fp32_from_float16_groups", None) or \
                    getattr(sub, "fp32_from_float16_groups", [])
                for g in groups:
                    for t in g:
                        if t is not None:
                            mt.tag(t, _MemRefType.OPT)
            mt.retag_all(_MemRefType.ACT, _MemRefType.OTH)

            # Steady state: Adam's moments exist before the measured iteration (one step on zero gradients).
            for model in models:
                model.zero_grad_buffer()
            opt.zero_grad()
            opt.step()
            mt.retag_all(_MemRefType.ACT, _MemRefType.OTH)
            after_init = mt.get_tracker_snapshot()
            for model in models:
                model.zero_grad_buffer()
            opt.zero_grad()
            mt.reset_peak()

            cfg.finalize_model_grads_func = finalize_model_grads
            cfg.no_sync_func = [model.no_sync for model in models] if vp > 1 else models[0].no_sync
            cfg.grad_scale_func = opt.scale_loss

            def forward_step(data_iterator, mdl):
                counts["fwd"] += 1
                counts["max_in_flight"] = max(counts["max_in_flight"], counts["fwd"] - counts["bwd"])
                tokens = torch.randint(0, V, (b, s_local), device="cuda")
                position_ids = torch.arange(s_local, device="cuda").unsqueeze(0).expand(b, s_local)
                labels = torch.randint(0, V, (b, s_local), device="cuda")
                loss_mask = torch.ones(b, s_local, dtype=torch.float, device="cuda")
                out = mdl(tokens, position_ids, None, labels=labels)

                def loss_func(output_tensor):
                    losses = output_tensor.float().view(-1)
                    loss = torch.sum(losses * loss_mask.view(-1)) / loss_mask.sum()
                    return loss, {"lm loss": loss.detach()}

                return out, loss_func

            fb = get_forward_backward_func()
            # seq_length is the full sequence: the schedule divides it by cp (and tp with SP) for p2p shapes
            fb(forward_step_func=forward_step, data_iterator=[None] * vp if vp > 1 else None, model=models,
               num_microbatches=m,
               seq_length=s, micro_batch_size=b, forward_only=False)
            fb_peak = mt.get_tracker_snapshot("peak")
            opt.step()
            peak = mt.get_tracker_snapshot("peak")

    schedules.backward_step = orig_backward_step
    dist.batch_isend_irecv = orig_batch_p2p
    dev = next(iter(peak))

    def cats(snap):
        d = snap.get(dev, {})
        g = lambda t: d.get(t, 0)
        return dict(parameters=g(_MemRefType.PARAM), gradients=g(_MemRefType.GRAD), optimizer=g(_MemRefType.OPT),
                    activations=g(_MemRefType.ACT), temp=g(_MemRefType.TEMP),
                    other=g(_MemRefType.OTH) + g(_MemRefType.BUFFER), total=d.get("Total", 0))

    return dict(peak=cats(peak), fb_peak=cats(fb_peak), after_init=cats(after_init), n_params=n_params,
                fwd=counts["fwd"], bwd=counts["bwd"], max_in_flight=counts["max_in_flight"],
                p2p_ops=counts["p2p_ops"], schedule=fb.__name__, seconds=time.time() - t0, cast=cast)


def _model_chunks(c, cfg, spec, GPTModel, parallel_state):
    """The GPTModel of each virtual pipeline stage this rank holds (one without interleaving), cast to bf16 as
    Megatron-LM's Float16Module does (module.bfloat16() cannot swap fake parameters, so in place: e.g. the learned
    position table is built fp32), and the names cast."""
    import torch
    vp, gpts, cast = c.get("vp", 1), [], []
    for i in range(vp):
        at = dict(ignore_virtual=False, vp_stage=i) if vp > 1 else {}
        gpt = GPTModel(cfg, spec, vocab_size=c["vocab_size"], max_sequence_length=c["seq_length"],
                       pre_process=parallel_state.is_pipeline_first_stage(**at),
                       post_process=parallel_state.is_pipeline_last_stage(**at),
                       share_embeddings_and_output_weights=c["tie_embeddings"],
                       position_embedding_type="rope" if c["position_embedding"] == "rope" else "learned_absolute",
                       rotary_base=int(c.get("rope_theta", 10000)), **({"vp_stage": i} if vp > 1 else {}))
        for name, prm in gpt.named_parameters():
            if prm.dtype.is_floating_point and prm.dtype != torch.bfloat16:
                prm.data = prm.data.to(torch.bfloat16)
                cast.append(name)
        for mod in gpt.modules():
            for bname, buf in list(mod._buffers.items()):
                if buf is not None and buf.dtype.is_floating_point and buf.dtype != torch.bfloat16:
                    mod._buffers[bname] = buf.to(torch.bfloat16)
                    cast.append(bname)
        gpts.append(gpt)
    return gpts, cast


def _child(c, redirect_mode, conn):
    try:
        conn.send(("ok", measure(c, redirect_mode)))
    except BaseException as e:  # report every failure to the parent
        tb = traceback.format_exc()
        conn.send(("err", f"{type(e).__name__}: {e}".splitlines()[0][:300], tb))
    finally:
        conn.close()


# ----------------------------------------------------------------------------------- output


ARCH_KEYS = ("num_layers", "hidden_size", "num_attention_heads", "num_query_groups", "ffn_hidden_size",
             "vocab_size", "ffn_type", "position_embedding", "tie_embeddings", "normalization", "add_bias_linear",
             "num_experts", "moe_top_k", "moe_ffn_hidden_size")


def _presets():
    out = {}
    for f in sorted((REPO / "workloads" / "models").glob("*.toml")):
        d = tomllib.loads(f.read_text())
        d.setdefault("ffn_type", "gelu")
        d.setdefault("ffn_hidden_size", 4 * d["hidden_size"] if d["ffn_type"] == "gelu" else None)
        d.setdefault("num_query_groups", d["num_attention_heads"])
        d.setdefault("position_embedding", "learned")
        d.setdefault("tie_embeddings", True)
        d.setdefault("normalization", "layernorm")
        d.setdefault("add_bias_linear", True)
        d.setdefault("num_experts", 0)
        d.setdefault("moe_top_k", None)
        d.setdefault("moe_ffn_hidden_size", d["ffn_hidden_size"] if d["num_experts"] else None)
        d.setdefault("head_dim", None)
        d.setdefault("qk_layernorm", False)
        d.setdefault("multi_latent_attention", False)
        out[d["name"]] = d
    return out


def _model_name(c, presets):
    mine = dict(c, num_experts=c.get("num_experts", 0), moe_top_k=c.get("moe_router_topk"),
                moe_ffn_hidden_size=c.get("moe_ffn_hidden_size"))
    for name, p in presets.items():
        if p["head_dim"] not in (None, c["hidden_size"] // c["num_attention_heads"]) or p["qk_layernorm"] \
                or p["multi_latent_attention"] or p.get("num_shared_experts", 0) or p.get("moe_first_dense_layers", 0):
            continue
        if all(p[k] == mine[k] for k in ARCH_KEYS):
            return name
    return "custom"


def _toml_value(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return repr(round(v, 4))
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{k} = {_toml_value(x)}" for k, x in v.items()) + " }"
    return '"' + str(v).replace("\\", "\\\\").replace('"', '\\"') + '"'


def _attention_text(c):
    if c["attention"] == "local":
        return ("local: Megatron-Core DotProductAttention (unfused baddbmm + fp32 torch softmax + bmm), keeps the "
                "s x s scores")
    txt = ("flash-standin: FlashAttention-like core attention (saves q, k, v, out, fp32 lse), keeps no s x s "
           "scores")
    return txt + ("; cp > 1: ring-attention footprint" if c["cp"] > 1 else "")


def _row(c, r, version, presets):
    model = _model_name(c, presets)
    pk, fb, init = r["peak"], r["fb_peak"], r["after_init"]
    row = dict(framework="megatron-core",
               source=f"measured: megatron-core {version} GPTModel (local spec) under FakeTensorMode, torch 2.13.0 "
                      f"MemTracker, benchmarks/measure_memory_mcore.py",
               release=f"megatron-core {version}", model=model)
    for k in ("num_layers", "hidden_size", "num_attention_heads", "num_query_groups", "ffn_hidden_size",
              "vocab_size", "seq_length", "ffn_type"):
        row[k] = c[k]
    if c.get("num_experts"):
        row.update(num_experts=c["num_experts"], moe_router_topk=c["moe_router_topk"],
                   moe_ffn_hidden_size=c["moe_ffn_hidden_size"])
    if model == "custom":
        row.update(position_embedding=c["position_embedding"], tie_embeddings=c["tie_embeddings"],
                   normalization=c["normalization"], add_bias_linear=c["add_bias_linear"])
    gpus = c["tp"] * c["cp"] * c["pp"] * c["dp"]
    row.update(gpus=gpus, tp=c["tp"], pp=c["pp"], cp=c["cp"], vp=c.get("vp", 1), dp=c["dp"])
    if c.get("num_experts"):
        row.update(ep=c["ep"], etp=c["tp"])
    row.update(micro_batch=c["micro_batch"], global_batch=c["micro_batch"] * c["num_microbatches"] * c["dp"],
               sequence_parallel=c["sequence_parallel"], recompute=c["recompute"],
               distributed_optimizer=c["distributed_optimizer"], zero_stage=1 if c["distributed_optimizer"] else 0,
               precision="bf16", stage=c["stage"], attention=_attention_text(c),
               peak_allocated_gib=pk["total"] / GiB,
               breakdown_gib={k: pk[k] / GiB for k in ("parameters", "gradients", "optimizer", "activations", "temp",
                                                       "other")})
    where = "the optimizer step" if pk["total"] > fb["total"] else "forward/backward"
    note = (f"num_microbatches {c['num_microbatches']}; rank {_rank_of(c)} of {gpus} (tp/cp/dp rank 0, pipeline "
            f"stage {c['stage']}); {r['n_params']} parameters on this rank; schedule {r['schedule']} ran "
            f"{r['fwd']} forward and {r['bwd']} backward micro-batch steps, at most {r['max_in_flight']} in flight"
            + (f", {r['p2p_ops']} fake p2p ops" if c["pp"] > 1 else "") + f"; the peak is in {where}; "
            f"forward/backward peak {fb['total'] / GiB:.4f} GiB (activations {fb['activations'] / GiB:.4f}, temp "
            f"{fb['temp'] / GiB:.4f}); model states before the iteration {init['total'] / GiB:.4f} GiB (parameters "
            f"{init['parameters'] / GiB:.4f}, gradients {init['gradients'] / GiB:.4f}, optimizer "
            f"{init['optimizer'] / GiB:.4f}, other {init['other'] / GiB:.4f}); 'other' = tensors allocated at "
            f"construction or in the warm-up step that are not parameters, gradient buffers, fp32 main params or "
            f"Adam states; dropout {c['dropout']}")
    if c.get("num_experts"):
        note += (f"; MoE: ep {c['ep']}, alltoall dispatcher, SequentialMLP experts, capacity factor 1.0 with "
                 f"padding to capacity (drop-and-pad: static shapes under fake tensors), aux-loss router")
    if model == "custom":
        note += f"; shape of {c['shape']} with {c['num_layers']} layers"
    row["note"] = note
    return row


def write_toml(rows, path, version):
    head = [
        f"# MEASURED per-GPU peak memory of Megatron-Core {version}'s own GPT training step, one [[row]] per",
        "# configuration, written by benchmarks/measure_memory_mcore.py (see its docstring: GPTModel with the local",
        "# layer spec, Megatron-Core DDP with an fp32 gradient buffer, its optimizer (bf16 params, fp32 main params,",
        "# Adam, fused in-place), one steady-state iteration through get_forward_backward_func() and",
        "# optimizer.step(), under FakeTensorMode on a fake process group; MemTracker's peak of allocated bytes of",
        "# the one rank named by `stage` (tp/cp/dp rank 0)). GiB = 2^30 bytes. breakdown_gib is MemTracker's split",
        "# AT THE PEAK: parameters (bf16 weights / param buffer), gradients (the fp32 grad buffer), optimizer (fp32",
        "# main params + Adam moments), activations (allocated during the forward passes and not yet freed), temp",
        "# (allocated during backward: gradients of activations, per-param bf16 weight gradients before they are",
        "# added into the fp32 buffer), other (see note). No caching-allocator fragmentation, CUDA context or NCCL",
        "# buffers are included.",
        "",
    ]
    out = list(head)
    for r in rows:
        out.append("[[row]]")
        for k, v in r.items():
            out.append(f"{k} = {_toml_value(v)}")
        out.append("")
    Path(path).write_text("\n".join(out))


# ----------------------------------------------------------------------------------- main


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None, help=f"output TOML (default {DEFAULT_OUT.name}; --fresh: {FRESH_OUT.name})")
    ap.add_argument("--fresh", action="store_true", help="the FRESH configurations instead of CONFIGS")
    ap.add_argument("--pipeline", action="store_true", help="the PIPELINE configurations instead of CONFIGS")
    ap.add_argument("--fresh2", action="store_true", help="the FRESH2 configurations instead of CONFIGS")
    ap.add_argument("--fresh3", action="store_true", help="the FRESH3 configurations instead of CONFIGS")
    ap.add_argument("--fresh4", action="store_true", help="the FRESH4 configurations instead of CONFIGS")
    ap.add_argument("--fresh5", action="store_true", help="the FRESH5 configurations instead of CONFIGS")
    ap.add_argument("--only", default=None, help="comma-separated indices into CONFIGS")
    ap.add_argument("--list", action="store_true", help="print the configurations and exit")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per configuration")
    ap.add_argument("--verbose", action="store_true", help="print full tracebacks of failures")
    args = ap.parse_args(argv)
    configs = (FRESH if args.fresh else FRESH2 if args.fresh2 else FRESH3 if args.fresh3 else FRESH4 if args.fresh4
               else FRESH5 if args.fresh5 else PIPELINE if args.pipeline else CONFIGS)
    args.out = args.out or str(FRESH_OUT if args.fresh else FRESH2_OUT if args.fresh2 else FRESH3_OUT if args.fresh3
                               else FRESH4_OUT if args.fresh4 else FRESH5_OUT if args.fresh5
                               else PIPELINE_OUT if args.pipeline else DEFAULT_OUT)
    idx = list(range(len(configs))) if args.only is None else [int(i) for i in args.only.split(",")]
    if args.list:
        for i in idx:
            c = configs[i]
            print(i, c["shape"], c["num_layers"], {k: c.get(k, 1) for k in (
                  "tp", "pp", "vp", "cp", "dp", "ep", "micro_batch",
                  "num_microbatches", "seq_length", "sequence_parallel", "recompute", "distributed_optimizer",
                  "attention", "stage")})
        return 0

    t_all = time.time()
    redirect_mode = _patch()          # imports torch and megatron once; every child is forked from here
    from importlib.metadata import version as pkg_version
    version = pkg_version("megatron-core")
    import torch
    assert torch.__version__.startswith("2.13.0"), torch.__version__
    presets = _presets()
    ctx = mp.get_context("fork")
    rows, failures = [], []
    for i in idx:
        c = configs[i]
        t0 = time.time()
        parent, child = ctx.Pipe(duplex=False)
        p = ctx.Process(target=_child, args=(c, redirect_mode, child))
        p.start()
        child.close()
        res = None
        if parent.poll(args.timeout):
            try:
                res = parent.recv()
            except EOFError:
                res = None
        p.join(5)
        if p.is_alive():
            p.kill()
            p.join()
        dt = time.time() - t0
        label = (f"[{i}] {c['shape']} L{c['num_layers']} tp{c['tp']} pp{c['pp']} vp{c.get('vp', 1)} cp{c['cp']} "
                 f"dp{c['dp']} "
                 f"ep{c['ep']} mb{c['micro_batch']} m{c['num_microbatches']} s{c['seq_length']} "
                 f"sp={int(c['sequence_parallel'])} rc={c['recompute']} do={int(c['distributed_optimizer'])} "
                 f"{c['attention']} stage{c['stage']}")
        if res is None:
            failures.append((i, label, f"no result (exit code {p.exitcode}, {dt:.0f} s)"))
            print(f"{label}: FAILED no result ({dt:.1f} s)", flush=True)
            continue
        if res[0] == "err":
            failures.append((i, label, res[1]))
            print(f"{label}: FAILED {res[1]} ({dt:.1f} s)", flush=True)
            if args.verbose:
                print(res[2])
            continue
        r = res[1]
        rows.append(_row(c, r, version, presets))
        print(f"{label}: peak {r['peak']['total'] / GiB:.3f} GiB ({dt:.1f} s)", flush=True)
    write_toml(rows, args.out, version)
    print(f"\n{len(rows)} rows written to {args.out}; {len(failures)} failed; total {time.time() - t_all:.0f} s")
    for i, label, err in failures:
        print(f"  FAILED {label}: {err}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
