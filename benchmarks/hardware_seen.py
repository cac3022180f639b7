"""What saw which row of the new machines' file (benchmarks/data/hardware_published.toml): `HARDWARE_SEEN`, each
choice made after seeing its rows with the rows it saw, and `hardware_clean`, the rule built on it. Split from
benchmarks/seen.py (SEEN, BATCHES, _saw: the published and measured rows), which it reads; published.py
re-exports every name here."""

from __future__ import annotations

import functools

from published_rows import _bucket_moved, hardware, held_out, mb_tables_read, split_key  # noqa: F401
from seen import SEEN, _saw, seen_configurations

#: Choices made after seeing rows of HARDWARE (the SEEN choices above predate that file, so they saw none of its
#: rows; its clusters' constants are quoted or marked ESTIMATE in their files, none chosen on these rows). The
#: 64-GPU MI325X Llama 3.1 8B row's unstated global batch was corrected (128 -> 1024, AMD's per-node scaling)
#: after the benchmark had printed the MI325X rows' errors: those rows are not held out (none was hashed out).
#: mi325x.toml's GEMM fractions (AMD's measured MI325X TAF, issue 26's third session) were chosen after the
#: MI325X rows' errors with MI300X's fractions had been printed: those rows are seen by that choice too.
HARDWARE_SEEN: dict = {
    # (the four Primus-projection rows; the MLPerf v6.0 MI325X row, marked `added`, came after both choices)
    "mi325x-8b-global-batch": ("speed", lambda r: r.get("cluster") == "mi325x" and "added" not in r),
    "mi325x-gemm-taf": ("speed", lambda r: r.get("cluster") == "mi325x" and "added" not in r),
    # issue 26 round 3: mi355x.toml's GEMM fractions from AMD's CDNA 4 hipBLASLt FP8 figures (and its RCCL figures, MI300X's
    # rccl-tests) were looked for after both MI355X rows had been printed -26 / -32 % with MI300X's 2024 fractions: seen.
    # (mi300x.toml's new GEMM and RCCL constants were chosen from AMD's MAF / rccl-tests before any MI300X row had been
    # printed: they saw no row; MI325X's rows, which the RCCL figures move too, are seen above.)
    "mi355x-gemm-cdna4": ("speed", lambda r: r.get("cluster") == "mi355x" and _saw(r, "issue 25 round 4 (")),
    # issue 24: Megatron-Core's activation CPU offloading (benchmarks/reading.ran_breakdown) read from the recipes
    # onto the Megatron-FSDP rows (ran_offload_layers) after their p_fit 0.00 had been printed; memory only
    "activation offloading read onto the Megatron-FSDP rows (benchmarks/reading.py)": (
        "memory", lambda r: "ran_offload_layers" in r),
    # issue 24 round 5: Megatron-Core frees each pipeline pass's output once sent (tuner/frameworks.py
    # frees_pipeline_outputs), read from source after every pipelined row's p_fit had been printed (the eight
    # deep-interleaved Llama rows motivated it); memory only
    "Megatron-Core's deallocate_pipeline_outputs (tuner/perfmodel/memory.py)": (
        "memory", lambda r: r.get("framework", "megatron-core") == "megatron-core" and r.get("pp", 1) > 1),
    # issue 24 round 5: a recipe's recompute_modules read at the row's tag onto the row (ran_recompute) after its
    # p_fit had been printed; it moves the row's step time too
    "recompute read onto hardware rows at their tag (ran_recompute, memory)": ("memory", lambda r: "ran_recompute" in r),
    "recompute read onto hardware rows at their tag (ran_recompute, speed)": (
        "speed", lambda r: "ran_recompute" in r and _saw(r, "issue 24 round 4 (")),
    # issue 24 round 5: a layout read from the recipe at the row's tag where the table's cells disagree (ran_pp,
    # ran_vp, ran_micro_batch), after the row's p_fit had been printed; it moves the step time too
    **{f"the recipe's layout read onto hardware rows whose cells disagree (ran_pp / ran_vp / ran_micro_batch, {k})": (
        k, lambda r: bool({"ran_pp", "ran_vp", "ran_micro_batch"} & set(r)) and _saw(r, "issue 24 round 4 (")
    ) for k in ("memory", "speed")},
    # issue 24 round 5: Megatron-Bridge's fp8_param_gather (benchmarks/reading.ran_fp8_params since round 6) read from source
    # after every Blackwell row's p_fit had been printed; memory only
    "Megatron-Bridge's FP8 weights held quantized only (benchmarks/reading.py)": (
        "memory", lambda r: r.get("release", "").startswith("Megatron-Bridge")
        and r.get("precision") in ("fp8", "mxfp8", "nvfp4")),
    # issue 24 round 6: TransformerEngine's quantized weights from source (tuner/perfmodel/quantized.py: per-tensor
    # FP8's transpose off Blackwell, no copy of the embedding / LM head, the weights alone under the --fp8-param-gather
    # launch writes) after every low-precision row's p_fit had been printed; memory only
    "TransformerEngine's quantized weights as launch runs them (tuner/perfmodel/quantized.py)": (
        "memory", lambda r: r.get("framework") in ("megatron-core", "megatron-deepspeed")
        and r.get("precision") in ("fp8", "mxfp8", "nvfp4")),
    # review of issue 26: the default gradient bucket sized by the dp x cp group (SEEN's entry of the same name): it
    # moves the held-out GB300 Llama 3 8B 512-GPU row (tp2 cp4, +129.6 -> +124.4 %) and the B200 8B 64- and 256-GPU rows
    # (it saw the rows of its time: rows added after the Blackwell GEMM curve below, which came later, were not printed by it)
    "Megatron-Core's default bucket size by the dp x cp group (tuner/perfmodel/buckets.py)": (
        "speed", lambda r: _bucket_moved(r) and _saw(r, "issue 25 round 4 (")),
    # issue 24 (2935eb4): a GPU's capacity as the bytes a process can allocate (the presets' memory_gib, from CUDA / HIP
    # totals and OOM messages, not from any row) was found while reading the published runs that ran with p_fit < 0.5
    # (534afc2) and printed on every published and hardware run under both readings (benchmarks/usable_capacity.py, then
    # 2935eb4's before / after): every published or hardware row of its time saw it (not the fake-tensor measurements,
    # whose reliability sweeps capacities and which it does not move)
    "GPU capacity as the allocatable bytes (workloads/clusters/*.toml memory_gib)": (
        "memory", lambda r: "peak_allocated_gib" not in r and _saw(r, "issue 25 fresh dense")),
    # issue 26 sixth session: the Blackwell GEMM curve (b200.toml [9]: eta_max 0.675 -> 0.666, knee 3.1 -> 9.6 GFLOP, from
    # XLA's sm_100 GEMM sweep and vLLM's two points; gb200 / b300 / gb300 carry it) was looked for after every Blackwell
    # row had been printed (the brief named their dense excess); it moves every row on those machines, so all are seen
    # (round 3's 750 W B200 rows included); rows added after it (their `added` says so) are not.
    # issue 24 (the two runs that ran at p_fit < 0.5): what DeepSeek-V3's report says its run did to memory (DualPipe,
    # BF16 moments, FP32 gradients, RMSNorm / MLA up-projection / SwiGLU recompute, one MTP module) and Primus's 8-node
    # script's micro batch and global batch read onto the H800 and MI355X rows after their p_fit (0.00, 0.04) had been
    # printed; the recompute, gradients, MTP and batch move their step time too
    **{f"issue 24's reading of the H800 DeepSeek-V3 and MI355X Mixtral 8x22B runs (benchmarks/reading.py, {k})": (
        k, lambda r: ("ran_schedule" in r or "ran_global_batch" in r) and _saw(r, "issue 26 eighth session")
    ) for k in ("memory", "speed")},
    "Blackwell GEMM curve from XLA's sm_100 sweep (workloads/clusters/b200.toml [9])": (
        "speed", lambda r: r.get("cluster") in ("b200", "gb200", "b300", "gb300") and _saw(r, "issue 25 round 5 (")),
    # issue 26 (2026-12-03), each chosen after benchmarks/in_split_rows.py (or dp_bounds.py / parallel_bounds.py; none predicts a held-out row) had
    # printed the in-split Blackwell rows (GB200 / B200 too fast, GB300 too slow), no held-out row's error printed: GB200's and
    # B300's GEMM fractions from the MAMF finder (gb200.toml [7], b300.toml [5]); context parallelism's merges (TE's ring); NCCL's SMs; the TP overlap's own GEMM cost (at 3610596); fifteenth session (scale): the MLPerf configs' bucket sizes (the B200 8B and GB200 DeepSeek-V3 series)
    **{k: ("speed", lambda r: r.get("cluster") in ("b200", "gb200", "b300", "gb300") and not held_out(r) and _saw(r, "issue 25 / 26 second read of the twelfth session"))
       for k in ("GB200 / B300 GEMM fractions from the MAMF finder (workloads/clusters/gb200.toml [7], b300.toml [5])",
                 "context parallelism's merges (tuner/perfmodel/compute.py cp_merge_bytes)",
                 "NCCL's SMs on B200 / GB200 (workloads/clusters/b200.toml [11], gb200.toml [8] sm_count; benchmarks/dp_bounds.py)", "the TP overlap's own GEMM cost on B200 / GB200 (tuner/perfmodel/tp_overlap.gemm_cost_seconds; b200.toml [12], gb200.toml [9])", "MLPerf configs' bucket sizes as ran (ran_bucket_size -> Workload.ddp_bucket_size, benchmarks/reading.workload_of)")},
    # issues 25 / 26: SEEN's entry of that name (every Megatron-Core row here printed with and without it, ROCm's too)
    "Megatron-Core's CI step floor, not applied (benchmarks/step_floor.py)": (
        "speed", lambda r: r.get("framework", "megatron-core") == "megatron-core" and _saw(r, "issue 25 fresh dense")),
    # issues 25 / 26: SEEN's entry of that name (every Megatron-Core row here of ba30800's batches printed with and without)
    "Megatron-Core's buckets each pay NCCL's ring latency (tuner/perfmodel bucket_latency)": (
        "speed", lambda r: r.get("framework", "megatron-core") == "megatron-core" and _saw(r, "issue 25 fresh dense")),
    # issues 25 / 26 (DeepSeek-V3 on GB300): no fixed MoE layer overhead where the whole iteration replays as one CUDA
    # graph (tuner/perfmodel/moe.layer_overhead, from the configs and Megatron-LM / DeepEP source, no constant chosen),
    # looked for after the step breakdown of the four DeepSeek-V3 GB300 rows of the eighth session on 256-4,096 GPUs had
    # been printed (-27.2 / -25.9 / -17.3 / -20.9 %). The held-out 8,192-GPU row is seen by it too (review): its error
    # (-17.0 %) had been printed with the other four's in ad1dcb6 as "the five DeepSeek-V3 v6.0 runs ... too slow", the
    # pattern the term was looked for to explain (as SPLIT_ACCUMULATOR's held-out fp8 rows above). The ninth session's
    # GB200 rows (printed at 880512a, predicted too fast, moved the other way by it) did not prompt it
    "no MoE layer overhead under full-iteration CUDA graphs (tuner/perfmodel/moe.layer_overhead)": (
        "speed", lambda r: r.get("cluster") == "gb300" and r.get("model") == "deepseek-v3"
        and str(r.get("added", "")).startswith("issue 26 eighth session")),
    **{k: v for k, v in SEEN.items() if k.startswith(("FlagPerf's launches", "torchtitan / llm-foundry attention as ran"))},
    "torchtitan's cuDNN-first SDPA on Blackwell, ran_attention 'cudnn', issue 26 (read after its in-split rows were printed)": ("speed",
        lambda r: r.get("ran_attention") == "cudnn" and not held_out(r) and _saw(r, "issue 25 / 26 second read of the twelfth session")),
    # issue 26 fifteenth session: TE's one-pass MXFP8 casts, chosen after in_split_rows.py printed the in-split Blackwell rows; the
    # held-out rows of the Megatron-Bridge tables read then (mb_tables_read: throughputs, no error printed; every precision) too
    "Transformer Engine's one-pass MXFP8 casts (tuner/perfmodel/compute.py MXFP8_ONE_PASS_BYTES)": ("speed", lambda r: r.get("cluster") in (
        "b200", "gb200", "b300", "gb300") and _saw(r, "issue 26 fifteenth session (gemm)") and (not held_out(r) or mb_tables_read(r))),
    # issue 25 fifteenth session (moe): TP overlap off as the recipe ran it (hardware_published.toml, Megatron-Bridge 26.04-alpha.rc2), read after
    # in_split_rows.py printed the in-split GB200 MLPerf v6.0 DeepSeek-V3 rows (256 / 2,048 / 4,096 / 8,192 GPUs); the held-out 512-GPU row's error was not printed
    "GB200 MLPerf v6.0 DeepSeek-V3 without --tp-comm-overlap (tp_comm_overlap)": ("speed", lambda r: r.get("cluster") == "gb200" and r.get("model") == "deepseek-v3" and r.get("tp_comm_overlap") is False and str(r.get("added", "")).startswith("issue 26 ninth session") and not held_out(r)),
}


def _hardware_seen(row: dict, kind: str | None) -> bool:
    return any(pred(row) for k, pred in HARDWARE_SEEN.values() if kind in (None, k))


@functools.cache
def _hardware_seen_configurations(kind: str | None) -> frozenset:
    return seen_configurations(hardware(), _hardware_seen, kind)


def hardware_clean(row: dict, kind: str | None = None) -> bool:
    """A HARDWARE row hashed out and seen by no choice of HARDWARE_SEEN (of `kind`; None: any) nor any row of its configuration."""
    return (held_out(row) and not _hardware_seen(row, kind)
            and split_key(row) not in _hardware_seen_configurations(kind))
