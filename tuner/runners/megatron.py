"""Megatron-DeepSpeed's `pretrain_gpt.py` iteration log, parsed. Pure.

Its arguments and DeepSpeed config are rendered by tuner.render.megatron from one layout, so the
micro-batch Megatron uses and the one DeepSpeed is told about cannot disagree (the Frontier study's
micro-batch-4-vs-1 bug, which made one log print 149 TFLOPs). `parse_log` still cross-checks the
TFLOPs a log prints against the samples the run really processed, for logs of runs tuner did not launch.
"""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass

from tuner.perfmodel.flops import megatron_flops
from tuner.specs import ModelSpec

MISMATCH_TOLERANCE = 0.10


_ITER = re.compile(r"\biteration\s+(\d+)\s*/\s*(\d+)\s*\|(.*)$")
_MAX_ALLOC = re.compile(r"max allocated:\s*([0-9.]+)")
_MAX_RESERVED = re.compile(r"max reserved:\s*([0-9.]+)")
# What parse_log reads of a log, lower-cased: its iteration lines and report_memory's lines; a reader of a large log
# keeps only the lines holding one (tuner.runners.failure_log.marked_lines).
LOG_MARKERS = ("iteration", "max allocated", "max reserved")
MIB = 1024 ** 2         # report_memory's "memory (MB)": torch.cuda.max_memory_allocated() / (1024 * 1024)


@dataclass(frozen=True)
class IterationLog:
    """What a Megatron-DeepSpeed log says about its post-warm-up iterations (medians)."""

    iterations: int                      # post-warm-up iterations the medians are over
    time_ms: float                       # elapsed time per iteration
    samples_per_second: float | None
    tflops_logged: float | None          # what the log printed (per GPU)
    tflops: float                        # recomputed from the samples processed and the measured time
    samples_per_iteration: float
    peak_memory_gb: float | None = None  # largest "max allocated" of any rank (GB of 1e9 bytes), if the log has it
    peak_reserved_gb: float | None = None  # largest "max reserved" of any rank (GB of 1e9 bytes), if the log has it
    mismatch: str | None = None          # why the logged TFLOPs (or batch) cannot be trusted, if so


def _fields(rest: str) -> dict[str, float]:
    out = {}
    for part in rest.split("|"):
        key, sep, value = part.rpartition(":")
        if not sep:
            continue
        try:
            out[key.strip().lower()] = float(value.strip())
        except ValueError:
            pass
    return out


def parse_log(text: str, model: ModelSpec, gpus: int, *, recompute: bool, global_batch: int | None = None,
              warmup: int = 1, tolerance: float = MISMATCH_TOLERANCE) -> IterationLog | None:
    """Medians over iterations numbered > `warmup`; None when the log has no such iteration.

    Samples processed per iteration come from the growth of "consumed samples" (what Megatron really
    fed), else the logged "global batch size", else `global_batch`. TFLOPs are recomputed from them
    with `megatron_flops`; a logged figure more than `tolerance` away is reported in `mismatch`.
    """
    rows: list[tuple[int, dict[str, float]]] = []
    for line in text.splitlines():
        m = _ITER.search(line)
        if m:
            rows.append((int(m.group(1)), _fields(m.group(3))))
    if not rows:
        return None
    consumed = {i: f["consumed samples"] for i, f in rows if "consumed samples" in f}
    post = [(i, f) for i, f in rows if i > warmup and "elapsed time per iteration (ms)" in f]
    if not post:
        return None

    per_iter: list[float] = []
    for i, f in post:
        if i in consumed and (i - 1) in consumed:
            per_iter.append(consumed[i] - consumed[i - 1])
        elif "global batch size" in f:
            per_iter.append(f["global batch size"])
    if per_iter:
        samples = statistics.median(per_iter)
    elif global_batch is not None:
        samples = float(global_batch)
    else:
        return None

    time_ms = statistics.median(f["elapsed time per iteration (ms)"] for _, f in post)
    sps = [f["samples per second"] for _, f in post if "samples per second" in f]
    logged = [f[k] for _, f in post for k in ("tflops", "tflops per gpu") if k in f]
    tflops = megatron_flops(model, samples, recompute) / (time_ms / 1e3 * gpus * 1e12) if samples else 0.0
    tflops_logged = statistics.median(logged) if logged else None

    problems = []
    if global_batch is not None and samples and abs(samples - global_batch) > 0.5:
        problems.append(f"processed {samples:g} samples per iteration but the layout's global batch is {global_batch}")
    if tflops_logged is not None and tflops > 0 and abs(tflops_logged - tflops) / tflops > tolerance:
        problems.append(f"logged {tflops_logged:.1f} TFLOPs but {samples:g} samples per {time_ms:.1f} ms on "
                        f"{gpus} GPUs is {tflops:.1f} TFLOPs ({tflops_logged / tflops:.2f}x)")
    peaks = [float(x) for x in _MAX_ALLOC.findall(text)]
    reserved = [float(x) for x in _MAX_RESERVED.findall(text)]
    return IterationLog(
        iterations=len(post), time_ms=time_ms,
        samples_per_second=statistics.median(sps) if sps else samples / (time_ms / 1e3),
        tflops_logged=tflops_logged, tflops=tflops, samples_per_iteration=samples,
        peak_memory_gb=max(peaks) * MIB / 1e9 if peaks else None,   # Megatron reports MiB (bytes / 1024**2)
        peak_reserved_gb=max(reserved) * MIB / 1e9 if reserved else None,
        mismatch="; ".join(problems) or None)
