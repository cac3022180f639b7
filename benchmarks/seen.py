"""What saw which row: the choices made after seeing rows of the data files (`SEEN`: the published and measured
rows; benchmarks/hardware_seen.py's `HARDWARE_SEEN`: the new machines' rows), each with the rows it saw, and the
rules built on them (`clean`, hardware_seen.hardware_clean): a benchmark counts as "held out" only held-out
configurations that no choice saw. Reading, dedup and the held-out split are benchmarks/published_rows.py's;
published.py re-exports every name here and there."""

from __future__ import annotations

import functools

from published_rows import (_LEGACY, _LEGACY_MOE, _any_source, _bucket_moved, _legacy_third,  # noqa: F401
                            held_out, measured, published, split_key)


#: The batches of rows added to the data files since the split began, in the order they were committed (a row's
#: `added` starts with its batch's name). A choice saw the rows of the batches committed before it and of none after:
#: `_saw(r, last)` says so, and a row of a later batch (or of one not listed) is seen by no choice that names its last.
BATCHES = ("issue 25 round 2 (", "issue 25 round 3 (", "issue 24 round 4 (", "issue 26 round 3 (", "issue 25 round 4 (",
           "issue 26 sixth session", "issue 25 round 5 (", "issue 25 (attention by sequence", "issue 26 seventh session", "issue 25 fresh dense", "issue 26 eighth session", "issue 26 ninth session",
           "issue 25 / 26 tenth session", "issue 25 / 26 eleventh session", "issue 25 / 26 second read of the eleventh session", "issue 25 / 26 third read of the eleventh session",
           "issue 25 / 26 twelfth session", "issue 25 / 26 second read of the twelfth session", "issue 26 item 5 thirteenth session", "issue 26 fourteenth session (mi350x)", "issue 26 fifteenth session (gemm)", "issue 26 fifteenth session (scale)", "issue 25 fifteenth session (moe)",
           "issue 25 / 26 seventeenth session (H100 / H200", "issue 26 seventeenth session (amd)",
           "issue 25 / 26 seventeenth session (v6.0", "issue 25 / 26 seventeenth session (gb200",
           "issue 25 / 26 eighteenth session (v6.0", "issue 25 / 26 twenty-second session")


def _saw(r: dict, last: str | None) -> bool:
    """Whether the row existed when a choice made after batch `last` (None: before any batch) was made."""
    if (added := r.get("added")) is None:
        return True
    batch = next((i for i, name in enumerate(BATCHES) if added.startswith(name)), len(BATCHES))
    return last is not None and batch <= BATCHES.index(last)


# Choices made after seeing rows, each with the rows it saw (a predicate on a raw or distinct row; the shared
# row predicates, _legacy_third for the older splits' 'tuning' rows among them, are published_rows.py's).
SEEN = {     # name -> (what it changes: "speed" or "memory", the rows it saw)
    "megatron-core overlaps (tuner/frameworks.py)": ("speed", lambda r: r["framework"] == "megatron-core"
                                                     and "llama_published.toml" in r.get("files", [r.get("file")])
                                                     and "added" not in r),
    # (both chosen before any batch was added: issue 24 round 4's torchtitan / torchao rows and the fresh dense came later)
    "FA2_ON_HOPPER (tuner/perfmodel/compute.py)": ("speed", lambda r: r["framework"] in ("fsdp", "torchtitan") and _any_source(
        r, lambda x: not _legacy_third(x, _LEGACY)) and _saw(r, None)),
    "torchtitan / llm-foundry attention as ran (issue 26, from commits)": ("speed", lambda r: r["framework"] != "megatron-core"
        and r.get("ran_attention") in ("flash-attn-2", "flex") and not held_out(r) and _saw(r, "issue 25 / 26 second read of the twelfth session")),
    "UNFUSED_TRAFFIC (tuner/perfmodel/compute.py)": ("speed", lambda r: r["framework"] == "torchtitan"
                                                     and r["gpus"] == 8 and r["model"] == "llama3-8b" and _saw(r, None)),
    # issue 24 round 8: torchtitan @ 613bfd0cf's fused RMSNorm and fp32 logits (benchmarks/reading.torchtitan_613bfd0,
    # ran_norm / ran_fp32_logits) read from its source after the LLaMa 2 13B no-AC row's p_fit (0.00, 100.1 of 80 GB)
    # had been printed; it moves the four 613bfd0cf rows' memory (all tuning rows); memory only
    "torchtitan @ 613bfd0cf's fused RMSNorm and fp32 logits (benchmarks/reading.py)": (
        "memory", lambda r: ("ran_norm" in r or "ran_fp32_logits" in r) and _saw(r, "issue 25 round 5 (")),
    # chosen on the Megatron-Bridge MoE rows, before the Grok-1 rows of dgxc-benchmarking were added (issue 25);
    # Megatron-Bridge 25.09's DeepSeek-V3 row was refused (no pipeline split for 61 layers on pp 8 x vp 4) until
    # its stated split and recompute were written in (issue 25, speed C): no error of it was printed before
    "MOE_LAYER_OVERHEAD_MS, the flex dispatcher (tuner/perfmodel/moe.py, moe_exchange.py)": (
        "speed", lambda r: "ep" in r and not r.get("release", "").startswith("dgxc-benchmarking")
        and not (r.get("model") == "deepseek-v3" and r.get("release", "").startswith("Megatron-Bridge 25.09")) and "added" not in r),
    # issue 25 round 2: each Megatron-Bridge MoE row's token exchange read from its release's tag (a2a_overlap,
    # dispatcher, overlap_grad_reduce in moe_published.toml) and the EP overlap's phase-level exposure
    # (tuner/perfmodel/moe_exchange.exposed_alltoall), both written after every one of these rows had been printed
    "EP overlap as the rows' configs state it, and its phase-level exposure (tuner/perfmodel/moe_exchange.py)": (
        "speed", lambda r: "ep" in r and r.get("release", "").startswith("Megatron-Bridge") and _saw(r, "issue 25 round 2 (")),
    # issue 25: predicting a row's TP collectives whole where its config turns --tp-comm-overlap off was
    # decided after every Grok-1 row's error had been printed with the overlap assumed (rows marked `added`, issue 25
    # rounds 2-3, came later; so did the MoE rows marked `added` for MOE_LAYER_OVERHEAD_MS above)
    "TokenExchange.overlaps: TP overlap off where the row states it (benchmarks/moe_accuracy.py)": (
        "speed", lambda r: r.get("tp_comm_overlap") is False and "added" not in r),
    # issue 25: its value is a GEMM microbenchmark's (pytorch/ao #2377), fitted to no row, but the cause was looked
    # for after every published fp8 row's error (the held-out ones' too) had been printed as "fp8 too fast"; rows
    # marked `added` (issue 25 round 2) came later: it saw none of them
    "SPLIT_ACCUMULATOR, FP8 backward GEMMs without fast accumulation (tuner/perfmodel/compute.py)": (
        "speed", lambda r: r.get("precision") == "fp8" and "added" not in r),
    # issue 25: BigScience's rows predicted on Jean Zay (the fresh dense rows, `added` "issue 25 fresh dense", came later
    # and take the same machine: the choice saw none of them) (a100-jean-zay.toml: its Omni-Path links, no FlashAttention),
    # the machine its README states, looked up after their errors on a100.toml (26.7 %) had been printed
    "machine = a100-jean-zay for BigScience's rows (benchmarks/data/framework_published.toml)": (
        "speed", lambda r: r.get("machine") == "a100-jean-zay" and _saw(r, None)),
    "grad_reduce modelled (issue 24: every published megatron-core run's p_fit was printed first)": (
        "memory", lambda r: r["framework"] == "megatron-core" and r.get("file", "").endswith("published.toml")),
    "memory_bias / memory_sd (tuner/frameworks.py, benchmarks/memory_accuracy.py)": ("memory",
                                                                                     lambda r: not held_out(r)),
    "EAGER_REPLICATED, eager and gathered-input activations (tuner/perfmodel/memory.py)": (
        "memory", lambda r: r["framework"] == "torchtitan" and "peak_allocated_gib" in r and not held_out(r)),
    # (the rows of memory_measured_megatron-core.toml, the only Megatron-Core measurements when it was chosen)
    "megatron-core's memory scale (a dense fit, floor 0.02): chosen with the held-out measured rows' reliability "
    "printed for the alternatives (exact-only, all rows)": (
        "memory", lambda r: r["framework"] == "megatron-core" and "peak_allocated_gib" in r
        and "memory_measured_megatron-core.toml" in r.get("files", [r.get("file")])),
    "unstated grad_reduce read as bf16 (benchmarks/memory_accuracy.py)": (
        "memory", lambda r: r["framework"] == "megatron-core" and r.get("grad_reduce") == "unstated"),
    # issue 25 round 3: the EP overlap's unpaired passes (tuner/perfmodel/moe_exchange.unpaired_share, read from Megatron-Core's
    # combined 1F1B schedule, no constant) written after every row here had been printed; it moves only the rows
    # that ran the overlap (a2a_overlap true), so it names those
    "EP overlap's unpaired warm-up and cool-down passes (tuner/perfmodel/moe_exchange.unpaired_share)": (
        "speed", lambda r: r.get("a2a_overlap") is True and _saw(r, "issue 25 round 3 (")),
    # issue 25 round 3: DeepSeek-V3's multi-token prediction module (ModelSpec.mtp_num_layers, tuner/perfmodel/stages._add_mtp
    # and memory.mtp_params, from Megatron-Core's source, no constant), read onto the rows whose recipes ran it after
    # every one of them had been printed without it
    "multi-token prediction on the rows that ran it (mtp_num_layers, tuner/perfmodel/stages._add_mtp)": (
        "speed", lambda r: bool(r.get("mtp_num_layers")) and _saw(r, "issue 24 round 4 (")),
    # issue 25 round 3: DeepEP's SMs taken from the compute that hides its exchange (tuner/perfmodel/moe_exchange.sm_contention:
    # 20 of an H100's 132, from DeepEP's source and the GPU's spec, no constant fitted), written after every row here
    # had been printed; it moves only the rows that ran the flex dispatcher with the EP overlap
    "flex dispatcher's SMs under the EP overlap (tuner/perfmodel/moe_exchange.sm_contention)": (
        "speed", lambda r: r.get("a2a_overlap") is True and str(r.get("dispatcher", "")).startswith("flex") and _saw(r, "issue 24 round 4 (")),
    # issue 25 round 4: the shared experts beside the exchange (tuner/perfmodel/moe_exchange.shared_overlap_exposed, from
    # Megatron-Core's --moe-shared-expert-overlap, no constant), read onto the rows whose NeMo configs set it after every
    # one of them had been printed without it (Llama 4 Maverick's two were held out and seen by no speed choice before)
    "shared-expert overlap on the rows that ran it (shared_expert_overlap, tuner/perfmodel/moe_exchange.shared_overlap_exposed)": (
        "speed", lambda r: r.get("shared_expert_overlap") is True and _saw(r, "issue 25 round 4 (")),
    # issue 25 round 4: Megatron-MoE-ModelZoo's Qwen3-235B-A22B rows ran without --tp-comm-overlap (8017e112's yaml and
    # scripts pass none; its README: 'not yet compatible with MoE layers'), read after every one had been printed with it
    # (the pp 32 row was the last held out and seen by no speed choice)
    # (it names the rows it read: those added in round 3, not the ModelZoo's long-context rows added in round 5)
    "TP overlap off on Megatron-MoE-ModelZoo's Qwen3-235B-A22B rows (tp_comm_overlap false, moe_published.toml)": (
        "speed", lambda r: r.get("tp_comm_overlap") is False and "Megatron-MoE-ModelZoo" in r.get("release", "") and _saw(r, "issue 25 round 4 (")),
    # issue 25 (attention by sequence): fused attention's rate by sequence on Hopper (benchmarks/attention_curve.py,
    # the FlashAttention-3 paper's cuDNN curves anchored on h100.toml's constant at 2048) was built because of the
    # Megatron-MoE-ModelZoo's long-context Qwen3-235B-A22B rows' printed errors (round 5, 16k-128k; the 32k row was
    # held out and seen by no speed choice before). It is NOT applied, but keeping the flat constant is itself a
    # choice made after every row of moe / framework / llama / hardware_accuracy had been printed under both (its own
    # fresh NeMo long-sequence rows decided it): every row the curve moves -- a Hopper-class cluster's (h100, h100-gt,
    # h200, h800) -- that existed then saw it (lead's review: rejecting an alternative on held-out rows selects on them).
    "attention by sequence, not applied (benchmarks/attention_curve.py)": (
        "speed", lambda r: r.get("cluster") in ("h100", "h100-gt", "h200", "h800")
        and _saw(r, "issue 25 (attention by sequence")),
    # issue 24: torchtitan's op-SAC account (tuner/perfmodel/memory.op_sac_bytes) was derived from its 0.3.0
    # policy and checked on selective-less-full activations after every measured torchtitan row's error had
    # been printed, held-out ones included
    # (the rows of memory_measured_torchtitan.toml; memory_measured_torchtitan_fresh.toml was measured after it)
    "op-SAC account: fused QKV, logsumexp, w2's partial output, reduce-scatter outputs (tuner/perfmodel/memory.py)": (
        "memory", lambda r: "memory_measured_torchtitan.toml" in r.get("files", [r.get("file")])),
    # issue 24 round 2: torchtitan's memory outside the layers at its loss's peak (tuner/perfmodel/memory_loss.py)
    # and 0.3.0's per-layer RoPE cache (benchmarks/memory_accuracy.py) were derived from the source and checked on
    # the tuning rows' tracker categories, after every row of memory_measured_torchtitan.toml had been printed and
    # after the 15 of memory_measured_torchtitan_fresh.toml had been printed while alternatives were weighed (round
    # 1); memory_measured_torchtitan_fresh2.toml was drawn before it and measured after it
    "torchtitan's loss phase and 0.3.0's RoPE caches (tuner/perfmodel/memory_loss.py)": (
        "memory", lambda r: bool({"memory_measured_torchtitan.toml", "memory_measured_torchtitan_fresh.toml"}
                                 & set(r.get("files", [r.get("file")])))),
    # issue 24: the eager account keeps RoPE's fp32 q and k only for RoPE models, decided after every llm-foundry
    # (MPT, learned positions) run's p_fit had been printed, the held-out ones' bounds row by row
    "eager account without RoPE's fp32 q, k for a learned position table (tuner/perfmodel/memory.py)": (
        "memory", lambda r: r["framework"] == "fsdp"),
    # issue 24 round 3: the Nemotron-340B row's recompute, sequence parallelism and bf16 optimizer state (its
    # `read` key) were read from NeMo-Framework-Launcher 24.07 after its p_fit 0.00 had been printed
    "NeMo 24.07's Nemotron-340B recipe read onto its row (benchmarks/reading.ran_breakdown)": (
        "memory", lambda r: r.get("shape_name") == "nemo-nemotron-340b"),
    # issue 24 round 3: Megatron-Core >= 0.13's combine keeps no input (probabilities scale the experts' activation:
    # tuner/perfmodel/moe.moe_activation_bytes), read from its source after the Qwen3-30B-A3B mb-2 rows' p_fit
    # 0.00 and every Megatron-Core MoE row's memory error had been printed
    "Megatron-Core MoE combine keeps no input (Shape.probs_in_experts, tuner/perfmodel/moe.py)": (
        "memory", lambda r: r["framework"] == "megatron-core" and bool(r.get("ep") or r.get("num_experts"))),
    # issue 24 round 3: torchtitan's per-op SAC of an MoE layer keeps nothing of its routed experts (moe.op_sac_moe_bytes),
    # from source after the hashed-out op-SAC row printed +0.33 in log; twelfth session: its block's backward (moe.py
    # OP_SAC_MOE_BLOCK_REST, the op-SAC rows' tracker Temp) and reading.ran_loss_chunks, after pith-train #79's p_fit 0.00
    "torchtitan op-SAC MoE account and block backward (tuner/perfmodel/moe.py), ran_loss_chunks (reading.py)": (
        "memory", lambda r: r["framework"] == "torchtitan" and bool(r.get("num_experts") or "qwen3-30b" in r["model"])),
    # issue 24 round 4: llm-foundry's MPT under Composer's FSDP1 (benchmarks/reading.llm_foundry_breakdown: its block's
    # saved tensors, flash-attn's fused loss, FSDP1's buffers) read from llm-foundry 5e85bd6 / composer / flash-attn
    # after every MPT run's p_fit had been printed (74 of 86 >= 0.5)
    "llm-foundry's MPT under Composer FSDP1 (benchmarks/reading.llm_foundry_breakdown)": (
        "memory", lambda r: r["framework"] == "fsdp"),
    # issue 24 round 4: each framework's allocated-bytes spread (tuner/frameworks.py memory_bias / memory_sd, the
    # account's error without the allocator's share). First a normal fitted by maximum likelihood on every measured
    # row, FRESH2's 24 included; FRESH3 (drawn before it) was then printed with it as held out and failed three bins
    # (under-confident: a tight bulk and a few far rows); the robust scale chosen next (benchmarks/memory_accuracy.py
    # --fit: median bias, 1.4826 x the median absolute deviation) saw FRESH3 too. torchtitan's FRESH4 (its list in
    # benchmarks/torchtitan_memory/configs.py) and measure_memory_mcore.py FRESH were drawn and committed before it and
    # are seen by neither. (It names the files it saw: it named every measured file but those two until issue 24
    # round 5, so later batches counted as seen.)
    "allocated-bytes spread memory_sd (tuner/frameworks.py, benchmarks/memory_accuracy.py --fit)": (
        "memory", lambda r: bool({"memory_measured_megatron-core.toml", "memory_measured_torchtitan.toml",
                                  "memory_measured_torchtitan_fresh.toml", "memory_measured_torchtitan_fresh2.toml",
                                  "memory_measured_torchtitan_fresh3.toml"} & set(r.get("files", [r.get("file")])))),
    # issue 24 round 5: Megatron-Core's last stage at its unfused loss (bf16 and fp32 logits together, or the output
    # layer's backward: tuner/perfmodel/memory_loss.megatron_loss_bytes, memory.megatron_phases), the sequence-parallel
    # gather buffer (memory.sp_gather_bytes) and the tracker's retained pipeline tensors on later stages
    # (benchmarks/memory_accuracy.tracker_retained_gb), read from megatron-core 0.16.1 and the tracker after every
    # measured Megatron-Core row's error had been printed, FRESH's 24 included; Megatron-Core's memory_bias /
    # memory_sd were then chosen again (memory_accuracy.py --fit) on the same rows. FRESH2 was drawn after both; the
    # --pipeline rows (memory_measured_megatron-core_pipeline.toml, 4b4170d) were not printed by it.
    "Megatron-Core's loss phase, SP gather buffer and tracker-retained pipeline tensors; its bias / sd again": (
        "memory", lambda r: bool({"memory_measured_megatron-core.toml", "memory_measured_megatron-core_fresh.toml"}
                                 & set(r.get("files", [r.get("file")])))),
    # issue 24 round 5: the --pipeline rows (4b4170d) were printed against the account without a boundary tensor
    # (95daa1c) and against it with one for vp > 1; the second was not kept (the interleaved excess is MemTracker's
    # retained receives, growing with m at a fixed count in flight: docs/benchmarks.md), so they are seen by that choice
    "Megatron-Core's pipeline outputs freed under the interleaved schedule too (tuner/perfmodel/memory.py)": (
        "memory", lambda r: "memory_measured_megatron-core_pipeline.toml" in r.get("files", [r.get("file")])),
    # issue 24 round 8: Megatron-Core's layer backward on every stage (tuner/perfmodel/layer_backward.py: the received
    # gradient, the MLP's weight-gradient / activation moments, pp 1's tied output-layer weight gradient), read from
    # megatron-core 0.16.1 and checked against the live tensors at the peak of FRESH2 rows after every FRESH2 row's error
    # had been printed (1092531, 187bd15, 97689b4: its first stages and full recompute under-predicted); Megatron-Core's
    # memory_bias / memory_sd were then chosen again (memory_accuracy.py --fit) on every seen row, FRESH2's included
    "Megatron-Core's layer backward (tuner/perfmodel/layer_backward.py); its bias / sd again": (
        "memory", lambda r: "memory_measured_megatron-core_fresh2.toml" in r.get("files", [r.get("file")])),
    # issue 24 round 8, second pass: full recompute's recomputed layer output (tuner/perfmodel/layer_backward.py) and
    # the harness's RoPE (unfused; rotated q, k beside its v view's QKV output) and dropout-free Llama read as the rows
    # ran (benchmarks/memory_accuracy.harness_rope_dropout_gb), derived after FRESH3's clean print (78a03c3:
    # its Llama rows and one GPT full-recompute row above +0.0095) and checked on seen rows; Megatron-Core's
    # memory_bias / memory_sd were then chosen again on every seen row, FRESH3's included
    "Megatron-Core's RoPE copies, recomputed output, harness RoPE / dropout as ran; its bias / sd again": (
        "memory", lambda r: "memory_measured_megatron-core_fresh3.toml" in r.get("files", [r.get("file")])),
    # issue 24 round 9: the spread rule -- p_fit from the empirical distribution of the seen fake-tensor rows' log errors
    # (tuner/frameworks.py memory_errors, tuner/perfmodel/fit.py), chosen for every framework on the rows some memory
    # choice had already seen: Megatron-Core's CONFIGS, FRESH, FRESH2, FRESH3 and FRESH4 (printed clean with the
    # normal rule, 2600686 / 25af6c8: over-confident), torchtitan's CONFIGS, FRESH, FRESH2, FRESH3 and the 7 FRESH4
    # rows whose configuration a choice had seen (its 29 clean FRESH4 rows are not read). Megatron-Core's FRESH5
    # (measure_memory_mcore.py) was drawn with this entry, outside every row it names, and is measured and printed
    # only after the rule's constants are committed.
    "empirical spread rule memory_errors (tuner/frameworks.py, tuner/perfmodel/fit.py)": (
        "memory", lambda r: "memory_measured_megatron-core_fresh4.toml" in r.get("files", [r.get("file")])),
    # issue 24 (2935eb4): a GPU's capacity as the bytes a process can allocate (the presets' memory_gib, from CUDA / HIP
    # totals and OOM messages, not from any row), found while reading the runs that ran with p_fit < 0.5 (534afc2) and
    # printed on every published and hardware run under both readings (benchmarks/usable_capacity.py, 2935eb4): every
    # published or hardware row of its time saw it (not the fake-tensor measurements, which it does not move)
    "GPU capacity as the allocatable bytes (workloads/clusters/*.toml memory_gib)": (
        "memory", lambda r: "peak_allocated_gib" not in r and _saw(r, "issue 25 fresh dense")),
    # review of issue 26 (round 2's last gradient bucket, buckets.py): the default bucket is sized by the dp x cp group
    # (Megatron-LM training.py resolve_ddp_bucket_size), not dp; read from source after every row had been printed
    # with dp: it moves the context-parallel rows whose dp x cp exceeds 40 (not the fresh dense rows added after it)
    "Megatron-Core's default bucket size by the dp x cp group (tuner/perfmodel/buckets.py)": (
        "speed", lambda r: _bucket_moved(r) and _saw(r, "issue 25 round 4 (")),
    # issues 25 / 26 (step floor): Megatron-Core's per-step floor from Megatron-LM's CI runs (benchmarks/step_floor.py, a
    # variant; its size from the CI's measured steps, fitted on no row) was built because of the B200 Llama 3 8B cp 2
    # rows' fixed gap (held out, read in the previous session) and the strong series' fixed part, and NOT applied after
    # every row of framework / moe / llama / hardware / scaling_accuracy had been printed with and without it: every
    # Megatron-Core row of its time saw it (choosing either way selects on them), not the rows added after
    "Megatron-Core's CI step floor, not applied (benchmarks/step_floor.py)": (
        "speed", lambda r: r["framework"] == "megatron-core" and _saw(r, "issue 25 fresh dense")),
    # issues 25 / 26: each of Megatron-Core's gradient buckets pays NCCL's ring latency (tuner/perfmodel/__init__.py
    # bucket_latency; NCCL's constants and Megatron-Core's bucket rule from source, none fitted), built after the B200
    # Llama 3 8B rows' gap and a probe of it had been printed, kept after every row of framework / moe / llama / hardware
    # / scaling_accuracy had been printed with and without it: every Megatron-Core row of ba30800's batches saw it
    "Megatron-Core's buckets each pay NCCL's ring latency (tuner/perfmodel bucket_latency)": (
        "speed", lambda r: r["framework"] == "megatron-core" and _saw(r, "issue 25 fresh dense")),
    # issue 25 (MLPerf GPT-3): FP8 weights gathered in one byte (tuner/perfmodel/quantized.gather_bytes, from source),
    # MLPerf v3.0 / v3.1's ran_fp8_params false and v3.1's ran_attention flash-attn-2 (read from their Dockerfiles / NeMo /
    # TE), kept after the in-split Megatron-Core fp8 rows of framework / llama_published had been printed with and without
    "FP8 weights gathered in one byte; MLPerf v3.x's weights and attention as ran (quantized.py)": ("speed", lambda r: (
        r["framework"] == "megatron-core" and r.get("precision") == "fp8" and not held_out(r) and {"framework_published.toml",
        "llama_published.toml"} & set(r.get("files", [r.get("file")])) and _saw(r, "issue 25 / 26 second read of the twelfth session"))),
    # issue 25 (eager TP): torchtitan's Qwen3 TP plan before pytorch/torchtitan #1870 gathered q and k at q_norm / k_norm
    # (benchmarks/reading.py qk_norm_gather_s, read onto the rows of d66b72a6 that ran TP as `ran_qk_norm`; every term
    # from source and tuner's own accounting, no constant chosen), built after the in-split torchtitan and fsdp rows had
    # been printed and kept on them; d66b72a6's held-out TP rows saw it too (their errors were in the brief that asked
    # for it): of that batch's TP rows none counts as held out after it
    "torchtitan's Qwen3 TP plan before #1870 gathers q and k (benchmarks/reading.py qk_norm_gather_s)": (
        "speed", lambda r: r["framework"] in ("torchtitan", "fsdp") and (not held_out(r) or bool(r.get("ran_qk_norm")))
        and _saw(r, "issue 25 / 26 third read of the eleventh session")),
    "FlagPerf's launches as ran: overlaps off, FlashAttention-2 (benchmarks/speed_as_ran.py; read after its in-split rows)": (
        "speed", lambda r: any("FlagOpen/FlagPerf" in s for s in r.get("sources", [r.get("source", "")])) and not held_out(r)
        and _saw(r, "issue 25 / 26 twelfth session")),
    # twelfth session: read from dgxc-benchmarking v24.11.1's scripts for issue 25's NeMo rows, before any row it moves was printed
    "dgxc-benchmarking's NVTE_FUSED_ATTN=0 as FlashAttention-2 (benchmarks/speed_as_ran.py; named: its in-split rows)": ("speed", lambda r:
        not held_out(r) and r.get("ran_attention") == "flash-attn-2" and "dgxc-benchmarking" in r.get("source", "")
        and _saw(r, "issue 25 / 26 second read of the twelfth session")),
    # issue 25 item 3 (s10): group-limited routing in the flex dispatcher's reach (tuner/perfmodel/moe_exchange.hit_probability:
    # DeepSeek-V3's 4 of 8 expert groups, from Megatron-Core's group_limited_topk and router, no constant fitted), looked for
    # after the in-split MoE rows had been printed (the two flex DeepSeek-V3 runs on 1,024 H100, -17.0 / -14.8 %); it moves
    # only the flex-dispatcher DeepSeek-V3 rows, so it names those that were printed (no hashed-out row's error was printed
    # before it was committed; docs/benchmarks.md says what was printed after)
    "group-limited routing in the flex dispatcher's reach (tuner/perfmodel/moe_exchange.hit_probability)": (
        "speed", lambda r: r.get("model") == "deepseek-v3" and str(r.get("dispatcher", "")).startswith("flex")
        and not held_out(r) and _saw(r, "issue 25 / 26 second read of the twelfth session")),
    # issue 30 round 33: Megatron-DeepSpeed's own training step measured under fake tensors (benchmarks/measure_memory_mds.py,
    # its CONFIGS: the two thirds held_out leaves in), read while DeepSpeed's optimizers under the pipeline engine were
    # written from DeepSpeed's code (tuner/perfmodel/deepspeed_states.py) and the framework's measured spread was chosen
    # (tuner/frameworks.py memory_bias / memory_sd / memory_errors); FRESH (the held-out third) measured after both
    "DeepSpeed's pipeline-engine optimizers and Megatron-DeepSpeed's measured spread (deepspeed_states.py, frameworks.py)": (
        "memory", lambda r: "memory_measured_megatron-deepspeed.toml" in r.get("files", [r.get("file")])),
}


def seen_by(row: dict, kind: str | None = None) -> list[str]:
    """The choices of `kind` (None: any) that saw this row."""
    return [name for name, (k, pred) in SEEN.items() if (kind is None or k == kind) and pred(row)]


def seen_configurations(rows: list, seen, kind: str | None) -> frozenset:
    """The configurations (split keys) some row of which a choice (of `kind`) saw (`seen(row, kind)`): one
    configuration is one row across all data files, so a row measured again (another stage, another loss, another
    source) is seen too."""
    return frozenset(split_key(r) for r in rows if seen(r, kind))


@functools.cache
def _seen_configurations(kind: str | None) -> frozenset:
    """seen_configurations of SEEN's choices on the published and measured rows (hardware_seen.py: HARDWARE_SEEN's on
    the new machines' rows)."""
    return seen_configurations(published() + measured(), seen_by, kind)


def clean(row: dict, kind: str | None = None) -> bool:
    """Held out and seen by no choice (of `kind`), nor any row of its configuration: the only rows a benchmark
    may call held out."""
    return held_out(row) and not seen_by(row, kind) and split_key(row) not in _seen_configurations(kind)
