"""Peak per-GPU memory of torchtitan's own training step (Llama 3, Qwen3 MoE), measured on a CPU with fake tensors.

Writes benchmarks/data/memory_measured_torchtitan.toml: one [[row]] per configuration, the peak that
PyTorch's FSDPMemTracker records over one steady-state training step of torchtitan 0.3.0's llama3 (and
qwen3 MoE) model (FSDP2, optionally 2-D FSDP x TP with sequence parallelism), so that tuner's analytic
memory model (tuner/perfmodel/memory.py, framework "torchtitan") can be checked against real framework
code.

Set-up (outside the repository; torch MUST be pinned, an unpinned torch pulls a multi-GB CUDA build):

    python3 -m venv /work/ttvenv && . /work/ttvenv/bin/activate
    pip install torch==2.13.0 torchtitan==0.3.0 triton==3.8.0
    python benchmarks/measure_memory_torchtitan.py [--out FILE] [--only N] [--jobs 2] [--list] [--two-steps] [--fresh | --fresh2 | --fresh3 | --fresh4 | --rows]

(torchtitan 0.3.0 imports triton at module level, in distributed/minimal_async_ep/kernels.py, so
triton must be installed even though no Triton kernel runs here.) `--only N` runs configuration N
(1-based, see --list) and prints its row; it writes a file only when --out is given. Without --only
every configuration runs, each in its own subprocess (`--jobs` of them at a time, one thread each),
and the file is written (default benchmarks/data/memory_measured_torchtitan.toml). The committed file's
run took 1479 s on the 2-core machine while another job shared it (rows 13-90 s, full 70B up to 260 s;
their sum, one job at a time, is about 37 minutes); per-configuration seconds are printed.

Method: torchtitan's memory estimation script (scripts/estimate/estimation.py in the torchtitan
repository): a fake process group (torch.testing._internal.distributed.fake_pg.FakeStore,
init_process_group("fake") at the layout's world size, rank 0), torchtitan's ParallelDims meshes
(built outside fake mode), the model built by torchtitan's own Trainer config (config_registry
llama3_8b / llama3_70b / qwen3_30b_a3b: ChunkedLossWrapper(CrossEntropyLoss) with 8 chunks,
default_adamw = fused AdamW, training.dtype float32) on the meta device and parallelised by
torchtitan's own parallelize function (TP with sequence-parallel norms when tp > 1; activation
checkpointing none / SelectiveAC (per-op SAC) / FullAC; then apply_fsdp_to_decoder: fully_shard per
block, tok_embeddings, [norm, lm_head] and the root, MixedPrecisionPolicy(param bf16, reduce fp32),
fp32 sharded master parameters), materialised with to_empty() under FakeTensorMode (init_weights is
skipped under fake mode, as estimation.py does). The steady state is set up outside the tracker:
AdamW's state by torchtitan's init_optim_state (the zero-lr step it runs before a checkpoint load),
and the sharded fp32 gradients that zero_grad(set_to_none=False) (Trainer.train_step's
set_to_none=training.disable_cuda_graphs, False by default) keeps between steps. Then ONE training
step runs inside torch.distributed._tools.fsdp2_mem_tracker.FSDPMemTracker as Trainer.train_step runs
it: zero_grad, forward with _skip_lm_head, the chunked loss (lm_head + CE per chunk, each chunk's
backward inside the loss), backward through the decoder, dist_utils.clip_grad_norm_,
optimizers.step. Its peak is the row's peak_allocated_gib. (--two-steps instead tracks a first step
from scratch and then the second, estimation.py's loop, and reports the second; on configuration 1
the two agree to 0.016 GiB, 34.590 vs 34.574 GiB.) Tensors are fake: nothing is computed and no
memory is used, so real shapes cost nothing; some rows cut the number of layers (model = "custom").

What had to be patched to run torchtitan 0.3.0 + torch 2.13.0 on a CPU under fake tensors (each
patch is in torchtitan_memory/patches.py, patch_torchtitan / MeasureTracker, with its reason):
  1. device: torchtitan.tools.utils falls back to device_type "cuda" when no accelerator exists;
     set to "cpu" (meshes, fake process groups and fake tensors live on the CPU).
  2. spmd_backend "partial_dtensor" instead of 0.3.0's default "spmd_types": torch 2.13.0's
     fully_shard refuses spmd_types' plain annotated tensors ("When dp_mesh_dims is provided, all
     parameters must be DTensors on the full SPMD mesh"). partial_dtensor is torchtitan's DTensor
     TP + FSDP2-on-the-"fsdp"-mesh path, the same memory layout.
  3. attention: torchtitan 0.3.0's language models use FlexAttention (SDPA is refused for them,
     models/common/config_utils.py) through torch.compile (inductor / Triton, GPU only). Here the
     flex_attention higher-order op is called uncompiled and directly
     (FlexAttention._compiled_flex_attn = flex_attention, _FLEX_ATTENTION_DISABLE_COMPILE_DEBUG,
     the CPU-backward guard _validate_device disabled); under FakeTensorMode that dispatches to the
     op's registered fake kernel, which, like the fused GPU kernel, returns out and the fp32
     logsumexp / max rows and keeps no s x s scores; its autograd saves q, k, v, out, logsumexp. The
     script checks every tensor the step allocates for a (b, heads, s, s)-like one (4+ dims, the last
     two both s) and records what it finds in `attention`. The block-causal BlockMask is built
     uncompiled, before the tracker (data preparation; it holds (s/128)^2 block indices).
  4. FSDPMemTracker subclass: (a) supports_higher_order_operators, so the flex_attention op passes
     through it; (b) DTensor's sharding propagation runs global-shape fake ops under the same
     FakeTensorMode, which the tracker counted as memory (a phantom 23.5 GiB "OptState" in AdamW's
     step on a 2-layer 8B with dp 8); they are not tracked; (c) ChunkedLossWrapper calls the
     [norm, lm_head] FSDP unit 8 times outside the root's forward, which the stock tracker refuses
     as "multiple iterative calls"; its per-module stats are restarted instead (totals unaffected).
  5. torch.autograd.set_multithreading_enabled(False), as torchtitan's init_distributed does.
  6. speed only: DTensor skips its sharding-propagation cache whenever a FakeTensorMode is active
     (it assumes tracing with symbolic shapes); all shapes here are static, so the cache is used.
Not modelled: CUDA-graph capture of the forward-backward (0.3.0's default on NVIDIA GPUs; eager
here) and the caching allocator's reserve / fragmentation (the tracker counts allocated tensors).
Expert parallelism (ep > 1) does not run: torchtitan gives the MoE blocks a per-parameter mesh
(shard_placement_fn returning ShardPlacementResult), i.e. two FSDP param groups per block, and
torch 2.13.0's FSDPMemTracker asserts "Expected at most 1 param group"; its configuration is kept
in CONFIGS so that the failure is recorded in the data file's header.

Code: this file is the command (the configuration list, one subprocess per configuration, the file
written); benchmarks/torchtitan_memory/ holds the rest:
    configs.py   PRESETS, CONFIGS and the fresh batches FRESH .. FRESH4 with the file each is written to
    patches.py   the patches above (patch_torchtitan) and the tracker (make_tracker_class: MeasureTracker)
    step.py      measure(): the fake process group, torchtitan's config and model, the tracked step
    rows.py      to_row (a result as the data file's row) and write_toml
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from torchtitan_memory.configs import BATCHES, DEFAULT_OUT, PRESETS  # noqa: E402
from torchtitan_memory.rows import to_row, toml_value, write_toml  # noqa: E402

BATCH_FLAGS = tuple(f for f in BATCHES if f)


def describe(i: int, c: dict) -> str:
    lay = "all" if c["layers"] is None else c["layers"]
    return (f"{i:2d}: {c['model']} layers={lay} s={c['seq']} dp={c['dp']} tp={c['tp']} mb={c['mb']} "
            f"recompute={c['recompute']} loss={c['loss']}" + (f" ep={c['ep']}" if c.get("ep", 1) != 1 else ""))


def _cost(c: dict) -> float:
    preset = PRESETS[c["model"]]
    layers = c["layers"] or preset["num_layers"]
    return layers * (2.0 if c["tp"] > 1 else 1.0) * (3.0 if "num_experts" in preset else 1.0)


def run_one(i: int, configs: list[dict], batch_flag: str | None,
            two_steps: bool = False) -> tuple[int, dict | None, str]:
    """Configuration i (1-based) of `configs` in a fresh subprocess; (i, result or None, error's last line).
    The subprocess gets the batch flag too, so that i names the batch's configuration."""
    t = time.time()
    cmd = ([sys.executable, __file__, "--worker", str(i)] + (["--two-steps"] if two_steps else [])
           + ([batch_flag] if batch_flag else []))
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            res = json.loads(line[len("RESULT "):])
            print(f"{describe(i, configs[i - 1])}  peak {res['steps'][-1]['peak']['Total']:.3f} GiB  "
                  f"{time.time() - t:.1f} s", flush=True)
            return i, res, ""
    err = [ln for ln in (proc.stderr or "").strip().splitlines() if ln.strip()]
    last = err[-1] if err else f"exit {proc.returncode}"
    print(f"{describe(i, configs[i - 1])}  FAILED ({time.time() - t:.1f} s): {last}", flush=True)
    return i, None, last


def _parser(default_out: Path = DEFAULT_OUT) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=None, help=f"output TOML (default {default_out} for a full run)")
    ap.add_argument("--only", type=int, default=None, help="run only configuration N (1-based; see --list)")
    ap.add_argument("--jobs", type=int, default=2, help="configurations measured at once (default 2)")
    ap.add_argument("--list", action="store_true", help="list the configurations and exit")
    ap.add_argument("--two-steps", action="store_true",
                    help="track a first step from scratch and then the measured second step (estimation.py's "
                         "loop) instead of one step after init_optim_state; same peak, twice the time")
    for flag in BATCH_FLAGS:        # one flag per batch of torchtitan_memory.configs.BATCHES
        name, (_, out) = flag[2:].upper(), BATCHES[flag]
        ap.add_argument(flag, action="store_true", help=f"the {name} configurations instead, written to {out.name}")
    ap.add_argument("--worker", type=int, default=None, help=argparse.SUPPRESS)
    return ap


def main() -> None:
    # the first batch flag given, in --fresh .. --fresh4 order; None: CONFIGS. Read before parsing so that
    # --help names the batch's file
    batch_flag = next((f for f in BATCH_FLAGS if f in sys.argv[1:]), None)
    configs, default_out = BATCHES[batch_flag]
    a = _parser(default_out).parse_args()
    if a.worker is not None:
        from torchtitan_memory.step import measure     # torch and torchtitan: in the measuring subprocess only
        res = measure(configs[a.worker - 1], two_steps=a.two_steps)
        print("RESULT " + json.dumps(res), flush=True)
        return
    if a.list:
        for i, c in enumerate(configs, 1):
            print(describe(i, c))
        return
    t0 = time.time()
    todo = [a.only] if a.only else list(range(1, len(configs) + 1))
    todo.sort(key=lambda i: -_cost(configs[i - 1]))        # longest first, for packing the jobs
    with ThreadPoolExecutor(max_workers=max(1, a.jobs)) as pool:
        results = sorted(pool.map(lambda i: run_one(i, configs, batch_flag, a.two_steps), todo))
    rows = [to_row(res) for _, res, _ in results if res is not None]
    failures = [f"{describe(i, configs[i - 1]).split(': ', 1)[1]}: {err}" for i, res, err in results if res is None]
    seconds = time.time() - t0
    print(f"{len(rows)} rows, {len(failures)} failed, {seconds:.0f} s")
    out = a.out if a.out else (None if a.only else default_out)
    if a.only and rows:
        for k, v in rows[0].items():
            print(f"{k} = {toml_value(v)}")
    if out is not None:
        write_toml(rows, out, failures, seconds)
        print(f"wrote {out}")


if __name__ == "__main__":
    main()
