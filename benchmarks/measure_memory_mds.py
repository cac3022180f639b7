"""Measure the per-GPU peak memory of Megatron-DeepSpeed's own GPT training step, without a GPU.

For each configuration (benchmarks/mds_memory/configs.py: CONFIGS, or FRESH with --fresh) this script writes what
`tuner launch` writes for it on Frontier -- pretrain_gpt.py's arguments and ds_config.json (tuner.render.megatron) --
and runs, in a process of its own, ONE rank of that job through Megatron-DeepSpeed's own code: its argument parsing
and validation, its parallel state, pretrain_gpt.py's ``model_provider`` (GPTModelPipe on DeepSpeed's pipeline engine,
or GPTModel with --no-pipeline-parallel), ``setup_model_and_optimizer`` (deepspeed.initialize with the ZeRO stage,
bf16, Megatron's Adam) and two iterations of ``train_step`` (the pipeline engine's train_batch over all micro-batches,
or Megatron's schedule with DeepSpeed's backward; the optimizer step), all under PyTorch's ``FakeTensorMode`` (no real
storage) on a fake process group (collectives and p2p do nothing). ``torch.distributed._tools.mem_tracker.MemTracker``
follows every storage from construction on; the row is the peak of allocated bytes over the second iteration (Adam's
states exist by then), for the rank that is tensor- and data-parallel rank 0 of the stage named.

Set-up (outside the repository; torch pinned so that pip takes the CPU build):

    python3 -m venv /work/mdsvenv && . /work/mdsvenv/bin/activate
    pip install torch==2.13.0 deepspeed==0.19.8 einops -e .
    git clone https://github.com/microsoft/Megatron-DeepSpeed /work/mds && git -C /work/mds checkout f4157bea
    python benchmarks/measure_memory_mds.py --mds-dir /work/mds [--fresh] [--only N[,M...]] [--list] [--jobs 2]

Output: benchmarks/data/memory_measured_megatron-deepspeed.toml (--fresh: ..._fresh.toml), one [[row]] per
configuration that ran; failures are printed at the end and written nowhere.

What is patched, and why (benchmarks/mds_memory/patches.py; nothing in Megatron-DeepSpeed's or DeepSpeed's files is
edited):
  * Megatron-Core's measurement's patches (benchmarks/mcore_memory/patches.py): CUDA calls and ``device="cuda"``
    redirected to the CPU, streams and RNG calls made no-ops, a fake tensor's ``.item()`` answers its value where
    fake mode carries one (else 1.0), CUDA's fused dropout (a 1-byte mask) and the fused in-place Adam (apex's
    FusedAdam's footprint; without apex Megatron-DeepSpeed takes torch's Adam).
  * ``flash_attn``: a stand-in with FlashAttention-2's footprint (saves q, k, v, out and the fp32 log-sum-exp; no
    s x s tensor), which ``--use-flash-attn-v2`` (what tuner launch writes for Frontier) calls.
  * DeepSpeed: a fake tensor's truth is False and its format 1.0 (its inf / nan checks and its loss log line), the
    ZeRO optimizers' ``has_overflow`` False (bf16 never overflows in a real run's steady state), a module's
    device-only ``.to()`` does nothing (the fake parameters are already on the CPU; swapping them fails), and the
    pipeline engine's partition metas carry their real values (``patch_pipeline_metas``).
  * DeepSpeed's engine takes the fused Adam above as the fused optimizer apex's is (at ZeRO 0 the plain engine wraps
    it in FP16_Optimizer, not the unfused one); a later pipeline stage's received-activation buffers are allocated as
    DeepSpeed allocates them from the shapes the previous stage would send (the fake p2p carries none).
  * Megatron-DeepSpeed: the tokenizer (its padded vocabulary only), the FlashAttention op builder (none on CPU), apex's
    gradient-accumulation-fusion check (inert in this Megatron-DeepSpeed: the fused weight-gradient call is commented
    out), the tensor-parallel broadcast of the batch (tp rank 0's batch as is), TorchScript (run eagerly) and the fused
    bias-GeLU's element-wise functions (one allocation each, as the fused kernel), GPTModelPipe's final LayerNorm
    (torch's native kernel taking Megatron's arguments), the rotary table's cache (f4157bea calls .to() on a list), and,
    without the pipeline engine under sequence parallelism, the whole sequence into the embedding (f4157bea cuts it
    twice and fails; the rows it touches say so); the packages it imports for tokenizers, vision and logging are
    stubbed, and ``deepspeed.compression.compress`` (gone from DeepSpeed 0.19).
  * MemTracker runs without its module hooks: their per-module gradient hooks keep every micro-batch's received input
    and its gradient alive on a later pipeline stage, which the pipeline engine frees.
Numbers are allocated bytes: no caching-allocator fragmentation, no device context, no RCCL / NCCL buffers.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

from mds_memory.configs import CONFIGS, DEFAULT_OUT, FRESH, FRESH_OUT, GiB, label, rank_of  # noqa: E402
from mds_memory.rows import launch_files, to_row, write_toml  # noqa: E402


def _parser():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mds-dir", default="/work/mds", help="a Megatron-DeepSpeed checkout at f4157bea")
    ap.add_argument("--out", default=None, help=f"output TOML (default {DEFAULT_OUT.name}; --fresh: {FRESH_OUT.name})")
    ap.add_argument("--fresh", action="store_true", help="the FRESH configurations (held out) instead of CONFIGS")
    ap.add_argument("--only", default=None, help="comma-separated indices into the list")
    ap.add_argument("--list", action="store_true", help="print the configurations and exit")
    ap.add_argument("--jobs", type=int, default=1, help="configurations measured at once")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds per configuration")
    return ap


def run_one(c: dict, mds_dir: str, timeout: float) -> dict:
    """One configuration in its own process: {"ok": its result} or {"err": why, with the last lines it printed}."""
    from tuner.specs import load_model
    with tempfile.TemporaryDirectory() as d:
        argv, ds_config = launch_files(c, str(Path(d) / "ds_config.json"))
        (Path(d) / "ds_config.json").write_text(json.dumps(ds_config))
        spec = dict(argv=argv, world=c["tp"] * c["pp"] * c["dp"], rank=rank_of(c),
                    vocab=load_model(c["model"]).vocab_size, mds_dir=mds_dir)
        try:
            p = subprocess.run([sys.executable, str(BENCH / "mds_memory" / "step.py"), json.dumps(spec)], cwd=d,
                               capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return {"err": f"over {timeout:.0f} s"}
    found = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
    if found:
        return {"ok": json.loads(found[-1][7:])}
    tail = [ln for ln in (p.stderr + p.stdout).splitlines() if ln.strip()][-3:]
    return {"err": f"exit {p.returncode}: " + " | ".join(tail)[-400:]}


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    configs = FRESH if args.fresh else CONFIGS
    out = args.out or str(FRESH_OUT if args.fresh else DEFAULT_OUT)
    idx = list(range(len(configs))) if args.only is None else [int(i) for i in args.only.split(",")]
    if args.list:
        for i in idx:
            print(i, label(configs[i]))
        return 0
    if not (Path(args.mds_dir) / "pretrain_gpt.py").exists():
        print(f"error: no Megatron-DeepSpeed checkout at {args.mds_dir}: pass --mds-dir (see this script's docstring)",
              file=sys.stderr)
        return 2
    import deepspeed
    import torch
    versions = {"torch": torch.__version__.split("+")[0], "deepspeed": deepspeed.__version__}
    t0, rows, failures = time.time(), {}, []

    def one(i):
        res = run_one(configs[i], args.mds_dir, args.timeout)
        if "ok" in res:
            rows[i] = to_row(configs[i], res["ok"], versions)
            print(f"[{i}] {label(configs[i])}: peak {res['ok']['peak'] / GiB:.3f} GiB "
                  f"({res['ok']['seconds']:.0f} s)", flush=True)
        else:
            failures.append((i, res["err"]))
            print(f"[{i}] {label(configs[i])}: FAILED {res['err']}", flush=True)

    with ThreadPoolExecutor(max(1, args.jobs)) as pool:
        list(pool.map(one, idx))
    write_toml([rows[i] for i in sorted(rows)], out)
    print(f"\n{len(rows)} rows written to {out}; {len(failures)} failed; {time.time() - t0:.0f} s")
    for i, err in sorted(failures):
        print(f"  FAILED [{i}] {label(configs[i])}: {err}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
