"""The chance a layout fits, and what the model's answers make of it: the memory prior every command states one
p_fit from (`predict`, `plan`, `best` and guided), the thresholds that prune and recommend, the expected speed
`plan` ranks by and the words of a risky layout. Pure (no I/O)."""

from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING

from tuner.frameworks import ALLOCATOR_BIAS, ALLOCATOR_SD

if TYPE_CHECKING:
    from tuner.perfmodel.prediction import Prediction
    from tuner.specs import Workload

#: A layout is pruned (never launched) only when it fits with probability below PRUNE_BELOW; one is
#: recommended without a measurement only when it fits with probability at least RECOMMEND_AT.
PRUNE_BELOW = 0.02
RECOMMEND_AT = 0.95
#: The prior of log(true / predicted peak) before any measurement, the same one the memory correction
#: (tuner.correction.Observations.memory_gp) starts from, so that `predict`, `plan`, `best` and guided state
#: one p_fit. Two sources (issue 24 round 4): the account's error against the bytes tensors allocate,
#: N(0, sd^2 (GLOBAL + SHARES |s|^2 + SMOOTH)) at a layout whose memory components have shares s, with sd the
#: framework's scale (tuner.frameworks memory_sd, measured on fake-tensor peaks: `account_sd`), split between an
#: error common to every layout, one per memory component and one smooth over the layout (the correction's
#: kernel terms); and, on a GPU, the caching allocator's share beyond those bytes, N(ALLOCATOR_BIAS,
#: ALLOCATOR_SD^2) from published out-of-memory messages (`memory_prior_sd`: both). The framework's bias is
#: already in the predicted peak (`measured_bias`). MEMORY_NOISE_SD is the run-to-run noise of a measured peak
#: (the correction's observation noise), no longer part of the prior.
MEMORY_PRIOR_SPLIT = {"global": 0.5, "shares": 1.0, "smooth": 0.25}
MEMORY_NOISE_SD = 0.02
MEMORY_KEYS = ("weights", "gradients", "optimizer", "fp8_weights", "activations", "logits", "zero3_buffers",
               "reserved", "measured_bias")


def memory_shares(breakdown: dict) -> list[float]:
    """Each memory component's share of the peak (MEMORY_KEYS order): the memory correction's features."""
    values = [breakdown.get(k, 0.0) for k in MEMORY_KEYS]
    total = sum(values) or 1.0
    return [v / total for v in values]


def memory_gp_scales(framework_sd: float) -> tuple[float, float, float]:
    """(global, per-component, smooth) prior sds of the memory correction for a framework's scale."""
    k = MEMORY_PRIOR_SPLIT
    return _gp_scales(framework_sd, k["global"], k["shares"], k["smooth"])


@functools.lru_cache(maxsize=64)
def _gp_scales(framework_sd: float, *split: float) -> tuple[float, float, float]:
    return tuple(framework_sd * math.sqrt(k) for k in split)


def account_sd(framework_sd: float, shares: list[float]) -> float:
    """The sd of log(allocated peak / predicted peak less the reserve): the account's error alone, what a
    fake-tensor measurement tests."""
    s_c, s_w, s_g = memory_gp_scales(framework_sd)
    return math.sqrt(s_c ** 2 + s_w ** 2 * sum([x * x for x in shares]) + s_g ** 2)


def memory_prior_sd(framework_sd: float, shares: list[float]) -> float:
    """The sd of log(what a GPU run needs / predicted peak): the account's error and the allocator's share."""
    return math.hypot(account_sd(framework_sd, shares), ALLOCATOR_SD)


def measured_need_gb(peak_gb: float, reserve_gb: float) -> float:
    """A measured peak as the model's figure (issue 24 round 6). Every runner's `peak_memory_gb` is the bytes its
    tensors allocated at the peak -- PyTorch's max_memory_allocated in GB of 1e9 bytes (the harness; Megatron's
    "max allocated", converted from MiB; the command runner's contract; the simulator's predicted figure less the
    reserve) -- while the model's figure adds the cluster's fixed reserve (memory_reserved_gb: CUDA context, NCCL
    buffers, workspaces) and leaves the caching allocator's share to p_fit (gpu_fit_probability). So a measured
    peak is compared with a prediction, or with capacity, as the allocated bytes plus that reserve: a run at
    exactly the predicted allocated bytes says the memory model is right, not 4 % high."""
    return peak_gb + reserve_gb


def run_need_gb(peak_gb: float, reserve_gb: float, reserved_gb: float | None = None) -> float:
    """What a measured run needed (issue 24 round 7): the larger of its caching allocator's reserved peak
    (max_memory_reserved, which holds that run's own fragmentation) plus the reserve outside PyTorch, and
    measured_need_gb of its allocated peak; the latter alone when no runner read the reserved peak."""
    need = measured_need_gb(peak_gb, reserve_gb)
    return need if reserved_gb is None else max(need, reserved_gb + reserve_gb)


def trial_need_gb(t, reserve_gb: float) -> float | None:
    """run_need_gb of a stored trial or a result (anything with peak_memory_gb and, where a runner read it,
    peak_reserved_gb): the figure plan and predict state for its layout; None when no peak was read."""
    if t.peak_memory_gb is None:
        return None
    return run_need_gb(t.peak_memory_gb, reserve_gb, getattr(t, "peak_reserved_gb", None))


def gpu_fit_probability(memory_gb: float, capacity_gb: float, sd: float) -> float:
    """P(a GPU run fits) for a predicted peak whose error on allocated bytes has sd `sd` (memory_prior_sd's
    account part, or the memory correction's): the allocator's share added to both mean and spread."""
    return fit_probability(memory_gb, capacity_gb, math.hypot(sd, ALLOCATOR_SD), ALLOCATOR_BIAS)


#: The spread rule (issue 24 round 9): where a framework's account was measured (tuner.frameworks memory_errors),
#: p_fit is the empirical distribution of the seen rows' log errors (allocated peak / predicted, about memory_bias),
#: kept as ERROR_QUANTILES equally likely atoms (`error_quantiles`), not a normal: the errors are a bulk within 0.001
#: and a tail (Megatron-Core's full recompute, torchtitan's recompute-free rows) that a median-and-MAD normal called
#: impossible (its sd 0.00027 stated [0.1, 0.3) 0.150 on FRESH4, realised 0.042). Chosen on seen rows only, by
#: leave-one-batch-out over the measured batches (docs/benchmarks.md): 16 atoms as near the full empirical CDF as 32.
ERROR_QUANTILES = 16


def error_quantiles(errors, k: int = ERROR_QUANTILES) -> tuple[float, ...]:
    """k equally likely atoms of the errors' empirical distribution: the sorted errors at ranks (j + 1/2) n / k."""
    xs = sorted(errors)
    return tuple(xs[min(len(xs) - 1, int((j + 0.5) * len(xs) / k))] for j in range(k))


def account_fit_probability(memory_gb: float, capacity_gb: float, errors: tuple[float, ...]) -> float:
    """P(allocated peak <= capacity) under the empirical errors: the share of atoms a with memory e^a <= capacity
    (what a fake-tensor peak tests; no allocator share)."""
    top = math.log(capacity_gb) - math.log(max(memory_gb, 1e-9))
    return sum(a <= top for a in errors) / len(errors)


def errors_fit_probability(memory_gb: float, capacity_gb: float, errors: tuple[float, ...]) -> float:
    """P(a GPU run fits): the empirical errors' atoms convolved with the allocator's share, N(ALLOCATOR_BIAS,
    ALLOCATOR_SD^2) -- the mean over atoms a of P(N <= log(capacity / memory) - a)."""
    top = math.log(capacity_gb) - math.log(max(memory_gb, 1e-9)) - ALLOCATOR_BIAS
    k, erfc = -1.0 / (ALLOCATOR_SD * math.sqrt(2.0)), math.erfc
    return 0.5 * sum([erfc((top - a) * k) for a in errors]) / len(errors)


def prior_fit_probability(breakdown: dict, capacity_gb: float, fw) -> float:
    """The prior p_fit of a stage's breakdown (with the framework's bias) on a GPU: the empirical errors where the
    framework's account was measured, else the normal of its assumed sd spread over the breakdown's shares."""
    if fw.memory_errors:
        return errors_fit_probability(breakdown["total"], capacity_gb, fw.memory_errors)
    return gpu_fit_probability(breakdown["total"], capacity_gb, account_sd(fw.memory_sd, memory_shares(breakdown)))


def fit_probability(memory_gb: float, capacity_gb: float, sd: float, mean: float = 0.0) -> float:
    """P(true peak <= capacity) when log(true / predicted) ~ N(mean, sd)."""
    z = (math.log(capacity_gb) - math.log(max(memory_gb, 1e-9)) - mean) / max(sd, 1e-6)
    return 0.5 * math.erfc(-z / math.sqrt(2.0))


def with_measured_bias(breakdown: dict, bias: float) -> dict:
    """The breakdown with the framework's measured memory bias as its own entry (`measured_bias`: the allocated
    part of the peak -- less the cluster's fixed reserve, which the bias was measured without -- times e^bias - 1),
    so that the one figure every command states is the model's expected peak."""
    if not bias:
        return breakdown
    out = dict(breakdown)
    out["measured_bias"] = (breakdown["total"] - breakdown.get("reserved", 0.0)) * math.expm1(bias)
    out["total"] = breakdown["total"] + out["measured_bias"]
    return out


def keeps_headroom(pred: Prediction, workload: Workload | None = None) -> bool:
    """Whether a layout may be recommended without a measurement: it fits with probability >= RECOMMEND_AT."""
    return pred.p_fit >= RECOMMEND_AT


def expected_speed(pred: Prediction) -> float:
    """Samples/s weighted by the chance the layout runs at all (p_fit): what `plan` ranks by, so a fast
    layout that probably fits is not buried under slower ones, and a doubtful one sinks as far as it is
    doubtful (one that fits with probability 0.8 ranks as 0.8 of its speed)."""
    return pred.samples_per_second * pred.p_fit


def risk(pred: Prediction, workload: Workload) -> str:
    """Why a layout may not fit (empty when p_fit >= RECOMMEND_AT): its worst stage, how full, how sure."""
    if pred.p_fit >= RECOMMEND_AT:
        return ""
    cap = workload.cluster.memory_gb
    return (f"stage {pred.memory_stage}: {pred.memory_gb:.1f} of {cap:.1f} GB ({100 * pred.memory_gb / cap:.0f} %), "
            f"p_fit {pred.p_fit:.2f}")
