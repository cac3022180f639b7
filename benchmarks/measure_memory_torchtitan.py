"""Peak per-GPU memory of torchtitan's own training step (Llama 3, Qwen3 MoE), measured on a CPU with fake tensors.

Writes benchmarks/data/memory_measured_torchtitan.toml: one [[row]] per configuration, the peak that
PyTorch's FSDPMemTracker records over one steady-state training step of torchtitan 0.3.0's llama3 (and
qwen3 MoE) model (FSDP2, optionally 2-D FSDP x TP with sequence parallelism), so that tuner's analytic
memory model (tuner/perfmodel/memory.py, framework "torchtitan") can be checked against real framework
code.

Set-up (outside the repository; torch MUST be pinned, an unpinned torch pulls a multi-GB CUDA build):

    python3 -m venv /work/ttvenv && . /work/ttvenv/bin/activate
    pip install torch==2.13.0 torchtitan==0.3.0 triton==3.8.0
    python benchmarks/measure_memory_torchtitan.py [--out FILE] [--only N] [--jobs 2] [--list] [--two-steps] [--fresh | --fresh2 | --fresh3 | --fresh4]

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
patch is in _patch_torchtitan / MeasureTracker below, with its reason):
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

GIB = 2**30
HERE = Path(__file__).resolve().parent
DEFAULT_OUT = HERE / "data" / "memory_measured_torchtitan.toml"

# Shapes of the tuner presets (workloads/models/*.toml) and the torchtitan flavor that builds them.
PRESETS = {
    "qwen3-30b-a3b": dict(flavor="30B-A3B", registry="qwen3", config_fn="qwen3_30b_a3b", num_layers=48,
                          hidden_size=2048, num_attention_heads=32, num_query_groups=4, head_dim=128,
                          ffn_hidden_size=6144, num_experts=128, moe_top_k=8, moe_ffn_hidden_size=768,
                          vocab_size=151936),
    "llama3-8b": dict(flavor="8B", config_fn="llama3_8b", num_layers=32, hidden_size=4096, num_attention_heads=32,
                      num_query_groups=8, ffn_hidden_size=14336, vocab_size=128256),
    "llama3-70b": dict(flavor="70B", config_fn="llama3_70b", num_layers=80, hidden_size=8192, num_attention_heads=64,
                       num_query_groups=8, ffn_hidden_size=28672, vocab_size=128256),
}


def _c(model, layers, seq, dp, tp, mb, rc, loss="chunked", ep=1):
    return dict(model=model, layers=layers, seq=seq, dp=dp, tp=tp, mb=mb, recompute=rc, loss=loss, ep=ep)


# (preset, layers built (None = all), seq_length, dp (FSDP shard degree), tp, micro_batch, recompute)
CONFIGS = [
    # Llama 3 8B, all 32 layers, FSDP only
    _c("llama3-8b", None, 2048, 8, 1, 1, "none"),
    _c("llama3-8b", None, 4096, 8, 1, 1, "none"),
    _c("llama3-8b", None, 8192, 8, 1, 1, "none"),
    _c("llama3-8b", None, 8192, 8, 1, 1, "selective"),
    _c("llama3-8b", None, 8192, 8, 1, 1, "full"),
    _c("llama3-8b", None, 4096, 8, 1, 2, "selective"),
    _c("llama3-8b", None, 2048, 8, 1, 4, "selective"),
    _c("llama3-8b", None, 2048, 8, 1, 4, "full"),
    _c("llama3-8b", None, 8192, 32, 1, 1, "selective"),
    _c("llama3-8b", None, 8192, 128, 1, 1, "selective"),
    _c("llama3-8b", None, 4096, 2, 1, 1, "full"),
    _c("llama3-8b", None, 2048, 2, 1, 2, "none"),
    _c("llama3-8b", None, 4096, 32, 1, 2, "none"),
    _c("llama3-8b", None, 2048, 128, 1, 4, "full"),
    # Llama 3 8B, 2-D FSDP x TP (sequence parallel)
    _c("llama3-8b", None, 8192, 4, 2, 1, "none"),
    _c("llama3-8b", None, 8192, 4, 2, 1, "selective"),
    _c("llama3-8b", None, 8192, 2, 4, 2, "full"),
    _c("llama3-8b", None, 8192, 8, 8, 1, "none"),
    _c("llama3-8b", None, 4096, 32, 4, 1, "selective"),
    _c("llama3-8b", None, 2048, 8, 2, 4, "selective"),
    _c("llama3-8b", None, 8192, 128, 2, 1, "full"),
    # Llama 3 70B shape, 8 layers built (model = "custom")
    _c("llama3-70b", 8, 8192, 8, 1, 1, "none"),
    _c("llama3-70b", 8, 8192, 8, 1, 1, "selective"),
    _c("llama3-70b", 8, 8192, 8, 1, 1, "full"),
    _c("llama3-70b", 8, 4096, 32, 1, 2, "selective"),
    _c("llama3-70b", 8, 2048, 128, 1, 4, "full"),
    _c("llama3-70b", 8, 2048, 2, 1, 1, "none"),
    _c("llama3-70b", 8, 8192, 8, 8, 1, "none"),
    _c("llama3-70b", 8, 8192, 8, 8, 1, "selective"),
    _c("llama3-70b", 8, 8192, 32, 8, 1, "full"),
    _c("llama3-70b", 8, 4096, 8, 4, 2, "selective"),
    _c("llama3-70b", 8, 8192, 32, 2, 1, "selective"),
    _c("llama3-70b", 8, 4096, 128, 8, 1, "full"),
    # Llama 3 70B, all 80 layers
    _c("llama3-70b", None, 8192, 32, 8, 1, "full"),
    _c("llama3-70b", None, 8192, 128, 1, 1, "full"),
    _c("llama3-70b", None, 4096, 8, 8, 2, "selective"),
    # Qwen3 30B-A3B (mixture of experts, 128 experts top-8, every layer MoE), expert parallel 1: the
    # experts are sharded by FSDP like the rest (ep > 1 fails, see the module docstring)
    _c("qwen3-30b-a3b", None, 4096, 8, 1, 1, "full"),
    _c("qwen3-30b-a3b", None, 4096, 8, 1, 2, "selective"),
    _c("qwen3-30b-a3b", None, 4096, 32, 1, 1, "none"),
    _c("qwen3-30b-a3b", None, 4096, 8, 2, 1, "full"),
    _c("qwen3-30b-a3b", None, 4096, 8, 1, 1, "full", ep=8),    # expert parallel: fails (docstring)
    # the un-chunked CrossEntropyLoss (torchtitan's llama3_debugmodel_ce_loss option), for the logits
    _c("llama3-8b", None, 8192, 8, 1, 1, "selective", loss="ce"),
    _c("llama3-8b", None, 8192, 4, 2, 1, "selective", loss="ce"),
]

#: --fresh (issue 24, after the op-SAC account of tuner/perfmodel/memory.py was committed, 746d50e): 15 configurations
#: no choice has seen, for held-out reliability. Drawn before any was measured, 5 per recompute mode, seed 1553126478
#: (os.urandom), from the grid model {8B all layers, 70B shape with 8 or 16 layers} x seq {2048, 4096, 8192} x tp
#: {1, 2, 4, 8} x mb {1, 2} x dp {8, 16, 64}, among the configurations not in CONFIGS that published.held_out puts in
#: the held-out third (nothing is fitted on these rows, so no tuning ones were measured).
#: Written to data/memory_measured_torchtitan_fresh.toml.
FRESH = [
    _c("llama3-70b", 8, 2048, 16, 8, 1, "none"),
    _c("llama3-70b", 16, 4096, 16, 1, 1, "none"),
    _c("llama3-70b", 16, 8192, 8, 8, 2, "none"),
    _c("llama3-8b", None, 8192, 8, 8, 2, "none"),
    _c("llama3-70b", 8, 2048, 8, 4, 1, "none"),
    _c("llama3-8b", None, 2048, 16, 4, 1, "selective"),
    _c("llama3-8b", None, 8192, 64, 2, 1, "selective"),
    _c("llama3-70b", 8, 4096, 16, 2, 2, "selective"),
    _c("llama3-70b", 8, 2048, 64, 1, 1, "selective"),
    _c("llama3-70b", 16, 2048, 16, 8, 2, "selective"),
    _c("llama3-70b", 8, 4096, 16, 1, 2, "full"),
    _c("llama3-70b", 16, 8192, 8, 4, 1, "full"),
    _c("llama3-8b", None, 4096, 8, 2, 1, "full"),
    _c("llama3-8b", None, 2048, 16, 8, 1, "full"),
    _c("llama3-8b", None, 8192, 16, 1, 2, "full"),
]
FRESH_OUT = HERE / "data" / "memory_measured_torchtitan_fresh.toml"
#: --fresh2 (issue 24 round 2; FRESH's rows were printed while alternatives were weighed, so they now count as seen):
#: 24 more configurations no choice has seen, drawn before any was measured and before the outside-the-layers
#: account was written, seed 3211157920 (os.urandom), from FRESH's grid x loss {chunked, un-chunked CE}, among the
#: configurations not in CONFIGS or FRESH that published.held_out puts in the held-out third: per recompute mode
#: 5 chunked and 3 un-chunked. Written to data/memory_measured_torchtitan_fresh2.toml.
FRESH2 = [
    _c("llama3-70b", 16, 2048, 8, 2, 2, "none"),
    _c("llama3-8b", None, 4096, 64, 4, 2, "none"),
    _c("llama3-70b", 8, 8192, 8, 1, 2, "none"),
    _c("llama3-70b", 8, 8192, 8, 4, 2, "none"),
    _c("llama3-70b", 8, 8192, 16, 2, 2, "none"),
    _c("llama3-70b", 8, 8192, 16, 8, 2, "none", loss="ce"),
    _c("llama3-8b", None, 8192, 16, 2, 2, "none", loss="ce"),
    _c("llama3-70b", 16, 8192, 16, 1, 1, "none", loss="ce"),
    _c("llama3-8b", None, 4096, 8, 4, 2, "selective"),
    _c("llama3-70b", 16, 2048, 16, 1, 2, "selective"),
    _c("llama3-70b", 8, 8192, 8, 4, 1, "selective"),
    _c("llama3-70b", 16, 8192, 64, 8, 2, "selective"),
    _c("llama3-70b", 8, 2048, 16, 2, 2, "selective"),
    _c("llama3-8b", None, 4096, 16, 2, 2, "selective", loss="ce"),
    _c("llama3-8b", None, 8192, 64, 1, 1, "selective", loss="ce"),
    _c("llama3-70b", 16, 2048, 64, 4, 1, "selective", loss="ce"),
    _c("llama3-70b", 16, 8192, 64, 1, 2, "full"),
    _c("llama3-8b", None, 2048, 16, 2, 1, "full"),
    _c("llama3-70b", 8, 8192, 16, 8, 1, "full"),
    _c("llama3-70b", 8, 8192, 8, 4, 2, "full"),
    _c("llama3-70b", 16, 4096, 16, 4, 2, "full"),
    _c("llama3-70b", 8, 8192, 8, 8, 2, "full", loss="ce"),
    _c("llama3-70b", 16, 2048, 64, 8, 1, "full", loss="ce"),
    _c("llama3-70b", 8, 4096, 64, 1, 1, "full", loss="ce"),
]
FRESH2_OUT = HERE / "data" / "memory_measured_torchtitan_fresh2.toml"
#: --fresh3 (issue 24 round 4): 36 more configurations no choice has seen, drawn at run time by
#: benchmarks/draw_memory_batch.py (its rule: FRESH2's grid and loss, less CONFIGS, FRESH and FRESH2, from the held-out
#: third; per recompute mode 8 chunked and 4 un-chunked), seed 2175962193 (os.urandom), committed before any of them
#: is measured and before the allocated-bytes spread (tuner/frameworks.py memory_sd) is chosen on FRESH2's rows.
#: Written to data/memory_measured_torchtitan_fresh3.toml.
FRESH3 = [
    _c("llama3-8b", None, 8192, 64, 2, 2, "none"),
    _c("llama3-70b", 16, 4096, 16, 8, 1, "none"),
    _c("llama3-8b", None, 4096, 64, 2, 1, "none"),
    _c("llama3-8b", None, 4096, 8, 8, 1, "none"),
    _c("llama3-8b", None, 4096, 16, 4, 1, "none"),
    _c("llama3-70b", 16, 4096, 8, 1, 1, "none"),
    _c("llama3-70b", 16, 2048, 8, 1, 1, "none"),
    _c("llama3-70b", 16, 4096, 8, 8, 2, "none"),
    _c("llama3-70b", 8, 8192, 16, 1, 1, "none", loss="ce"),
    _c("llama3-70b", 16, 4096, 8, 4, 1, "none", loss="ce"),
    _c("llama3-70b", 16, 2048, 8, 2, 2, "none", loss="ce"),
    _c("llama3-70b", 16, 2048, 8, 8, 1, "none", loss="ce"),
    _c("llama3-70b", 16, 4096, 8, 1, 1, "selective"),
    _c("llama3-8b", None, 8192, 16, 1, 2, "selective"),
    _c("llama3-8b", None, 4096, 8, 2, 1, "selective"),
    _c("llama3-70b", 16, 4096, 8, 8, 2, "selective"),
    _c("llama3-70b", 8, 8192, 8, 2, 1, "selective"),
    _c("llama3-70b", 16, 2048, 16, 2, 2, "selective"),
    _c("llama3-70b", 16, 8192, 64, 1, 2, "selective"),
    _c("llama3-8b", None, 8192, 64, 4, 2, "selective"),
    _c("llama3-70b", 16, 2048, 8, 2, 2, "selective", loss="ce"),
    _c("llama3-8b", None, 2048, 8, 1, 1, "selective", loss="ce"),
    _c("llama3-70b", 8, 2048, 8, 1, 2, "selective", loss="ce"),
    _c("llama3-70b", 16, 4096, 8, 4, 2, "selective", loss="ce"),
    _c("llama3-8b", None, 4096, 64, 1, 1, "full"),
    _c("llama3-8b", None, 8192, 64, 1, 1, "full"),
    _c("llama3-70b", 8, 8192, 8, 8, 2, "full"),
    _c("llama3-8b", None, 8192, 64, 2, 2, "full"),
    _c("llama3-8b", None, 8192, 16, 4, 1, "full"),
    _c("llama3-8b", None, 4096, 64, 2, 2, "full"),
    _c("llama3-70b", 16, 8192, 8, 8, 1, "full"),
    _c("llama3-8b", None, 2048, 16, 1, 1, "full"),
    _c("llama3-8b", None, 2048, 16, 2, 1, "full", loss="ce"),
    _c("llama3-8b", None, 2048, 16, 2, 2, "full", loss="ce"),
    _c("llama3-8b", None, 8192, 64, 2, 1, "full", loss="ce"),
    _c("llama3-70b", 16, 2048, 16, 8, 2, "full", loss="ce"),
]
FRESH3_OUT = HERE / "data" / "memory_measured_torchtitan_fresh3.toml"
#: --fresh4 (issue 24 round 4): FRESH3's rows were printed with the first allocated-bytes spread (a normal fitted
#: by maximum likelihood) and then saw the second choice (a robust scale), so they are seen; 36 more configurations
#: drawn by benchmarks/draw_memory_batch.py (the same rule, less FRESH3 too), seed 3662030929 (os.urandom), committed
#: before any is measured and before the robust scale is written into tuner/frameworks.py.
#: Written to data/memory_measured_torchtitan_fresh4.toml.
FRESH4 = [
    _c("llama3-70b", 8, 4096, 64, 4, 1, "none"),
    _c("llama3-70b", 16, 8192, 16, 1, 2, "none"),
    _c("llama3-70b", 8, 8192, 16, 8, 2, "none"),
    _c("llama3-70b", 8, 8192, 64, 4, 1, "none"),
    _c("llama3-8b", None, 8192, 8, 4, 1, "none"),
    _c("llama3-70b", 16, 4096, 64, 2, 1, "none"),
    _c("llama3-8b", None, 4096, 64, 2, 2, "none"),
    _c("llama3-8b", None, 4096, 16, 8, 1, "none"),
    _c("llama3-70b", 8, 8192, 16, 2, 2, "none", loss="ce"),
    _c("llama3-70b", 8, 8192, 8, 4, 1, "none", loss="ce"),
    _c("llama3-70b", 8, 2048, 8, 2, 1, "none", loss="ce"),
    _c("llama3-8b", None, 4096, 64, 1, 2, "none", loss="ce"),
    _c("llama3-70b", 8, 2048, 8, 1, 2, "selective"),
    _c("llama3-70b", 8, 4096, 8, 2, 2, "selective"),
    _c("llama3-70b", 8, 2048, 8, 4, 1, "selective"),
    _c("llama3-70b", 8, 8192, 64, 1, 2, "selective"),
    _c("llama3-70b", 8, 2048, 64, 4, 2, "selective"),
    _c("llama3-70b", 16, 2048, 16, 1, 1, "selective"),
    _c("llama3-70b", 8, 2048, 64, 2, 1, "selective"),
    _c("llama3-8b", None, 8192, 16, 8, 1, "selective"),
    _c("llama3-8b", None, 4096, 8, 2, 1, "selective", loss="ce"),
    _c("llama3-8b", None, 4096, 8, 4, 2, "selective", loss="ce"),
    _c("llama3-70b", 8, 2048, 8, 2, 1, "selective", loss="ce"),
    _c("llama3-8b", None, 8192, 64, 2, 1, "selective", loss="ce"),
    _c("llama3-70b", 16, 2048, 64, 1, 1, "full"),
    _c("llama3-8b", None, 4096, 8, 8, 2, "full"),
    _c("llama3-8b", None, 4096, 8, 4, 2, "full"),
    _c("llama3-70b", 8, 4096, 8, 1, 2, "full"),
    _c("llama3-70b", 16, 8192, 64, 2, 2, "full"),
    _c("llama3-70b", 8, 8192, 16, 2, 2, "full"),
    _c("llama3-70b", 16, 4096, 8, 4, 2, "full"),
    _c("llama3-70b", 16, 8192, 16, 4, 2, "full"),
    _c("llama3-70b", 16, 4096, 64, 2, 2, "full", loss="ce"),
    _c("llama3-70b", 8, 4096, 16, 1, 2, "full", loss="ce"),
    _c("llama3-70b", 8, 4096, 8, 4, 2, "full", loss="ce"),
    _c("llama3-70b", 8, 4096, 8, 2, 1, "full", loss="ce"),
]
FRESH4_OUT = HERE / "data" / "memory_measured_torchtitan_fresh4.toml"
BATCH_FLAG = next((f for f in ("--fresh", "--fresh2", "--fresh3", "--fresh4") if f in sys.argv), None)
if BATCH_FLAG:                  # the worker subprocesses get the flag too (run_one), so indices name the batch's rows
    CONFIGS, DEFAULT_OUT = {"--fresh": (FRESH, FRESH_OUT), "--fresh2": (FRESH2, FRESH2_OUT),
                            "--fresh3": (FRESH3, FRESH3_OUT), "--fresh4": (FRESH4, FRESH4_OUT)}[BATCH_FLAG]


# ------------------------------------------------------------------------------------------ worker
def _patch_torchtitan():
    """The patches the module docstring lists (1, 3, 5, 6 and the DTensor propagation flag for 4b)."""
    import threading

    import torch
    import torch.nn.attention.flex_attention as flex_mod
    import torchtitan.tools.utils as tt_utils

    # 1. no accelerator: torchtitan falls back to "cuda"; meshes and tensors live on the CPU
    tt_utils.device_type = "cpu"
    import torchtitan.components.metrics as tt_metrics
    import torchtitan.distributed.parallel_dims as tt_pd
    import torchtitan.distributed.utils as tt_du
    import torchtitan.models.common.token_dispatcher as tt_td
    for mod in (tt_pd, tt_du, tt_metrics, tt_td):
        mod.device_type = "cpu"

    # 3. FlexAttention: uncompiled HOP (fake kernel under FakeTensorMode), block mask uncompiled
    import torchtitan.models.common.attention as tt_attn
    tt_attn.FlexAttention._compiled_flex_attn = flex_mod.flex_attention
    tt_attn._compiled_create_block_mask = flex_mod.create_block_mask
    flex_mod._FLEX_ATTENTION_DISABLE_COMPILE_DEBUG = True
    flex_mod._validate_device = lambda *a, **k: None

    # 4b. mark DTensor's sharding propagation (global-shape fake ops, not memory)
    from torch.distributed.tensor._sharding_prop import ShardingPropagator
    flag = threading.local()
    orig = ShardingPropagator._propagate_tensor_meta_non_cached

    def propagate(self, op_schema):
        flag.depth = getattr(flag, "depth", 0) + 1
        try:
            return orig(self, op_schema)
        finally:
            flag.depth -= 1

    ShardingPropagator._propagate_tensor_meta_non_cached = propagate

    # 6. speed only: DTensor caches sharding propagation except when "tracing", which it takes any
    # active FakeTensorMode to be (symbolic shapes); every shape here is static, so the cache is valid
    import torch.distributed.tensor._sharding_prop as sharding_prop
    from torch._dynamo.external_utils import is_compiling
    from torch.fx.experimental.proxy_tensor import get_proxy_mode
    sharding_prop._are_we_tracing = lambda: is_compiling() or get_proxy_mode() is not None
    torch.autograd.set_multithreading_enabled(False)      # 5.
    return flag


def _make_tracker_class(prop_flag, seq):
    import torch
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.utils._pytree import tree_leaves

    class MeasureTracker(FSDPMemTracker):
        supports_higher_order_operators = True             # 4a. flex_attention passes through

        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            self.in_loss = False
            self.peak_phase = ""
            self.s2_bytes = 0          # largest (b, heads, s, s)-like tensor (attention scores)
            self.s2_shape = None

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if getattr(prop_flag, "depth", 0):               # 4b. sharding propagation: not memory
                return func(*args, **(kwargs or {}))
            res = super().__torch_dispatch__(func, types, args, kwargs)
            if res is not NotImplemented:
                for t in tree_leaves(res):
                    if isinstance(t, torch.Tensor) and t.dim() >= 4 and t.shape[-1] == seq and t.shape[-2] == seq:
                        b = t.numel() * t.element_size()
                        if b > self.s2_bytes:
                            self.s2_bytes, self.s2_shape = b, (tuple(t.shape), str(t.dtype), str(func))
            return res

        def _fsdp_state_pre_forward(self, fsdp_mod, orig):  # 4c. repeated calls of a non-root unit
            inner = super()._fsdp_state_pre_forward(fsdp_mod, orig)

            def wrapper(*a, **k):
                if fsdp_mod is not self._root_mod and fsdp_mod in self.memory_tracking and not self._mod_tracker.is_bw:
                    self.memory_tracking.pop(fsdp_mod)
                return inner(*a, **k)

            return wrapper

        def _update_peak_stats(self, peak_state):
            before = dict(self._peak_mem)
            super()._update_peak_stats(peak_state)
            if self._peak_mem != before:
                if self._in_opt:
                    phase = "optimizer step"
                elif self.in_loss:
                    phase = "chunked loss (lm_head forward + backward per chunk)"
                elif self._mod_tracker.is_bw:
                    phase = "backward" + (" (recompute)" if self._in_ac else "")
                else:
                    phase = "forward"
                mods = [p for p in self._mod_tracker.parents if p != "Global"]
                deepest = max(mods, key=lambda p: (p.count("."), len(p))) if mods else ""
                self.peak_phase = f"{phase}{' in ' + deepest if deepest else ''}"

        def reset_peak(self):
            self._peak_mem_snap = self.get_tracker_snapshot()
            self._peak_mem = {dev: snap["Total"] for dev, snap in self._peak_mem_snap.items()}
            self.peak_phase, self.s2_bytes, self.s2_shape = "", 0, None

    return MeasureTracker


def _snapshot_gib(snap: dict) -> dict:
    (dev_snap,) = snap.values()
    return {getattr(k, "value", str(k)): v / GIB for k, v in dev_snap.items()}


def measure(c: dict, two_steps: bool = False) -> dict:
    """One configuration in this process: returns the row's measured numbers."""
    prop_flag = _patch_torchtitan()
    import spmd_types as spmd
    import torch
    torch.set_num_threads(1)               # fake tensors compute nothing; 2 jobs on 2 cores must not contend
    import torch.distributed as dist
    import torchtitan
    import torchtitan.distributed.utils as tt_du
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.testing._internal.distributed.fake_pg import FakeStore
    from torchtitan.components.loss import CrossEntropyLoss
    from torchtitan.components.optimizer.utils import init_optim_state
    from torchtitan.distributed import ParallelDims
    from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC
    from torchtitan.models.common.config_utils import decoder_vocab_size
    import importlib

    preset = PRESETS[c["model"]]
    dp, tp, mb, seq = c["dp"], c["tp"], c["mb"], c["seq"]
    world = dp * tp
    t0 = time.time()
    dist.init_process_group("fake", rank=0, world_size=world, store=FakeStore())

    registry = importlib.import_module(f"torchtitan.models.{preset.get('registry', 'llama3')}.config_registry")
    cfg = getattr(registry, preset["config_fn"])()              # torchtitan's own Trainer config
    cfg.training.local_batch_size = mb
    cfg.training.seq_len = seq
    cfg.training.global_batch_size = -1                          # = local batch x dp: no accumulation
    cfg.parallelism.data_parallel_shard_degree = dp
    cfg.parallelism.data_parallel_replicate_degree = 1
    cfg.parallelism.tensor_parallel_degree = tp
    cfg.parallelism.enable_sequence_parallel = True
    cfg.parallelism.expert_parallel_degree = c.get("ep", 1)
    cfg.parallelism.spmd_backend = "partial_dtensor"            # 2.
    cfg.compile.enable = False
    ac = {"none": None, "selective": SelectiveAC.Config(), "full": FullAC.Config()}
    cfg.activation_checkpoint = ac[c["recompute"]]
    if c["loss"] == "ce":
        cfg.loss = CrossEntropyLoss.Config(global_vocab_size=decoder_vocab_size(cfg.model_spec))
    mc = cfg.model_spec.model
    if c["layers"] is not None:
        mc.layers = mc.layers[: c["layers"]]
    n_layers = len(mc.layers)

    pdims = ParallelDims.from_config(cfg.parallelism, world)
    pdims.build_mesh()                                            # outside fake mode, as estimation.py
    tt_du.set_spmd_backend(cfg.parallelism.spmd_backend)
    mc.update_from_config(config=cfg)
    with torch.device("meta"), torchtitan.tools.utils.set_default_dtype(torch.float32):
        model = mc.build()
    n_params = sum(p.numel() for p in model.parameters())
    model = cfg.model_spec.parallelize_fn(
        model, parallel_dims=pdims, training=cfg.training, parallelism=cfg.parallelism,
        compile_config=cfg.compile, ac_config=cfg.activation_checkpoint, dump_folder="/tmp/measure_tt")

    Tracker = _make_tracker_class(prop_flag, seq)
    with FakeTensorMode(allow_non_fake_inputs=True):
        model.to_empty(device="cpu")          # init_weights skipped under fake mode (estimation.py)
        model.train()
        loss_fn = cfg.loss.build(compile_config=cfg.compile)
        chunked = hasattr(loss_fn, "set_lm_head")
        if chunked:
            loss_fn.set_lm_head(model.lm_head)
            model._skip_lm_head = True
        optimizers = cfg.optimizer.build(model_parts=[model])
        train_context = tt_du.get_spmd_context(parallel_dims=pdims, spmd_typechecking=False)
        vocab = preset["vocab_size"]
        inputs = torch.randint(0, vocab, (mb, seq))
        labels = torch.randint(0, vocab, (mb, seq))
        positions = torch.arange(seq).unsqueeze(0).expand(mb, seq).contiguous()   # one document each
        masks = model.get_attention_masks(positions=positions)                     # block-causal BlockMask
        global_valid_tokens = (labels != -100).sum() * dp

        # Steady state before the measured step: AdamW's state exists (torchtitan's init_optim_state, the
        # zero-lr step it runs before a checkpoint load) and so do the sharded fp32 gradients that
        # zero_grad(set_to_none=False) keeps from the previous step. --two-steps instead tracks a first
        # step from scratch and then the second one (estimation.py's loop).
        if not two_steps:
            for opt in optimizers.optimizers:
                init_optim_state(opt)
            for p in model.parameters():
                p.grad = torch.zeros_like(p)
        tracker = Tracker(mod=model, optm=optimizers.optimizers[0])
        tracker.track_inputs((inputs, labels))
        steps = []
        with tracker:
            for step in range(2 if two_steps else 1):
                t1 = time.time()
                if step == 1:
                    tracker.reset_mod_stats()
                    tracker.reset_peak()
                optimizers.zero_grad(set_to_none=cfg.training.disable_cuda_graphs)
                with train_context():
                    pred = model(inputs, attention_masks=masks, positions=positions)
                    tracker.in_loss = True
                    if chunked:
                        loss, _ = loss_fn(pred, labels, global_valid_tokens, positions=positions)
                    else:
                        loss, _ = loss_fn(pred, labels, global_valid_tokens)
                    tracker.in_loss = False
                    del pred
                    with spmd.no_typecheck():
                        loss.backward()
                tt_du.clip_grad_norm_([p for p in model.parameters()], cfg.training.max_norm, foreach=True,
                                      pp_mesh=None, ep_enabled=False)
                optimizers.step()
                peak = _snapshot_gib(tracker.get_tracker_snapshot("peak"))
                steps.append(dict(peak=peak, phase=tracker.peak_phase, s2_bytes=tracker.s2_bytes,
                                  s2_shape=tracker.s2_shape, seconds=time.time() - t1))
                del loss

        opt_bytes = 0
        for opt in optimizers.optimizers:
            for state in opt.state.values():
                for v in state.values():
                    if isinstance(v, torch.Tensor):
                        v = v.to_local() if hasattr(v, "to_local") else v
                        opt_bytes += v.numel() * v.element_size()
        local_param_bytes = 0
        for p in model.parameters():
            lp = p.to_local() if hasattr(p, "to_local") else p
            local_param_bytes += lp.numel() * lp.element_size()
    dist.destroy_process_group()
    return dict(config=c, n_layers=n_layers, n_params=n_params, steps=steps, opt_state_gib=opt_bytes / GIB,
                local_param_gib=local_param_bytes / GIB, torchtitan=_version("torchtitan"),
                torch=torch.__version__, seconds=time.time() - t0)


def _version(dist_name: str) -> str:
    from importlib.metadata import version
    return version(dist_name)


# ------------------------------------------------------------------------------------------ rows
ATTENTION_KERNEL = ("flex_attention (torchtitan 0.3.0's FlexAttention, block-causal BlockMask; its fake kernel "
                    "under FakeTensorMode, the fused kernel on a GPU)")


def to_row(r: dict) -> dict:
    c, steady = r["config"], r["steps"][-1]
    first = r["steps"][0] if len(r["steps"]) == 2 else None
    preset = PRESETS[c["model"]]
    full = r["n_layers"] == preset["num_layers"]
    p = steady["peak"]
    g = lambda *keys: sum(p.get(k, 0.0) for k in keys)   # noqa: E731
    breakdown = {
        "parameters": g("Sharded Param", "Unsharded Param", "Buffer"),
        "gradients": g("Sharded Grad", "Unsharded Grad"),
        "optimizer": g("OptState"),
        "activations": g("Activation", "Inputs"),
        "temp": g("Temp", "All Gather", "Reduce Scatter"),
    }
    if steady["s2_bytes"]:
        attention = (f"{ATTENTION_KERNEL}; keeps s^2 scores: largest s x s tensor "
                     f"{steady['s2_bytes'] / GIB:.4f} GiB {steady['s2_shape']}")
    else:
        attention = f"{ATTENTION_KERNEL}; keeps no s^2 scores (no (..., s, s) tensor was allocated)"
    cats = ", ".join(f"{k} {v:.4f}" for k, v in p.items() if k != "Total")
    loss = ("ChunkedLossWrapper(CrossEntropyLoss), 8 chunks (the torchtitan config's default)" if c["loss"] == "chunked"
            else "CrossEntropyLoss un-chunked (torchtitan's llama3_debugmodel_ce_loss option, NOT the 8B/70B "
                 "default): full fp32 logits")
    tt = r["torchtitan"]
    moe = ("; MoE: every layer is MoE (128 routed experts, top-8, torchtitan's standard token dispatcher), "
           "expert parallel 1, so the routed experts are sharded by FSDP like the rest; the router's "
           "torch.autocast(float32) is a no-op on the CPU (warning), so its gate scores are bf16 here, fp32 on a GPU"
           if "num_experts" in preset else "")
    how = ("the second of two tracked steps" if first else
           "one tracked step after torchtitan's init_optim_state (AdamW state present) with the sharded fp32 "
           "gradients allocated (zero_grad(set_to_none=False) keeps them between steps)")
    note = (f"measured step: {how}; tracker categories (GiB) at its peak: {cats}; peak phase: {steady['phase']}; "
            + (f"first step (no AdamW state yet) peak {first['peak']['Total']:.4f} GiB in {first['phase']}; "
               if first else "") +
            f"AdamW state held {r['opt_state_gib']:.4f} GiB, sharded fp32 parameters {r['local_param_gib']:.4f} GiB "
            f"({r['n_params']:,} parameters in the {r['n_layers']}-layer model built); loss: {loss}; "
            f"spmd_backend partial_dtensor (DTensor TP + FSDP2), fully_shard per block + tok_embeddings + "
            f"[norm, lm_head] + root, reshard_after_forward default (blocks and embeddings yes, [norm, lm_head] "
            f"no), MixedPrecisionPolicy(param bf16, reduce fp32), fused AdamW, zero_grad(set_to_none=False); "
            f"eager (no CUDA graphs, no compile); allocated tensors only (no allocator reserve); "
            f"measured in {r['seconds']:.1f} s{moe}")
    row = {
        "framework": "torchtitan",
        "source": (f"measured: torchtitan {tt} {preset.get('registry', 'llama3')} model + FSDP2 under FakeTensorMode, "
                   f"torch {r['torch'].split('+')[0]} "
                   "FSDPMemTracker, benchmarks/measure_memory_torchtitan.py"),
        "release": f"torchtitan {tt}",
        "model": c["model"] if full else "custom",
        "num_layers": r["n_layers"],
        "hidden_size": preset["hidden_size"],
        "num_attention_heads": preset["num_attention_heads"],
        "num_query_groups": preset["num_query_groups"],
        "ffn_hidden_size": preset["ffn_hidden_size"],
        "vocab_size": preset["vocab_size"],
        "seq_length": c["seq"],
        "ffn_type": "swiglu",
        **({"head_dim": preset["head_dim"], "num_experts": preset["num_experts"], "moe_top_k": preset["moe_top_k"],
            "moe_ffn_hidden_size": preset["moe_ffn_hidden_size"], "ep": c["ep"], "etp": 1}
           if "num_experts" in preset else {}),
        "gpus": c["dp"] * c["tp"],
        "tp": c["tp"],
        "pp": 1,
        "cp": 1,
        "vp": 1,
        "dp": c["dp"],
        "micro_batch": c["mb"],
        "global_batch": c["mb"] * c["dp"],
        "sequence_parallel": c["tp"] > 1,
        "recompute": c["recompute"],
        "zero_stage": 3,
        "distributed_optimizer": True,
        "precision": "bf16",
        "stage": 0,
        "attention": attention,
        "peak_allocated_gib": round(p["Total"], 4),
        "breakdown_gib": {k: round(v, 4) for k, v in breakdown.items()},
        "note": note,
    }
    return row


def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{k} = {_toml_value(x)}" for k, x in v.items()) + " }"
    return json.dumps(str(v), ensure_ascii=False)      # a TOML basic string is JSON-compatible here


def write_toml(rows: list[dict], path: Path, failures: list[str], seconds: float) -> None:
    head = [
        "# MEASURED peak per-GPU memory of torchtitan's own training step (Llama 3; Qwen3 30B-A3B MoE), FSDP2,",
        "# optionally 2-D FSDP x TP with sequence parallelism, one [[row]] per configuration, written by",
        "# benchmarks/measure_memory_torchtitan.py (its docstring: set-up, method, patches). Fake tensors on a CPU:",
        "# fake process group at the layout's world size (rank 0), torchtitan's parallelize_llama, FSDPMemTracker",
        "# around one steady-state training step (AdamW state and sharded gradients present); peak_allocated_gib is",
        "# its peak of allocated tensors, GiB = 2^30 bytes; breakdown_gib groups the tracker's categories at that "
        "peak:",
        "# parameters = sharded fp32 + unsharded bf16 parameters (+ buffers), gradients = sharded fp32 + unsharded",
        "# gradients, optimizer = AdamW state, activations = activations + inputs, temp = temporaries + all-gather +",
        "# reduce-scatter buffers; the note lists every category. model = a tuner preset when all its layers were",
        "# built, else \"custom\" (fewer layers of the same shape). MoE rows add head_dim, num_experts, moe_top_k,",
        "# moe_ffn_hidden_size, ep and etp (as moe_published.toml). Not modelled: CUDA graphs, the allocator's",
        "# reserve and fragmentation. Nothing here is estimated or edited by hand.",
        f"# {len(rows)} rows; run time {seconds:.0f} s.",
    ]
    if failures:
        head.append("# configurations that failed (no row): " + "; ".join(failures))
    out = ["\n".join(head), ""]
    for row in rows:
        out.append("[[row]]")
        out += [f"{k} = {_toml_value(v)}" for k, v in row.items()]
        out.append("")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(out))


def describe(i: int, c: dict) -> str:
    lay = "all" if c["layers"] is None else c["layers"]
    return (f"{i:2d}: {c['model']} layers={lay} s={c['seq']} dp={c['dp']} tp={c['tp']} mb={c['mb']} "
            f"recompute={c['recompute']} loss={c['loss']}" + (f" ep={c['ep']}" if c.get("ep", 1) != 1 else ""))


def _cost(c: dict) -> float:
    preset = PRESETS[c["model"]]
    layers = c["layers"] or preset["num_layers"]
    return layers * (2.0 if c["tp"] > 1 else 1.0) * (3.0 if "num_experts" in preset else 1.0)


def run_one(i: int, two_steps: bool = False) -> tuple[int, dict | None, str]:
    """Configuration i (1-based) in a fresh subprocess; (i, result or None, error's last line)."""
    t = time.time()
    cmd = ([sys.executable, __file__, "--worker", str(i)] + (["--two-steps"] if two_steps else [])
           + ([BATCH_FLAG] if BATCH_FLAG else []))
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            res = json.loads(line[len("RESULT "):])
            print(f"{describe(i, CONFIGS[i - 1])}  peak {res['steps'][-1]['peak']['Total']:.3f} GiB  "
                  f"{time.time() - t:.1f} s", flush=True)
            return i, res, ""
    err = [ln for ln in (proc.stderr or "").strip().splitlines() if ln.strip()]
    last = err[-1] if err else f"exit {proc.returncode}"
    print(f"{describe(i, CONFIGS[i - 1])}  FAILED ({time.time() - t:.1f} s): {last}", flush=True)
    return i, None, last


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=None, help=f"output TOML (default {DEFAULT_OUT} for a full run)")
    ap.add_argument("--only", type=int, default=None, help="run only configuration N (1-based; see --list)")
    ap.add_argument("--jobs", type=int, default=2, help="configurations measured at once (default 2)")
    ap.add_argument("--list", action="store_true", help="list the configurations and exit")
    ap.add_argument("--two-steps", action="store_true",
                    help="track a first step from scratch and then the measured second step (estimation.py's "
                         "loop) instead of one step after init_optim_state; same peak, twice the time")
    ap.add_argument("--fresh", action="store_true", help=f"the FRESH configurations instead, written to {FRESH_OUT.name}")
    ap.add_argument("--fresh2", action="store_true",
                    help=f"the FRESH2 configurations instead, written to {FRESH2_OUT.name}")
    ap.add_argument("--fresh3", action="store_true",
                    help=f"the FRESH3 configurations instead, written to {FRESH3_OUT.name}")
    ap.add_argument("--fresh4", action="store_true",
                    help=f"the FRESH4 configurations instead, written to {FRESH4_OUT.name}")
    ap.add_argument("--worker", type=int, default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker is not None:
        res = measure(CONFIGS[a.worker - 1], two_steps=a.two_steps)
        print("RESULT " + json.dumps(res), flush=True)
        return
    if a.list:
        for i, c in enumerate(CONFIGS, 1):
            print(describe(i, c))
        return
    t0 = time.time()
    todo = [a.only] if a.only else list(range(1, len(CONFIGS) + 1))
    todo.sort(key=lambda i: -_cost(CONFIGS[i - 1]))        # longest first, for packing the jobs
    with ThreadPoolExecutor(max_workers=max(1, a.jobs)) as pool:
        results = sorted(pool.map(lambda i: run_one(i, a.two_steps), todo))
    rows = [to_row(res) for _, res, _ in results if res is not None]
    failures = [f"{describe(i, CONFIGS[i - 1]).split(': ', 1)[1]}: {err}" for i, res, err in results if res is None]
    seconds = time.time() - t0
    print(f"{len(rows)} rows, {len(failures)} failed, {seconds:.0f} s")
    out = a.out if a.out else (None if a.only else DEFAULT_OUT)
    if a.only and rows:
        for k, v in rows[0].items():
            print(f"{k} = {_toml_value(v)}")
    if out is not None:
        write_toml(rows, out, failures, seconds)
        print(f"wrote {out}")


if __name__ == "__main__":
    main()
