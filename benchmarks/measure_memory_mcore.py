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

What is patched, and why (all in ``_patch()``, benchmarks/mcore_memory/patches.py; nothing in megatron-core's files is edited):
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
import multiprocessing as mp
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from mcore_memory.configs import (CONFIGS, DEFAULT_OUT, FRESH, FRESH2, FRESH2_OUT, FRESH3, FRESH3_OUT,  # noqa: E402
                                  FRESH4, FRESH4_OUT, FRESH5, FRESH5_OUT, FRESH_OUT, GiB, PIPELINE, PIPELINE_OUT)
from mcore_memory.rows import _presets, _row, write_toml  # noqa: E402


def _parser():
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
    return ap


def main(argv=None):
    args = _parser().parse_args(argv)
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
    return _measure_all(args, configs, idx)


def _measure_all(args, configs, idx):
    """Each configuration in a forked child; the rows that ran written to args.out, failures printed."""
    from mcore_memory.patches import _patch

    t_all = time.time()
    redirect_mode = _patch()          # imports torch and megatron once; every child is forked from here
    from importlib.metadata import version as pkg_version
    version = pkg_version("megatron-core")
    import torch
    assert torch.__version__.startswith("2.13.0"), torch.__version__
    presets = _presets()
    rows, failures = [], []
    for i in idx:
        c = configs[i]
        t0 = time.time()
        res, exitcode = _run_child(c, redirect_mode, args.timeout)
        dt = time.time() - t0
        label = (f"[{i}] {c['shape']} L{c['num_layers']} tp{c['tp']} pp{c['pp']} vp{c.get('vp', 1)} cp{c['cp']} "
                 f"dp{c['dp']} "
                 f"ep{c['ep']} mb{c['micro_batch']} m{c['num_microbatches']} s{c['seq_length']} "
                 f"sp={int(c['sequence_parallel'])} rc={c['recompute']} do={int(c['distributed_optimizer'])} "
                 f"{c['attention']} stage{c['stage']}")
        if res is None:
            failures.append((i, label, f"no result (exit code {exitcode}, {dt:.0f} s)"))
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


def _run_child(c, redirect_mode, timeout):
    """One configuration measured in a forked child: its result (None if none came back) and exit code."""
    from mcore_memory.step import _child

    ctx = mp.get_context("fork")
    parent, child = ctx.Pipe(duplex=False)
    p = ctx.Process(target=_child, args=(c, redirect_mode, child))
    p.start()
    child.close()
    res = None
    if parent.poll(timeout):
        try:
            res = parent.recv()
        except EOFError:
            res = None
    p.join(5)
    if p.is_alive():
        p.kill()
        p.join()
    return res, p.exitcode


if __name__ == "__main__":
    sys.exit(main())
