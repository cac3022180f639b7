"""One objective: training speed. Every figure of a trial derived from its samples per second. Pure.

- `samples_per_second` is what a runner measures (or `step_time_s`: global batch / step time).
- `mfu` = samples/s x model FLOPs per sample (no recompute) / (GPUs x peak): the ranking key. For a
  fixed model, node count and global batch it orders layouts exactly as samples/s does.
- `tflops_per_gpu` and `peak_fraction` are Megatron's count (recomputed FLOPs included when
  activation checkpointing is on): the Frontier study's figure, reported beside MFU, never ranked on.

Every runner is put on the same footing by `complete`: whatever TFLOPS a runner claims, tuner
derives MFU and the Megatron count itself from the model spec.
"""

from __future__ import annotations

from dataclasses import replace

from tuner.layout import Layout
from tuner.perfmodel.flops import megatron_flops, model_flops
from tuner.specs import Workload


def mfu(samples_per_second: float, workload: Workload) -> float:
    """Model-FLOPs utilisation of a measured throughput."""
    per_sample = model_flops(workload.model, 1)
    return samples_per_second * per_sample / (workload.gpus * workload.cluster.peak_tflops * 1e12)


def megatron_tflops(samples_per_second: float, workload: Workload, layout: Layout) -> float:
    """Megatron's TFLOPS per GPU (recomputed work counted) of a measured throughput."""
    per_sample = megatron_flops(workload.model, 1, layout.recompute)
    return samples_per_second * per_sample / (workload.gpus * 1e12)


def figures(samples_per_second: float, workload: Workload, layout: Layout) -> dict:
    """samples_per_second, mfu, tflops_per_gpu (Megatron) and peak_fraction (Megatron / peak)."""
    tf = megatron_tflops(samples_per_second, workload, layout)
    return {"samples_per_second": samples_per_second, "mfu": mfu(samples_per_second, workload),
            "tflops_per_gpu": tf, "peak_fraction": tf / workload.cluster.peak_tflops}


def complete(result, workload: Workload, layout: Layout):
    """`result` (a TrialResult) with mfu, tflops_per_gpu and peak_fraction derived from its samples/s.

    A result without samples/s keeps no throughput figure at all (a runner's own TFLOPS are not
    trusted: they may count FLOPs differently)."""
    sps = result.samples_per_second
    if sps is None or not sps > 0:
        return replace(result, mfu=None, tflops_per_gpu=None, peak_fraction=None, samples_per_second=None)
    return replace(result, **figures(float(sps), workload, layout))


def samples_from_step_time(step_time_s: float, workload: Workload) -> float:
    return workload.global_batch / step_time_s


def rank_key(mfu_value: float, memory_gb: float | None, layout: Layout) -> tuple:
    """The one order of the recommendation, used by the store, every report and the guided searcher's
    stop line: fastest (highest MFU) first; at equal speed the smaller peak memory (more headroom),
    then the layout key, so that every front end names the same layout whatever order trials ran in."""
    return (-mfu_value, memory_gb if memory_gb is not None else float("inf"), layout.key())


def trial_rank_key(t) -> tuple:
    """rank_key of a stored trial: its measured peak memory, else the model's."""
    memory = t.peak_memory_gb if t.peak_memory_gb is not None else getattr(t, "predicted_memory_gb", None)
    return rank_key(t.mfu, memory, t.layout)
