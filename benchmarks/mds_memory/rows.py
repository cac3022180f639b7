"""A Megatron-DeepSpeed configuration as tuner reads it (its row's keys, its layout and workload, the files `tuner
launch` writes for it) and a measured result as a row of data/memory_measured_megatron-deepspeed*.toml."""

from __future__ import annotations

from pathlib import Path

from mcore_memory.rows import toml_rows
from mds_memory.configs import CLUSTER, GiB, MDS_COMMIT, rank_of


def split_row(c: dict) -> dict:
    """The keys published.split_key and benchmarks/reading.py read, for configuration `c`."""
    from tuner.specs import load_model
    gpus = c["tp"] * c["pp"] * c["dp"]
    return {"framework": "megatron-deepspeed", "model": c["model"], "cluster": CLUSTER, "gpus": gpus,
            "seq_length": load_model(c["model"]).seq_length,
            "precision": "bf16", "global_batch": c["micro_batch"] * c["num_microbatches"] * c["dp"],
            "micro_batch": c["micro_batch"], "tp": c["tp"], "pp": c["pp"], "cp": 1, "vp": 1,
            "sequence_parallel": c["tp"] > 1, "recompute": c["recompute"], "zero_stage": c["zero_stage"],
            "stage": c["stage"]}


def layout_workload(c: dict):
    """(Layout, Workload) of `c` as benchmarks/memory_accuracy.py predicts its row."""
    import reading
    row = split_row(c)
    return reading.layout_of(row), reading.workload_of(row)


def launch_files(c: dict, ds_config_path: str) -> tuple[list[str], dict]:
    """What `tuner launch` writes for `c`: pretrain_gpt.py's argv and the DeepSpeed config (tuner.render.megatron)."""
    from tuner.render.megatron import deepspeed_config, pretrain_args
    lay, wl = layout_workload(c)
    return pretrain_args(lay, wl, deepspeed_config_path=ds_config_path, iterations=2), deepspeed_config(lay, wl)


def predicted_gb(c: dict) -> float:
    """tuner's account of the measured stage, less the cluster's fixed reserve (what a fake tensor never allocates)."""
    from tuner.layout import micro_batches_per_pipeline
    from tuner.perfmodel import memory
    from tuner.perfmodel.compute import shape_of
    lay, wl = layout_workload(c)
    mem = memory.stage_memory(lay, wl, c["stage"], micro_batches_per_pipeline(lay, wl.global_batch), shape_of(lay, wl))
    return mem["total"] - mem["reserved"]


def to_row(c: dict, r: dict, versions: dict) -> dict:
    """One measured configuration: its keys, the peak of allocated bytes and where it came from."""
    row = dict(split_row(c), source=(f"measured: Megatron-DeepSpeed {MDS_COMMIT} (pretrain_gpt.py's model_provider, "
                                     f"setup_model_and_optimizer, train_step) on DeepSpeed {versions['deepspeed']} under "
                                     f"FakeTensorMode, torch {versions['torch']} MemTracker, "
                                     "benchmarks/measure_memory_mds.py"),
               release=f"Megatron-DeepSpeed {MDS_COMMIT}, DeepSpeed {versions['deepspeed']}",
               num_microbatches=c["num_microbatches"],
               attention="flash-standin: FlashAttention-2's footprint (saves q, k, v, out, fp32 lse), no s x s scores",
               peak_allocated_gib=r["peak"] / GiB)
    where = "the optimizer step" if r["peak"] > r["fb_peak"] else "forward/backward"
    row["note"] = (f"rank {rank_of(c)} of {row['gpus']} (tp / dp rank 0, pipeline stage {c['stage']}); "
                   f"{r['n_params']} parameters on this rank; {r['engine']}; the peak is in {where}; forward/backward "
                   f"peak {r['fb_peak'] / GiB:.4f} GiB; allocated between iterations {r['between'] / GiB:.4f} GiB; "
                   f"argv as tuner launch writes it: {' '.join(r['argv'])}")
    if c["pp"] == 1 and c["tp"] > 1:
        row["note"] += ("; sequence parallelism without the pipeline engine fails in this Megatron-DeepSpeed (get_batch "
                        "cuts the tokens by tensor rank, the embedding scatters them again): measured with the whole "
                        "sequence into the embedding (mds_memory.patches.whole_batch_under_sequence_parallelism)")
    return row


def write_toml(rows, path) -> None:
    head = ["# MEASURED per-GPU peak memory of Megatron-DeepSpeed's own GPT training step, one [[row]] per configuration,",
            "# written by benchmarks/measure_memory_mds.py (its docstring: what `tuner launch` writes for Frontier,",
            "# run through Megatron-DeepSpeed's pretrain_gpt.py model and train_step on DeepSpeed's engine under",
            "# FakeTensorMode on a fake process group; MemTracker's peak of allocated bytes over the second of two",
            "# iterations of the one rank named by `stage`). GiB = 2^30 bytes. No caching-allocator fragmentation,",
            "# device context or communication buffers of the collective library are included.", ""]
    Path(path).write_text(toml_rows(head, rows))
