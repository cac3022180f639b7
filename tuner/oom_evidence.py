"""What a measured OOM says about other layouts (issue 24): it is a lower bound on the layout's peak, and every
layout that keeps its activations by the same account per token -- the same tp, sequence and context
parallelism, recompute mode and expert split, at any dp, ZeRO stage, pipeline depth or micro-batch -- has them
off by the same factor. The model state is exact arithmetic; the activations are a model of what kernels keep,
so the OOM says that factor is at least what would fill the GPU, and such a layout fits only if the factor is
at most what fills it there. `best` caps the probability that it fits by the chance of that given the OOM
(the memory correction's belief about the OOM'd layout, given that it did not fit). A twin (the same layout at
another dp or ZeRO stage: the same activations) needs the OOM'd layout's true peak less the state it saves.

Pure (no I/O): stored trials in, bounds and probabilities out.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, replace

from tuner.correction import features, left_out, record_workload, simulated
from tuner.frameworks import ALLOCATOR_BIAS, ALLOCATOR_SD, ALLOCATOR_TAIL_SD, ALLOCATOR_TAIL_WEIGHT
from tuner.layout import Layout
from tuner.perfmodel import MEMORY_NOISE_SD, predict
from tuner.perfmodel.fit import measured_need_gb, trial_need_gb
from tuner.specs import Workload
from tuner.trial import Status, oom_capacity_gb, oom_outside_gb


@dataclass(frozen=True)
class OomBound:
    """A measured OOM as a bound on its twins: its layout and node count, its predicted peak (GB), the
    capacity it exceeded as log(capacity / predicted), and the memory correction's belief about its
    log(true / predicted) before the OOM is known (mean, sd); act_gb, its predicted activations (GB)."""

    layout: Layout
    nodes: int
    total_gb: float
    act_gb: float
    bound: float
    mean: float
    sd: float
    refuted_by: Layout | None = None   # a measured ok run of its activation account by whose factor it had room
    shares: tuple[float, ...] = (1.0,)  # the allocator's shares its account's ok runs measured (room_gb; 1: none)


def said_capacities(records, workload: Workload, studies: dict | None = None) -> list[float]:
    """What the measured OOMs of `workload`'s cluster (at any node count, in any framework: a property of the GPU
    and of what else holds its memory) said a process had on a GPU, GB: PyTorch's messages, in use plus free
    (tuner.trial.oom_capacity_gb); simulated trials and OOMs without such a message say nothing."""
    reserve = workload.cluster.memory_reserved_gb
    return [gb for gb in (oom_capacity_gb(m, reserve) for m in _oom_messages(records, workload, studies)) if gb]


def said_outside(records, workload: Workload, studies: dict | None = None) -> list[float]:
    """What the same OOMs' messages said their process held outside PyTorch's caching allocator, GB (CUDA context,
    communicator buffers: tuner.trial.oom_outside_gb); a message that does not name the process says nothing."""
    return [gb for gb in map(oom_outside_gb, _oom_messages(records, workload, studies)) if gb is not None]


def outside_gb(said: list[float]) -> float | None:
    """The memory outside the allocator a run that read its reserved peak is counted with (the median of what the OOMs
    `said`: said_outside), in place of the cluster's reserve (Observations.outside_gb); None where none said."""
    return statistics.median(said) if said else None


def _oom_messages(records, workload: Workload, studies: dict | None) -> list[str]:
    """The messages of the measured OOMs of `workload`'s cluster (at any node count, in any framework)."""
    return [getattr(rec, "message", "") or "" for rec in records or ()
            if rec.status == Status.OOM and getattr(rec, "cluster", workload.cluster.name) == workload.cluster.name
            and not simulated(rec, studies)]


def usable_capacity(said: list[float], capacity_gb: float, agree_gb: float = math.inf) -> tuple[float, int] | None:
    """(GB, n): the median of the n capacities the OOMs `said` (said_capacities) that agree -- within `agree_gb` of
    the median of all --, where they are most of them and it is below the cluster's `capacity_gb`; None where none
    said, they say at least that, or no majority agrees. Every p_fit then compares with it.
    Why a majority within the cluster's reserve (`usable_workload` passes it): a message is what one process had on
    one GPU at one moment. Where the job has its GPUs to itself, in use + free is the same at every OOM (the
    driver's share is fixed), and the figures read without this process's line differ by at most what the process
    held outside PyTorch, for which the reserve stands. One farther away had something else on its GPU then -- another
    job on a node that is not exclusive (InternLM/InternLM#186: OOMs by chance on shared Slurm nodes; huggingface/
    accelerate#1519: 34.89 GiB reserved + 0.72 free of 79.35 on one of its nodes), a leftover process -- or came from
    another kind of device. Consistent figures are trusted whatever they say, also far below the file's capacity (a
    fleet of MIG slices, whose total is the slice's; another job on every GPU); two that disagree are not, and the
    file's capacity stands until another OOM breaks the tie."""
    said = sorted(said)
    if not said:
        return None
    agree = [gb for gb in said if abs(gb - _median(said)) <= agree_gb]
    if 2 * len(agree) <= len(said):
        return None
    gb = _median(agree)
    return (gb, len(agree)) if gb < capacity_gb else None


def _median(xs: list[float]) -> float:
    """The median of sorted `xs` (not empty)."""
    mid = len(xs) // 2
    return xs[mid] if len(xs) % 2 else 0.5 * (xs[mid - 1] + xs[mid])


def with_capacity(workload: Workload, capacity_gb: float) -> Workload:
    """`workload` on GPUs with `capacity_gb` usable (usable_capacity)."""
    return replace(workload, cluster=replace(workload.cluster, memory_gb=float(capacity_gb)))


def usable_workload(workload: Workload, said: list[float]) -> tuple[Workload, tuple[float, int, float] | None]:
    """`workload` on the GPUs the OOMs `said` (said_capacities) it has, and why: (that workload, (its usable GB,
    how many said it, the file's GB)) where usable_capacity lowers the capacity; else (`workload`, None). What
    `best` and the guided searcher compare every p_fit with."""
    cap = workload.cluster.memory_gb
    usable = usable_capacity(said, cap, workload.cluster.memory_reserved_gb)
    return (with_capacity(workload, usable[0]), (*usable, cap)) if usable else (workload, None)


def activation_account(layout: Layout) -> tuple:
    """What sets the bytes a layer keeps per token (tuner.perfmodel.memory): tp and sequence parallelism,
    context parallelism, the recompute mode and the expert split. Not dp or the ZeRO stage (model state), the
    pipeline depth or schedule (how many layers and passes are in flight) nor the micro-batch (the tokens)."""
    return (layout.tp, layout.sequence_parallel, layout.context_parallel, layout.recompute,
            layout.expert_parallel, layout.expert_tensor_parallel)


def oom_bounds(records, workload: Workload, gp, studies: dict | None = None, peaks=None) -> list[OomBound]:
    """The measured OOMs of `workload`'s model, cluster and framework at any node count (the evidence
    `warm_start_records` uses), each with what the memory correction `gp` believes of its peak on a GPU -- the
    caching allocator's share on top (ALLOCATOR_BIAS, ALLOCATOR_SD), as every p_fit states it. An OOM'd layout was
    never measured: where no ok run of its activation account was either (the bytes a layer keeps per token:
    activation_account), that belief is taken as no surer than the framework's memory error (its sd); where one was,
    the correction rests on a measurement of what the OOM'd layout's activations are, and its own belief stands
    (issue 30 round 30: on a 22B study the floor held the dp-4 twin of an OOM'd first pick at p_fit 0.7 beside a
    measured run of its account; where round 29 dropped the floor everywhere, a 2N pick ran out of memory under an
    OOM whose account no run had measured, which keeps the floor). With `peaks` (Observations.peaks_gp), an OOM those
    measured peaks already put out of memory (expected_oom) bounds nothing: it tells nothing they did not, and the
    memory correction (which holds it as a lower bound) speaks for its kin (issue 30 round 47)."""
    from tuner.frameworks import of

    cap, out, floor = workload.cluster.memory_gb, [], of(workload).memory_sd
    factors = measured_factors(records, workload, studies)
    for rec in records or ():
        if rec.status != Status.OOM or left_out(rec, workload, studies):
            continue
        w = record_workload(rec, workload, studies)
        if rec.layout.gpus != w.gpus:
            continue
        p = predict(rec.layout, w)
        ft = features(rec.layout, w, p)
        if peaks is not None and expected_oom(peaks, ft, math.log(cap / p.memory_gb)):
            continue
        mu, sd = gp.predict(ft.z[None, :], ft.fm[None, :])
        act = p.memory_breakdown.get("activations", 0.0)
        shares = [s for lay, _, s in factors if activation_account(lay) == activation_account(rec.layout)]
        out.append(OomBound(rec.layout, int(rec.nodes), p.memory_gb, act, math.log(cap / p.memory_gb),
                            float(mu[0]) + ALLOCATOR_BIAS,
                            max(math.hypot(float(sd[0]), ALLOCATOR_SD), 0.0 if shares else floor),
                            _refuted_by(rec.layout, p.memory_gb - act, act, factors, cap),
                            (min(shares), max(shares)) if shares else (1.0,)))
    return out


def expected_oom(peaks, ft, bound: float) -> bool:
    """Whether the memory correction of the measured peaks alone (`peaks`) put an OOM'd layout (its features `ft`,
    log(capacity / predicted) `bound`) out of memory more likely than not: then the OOM tells nothing they did not."""
    mu, sd = peaks.predict(ft.z[None, :], ft.fm[None, :])
    return _ndtr((bound - float(mu[0]) - ALLOCATOR_BIAS) / math.hypot(float(sd[0]), ALLOCATOR_SD)) < 0.5


def measured_factors(records, workload: Workload, studies: dict | None = None) -> list[tuple[Layout, float, float]]:
    """(layout, k, share) of each measured ok run of the evidence `oom_bounds` reads: k the factor its measured need
    (tuner.perfmodel.fit.trial_need_gb) puts on its predicted activations over the predicted (exact) rest; share
    that need over what its allocated peak alone needed (measured_need_gb): the caching allocator's share of the
    run where its runner read the reserved peak, 1 where not."""
    out = []
    for rec in records or ():
        if rec.status != Status.OK or not rec.peak_memory_gb or left_out(rec, workload, studies):
            continue
        w = record_workload(rec, workload, studies)
        if rec.layout.gpus != w.gpus:
            continue
        p = predict(rec.layout, w)
        act = p.memory_breakdown.get("activations", 0.0)
        if act > 0.0:
            need = trial_need_gb(rec, w.cluster.memory_reserved_gb)
            share = need / max(measured_need_gb(rec.peak_memory_gb, w.cluster.memory_reserved_gb), 1e-9)
            out.append((rec.layout, (need - (p.memory_gb - act)) / act, share))
    return out


def _refuted_by(layout: Layout, rest_gb: float, act_gb: float, factors: list, capacity_gb: float) -> Layout | None:
    """A measured ok layout of `layout`'s activation account whose factor k says the OOM'd layout needed
    rest + k act, short of the capacity by more than a GPU run's spread (the allocator's share and run-to-run
    noise, one-sided 95 %): then one factor on the account does not explain both, so the OOM says nothing of the
    account's other layouts (issue 30) -- only of its twins."""
    room = math.exp(-Z95 * math.hypot(ALLOCATOR_SD, MEMORY_NOISE_SD)) * capacity_gb
    for lay, k, _ in factors:
        if activation_account(lay) == activation_account(layout) and rest_gb + k * act_gb < room:
            return lay
    return None


Z95 = 1.645          # one-sided 95 % bound of a normal


def _ndtr(z: float) -> float:
    return 0.5 * math.erfc(-z / math.sqrt(2.0))


def room_gb(pred, b: OomBound, capacity_gb: float) -> float | None:
    """The most the OOM'd layout `b` can have needed for `pred`'s layout to fit (None: not comparable). With
    their activations off by one factor k over an exact rest S (S = total - activations), the OOM says
    S_oom + k A_oom > capacity and the layout fits iff S + k A <= capacity, i.e. iff the OOM'd layout needed
    at most S_oom + A_oom (capacity - S) / A; a twin (A = A_oom): capacity + its total less the layout's.
    Where its account's ok runs read the caching allocator's reserved peak, the share s that peak adds to the
    allocated one (measured_factors) is the allocator's, on every byte, not the activations' (issue 30 item 3: in
    a benchmark world's 175B study, not a measurement, reserved peaks 1.36x allocated ones whose activations were as
    predicted had read as activations 2.19x the model's):
    both then need s times their allocated bytes, and the OOM'd layout at most s S_oom + A_oom (capacity - s S) / A;
    the least room over the shares measured (today's rule at s = 1, where none was)."""
    if activation_account(b.layout) != activation_account(pred.layout):
        return None
    if b.refuted_by is not None and replace(b.layout, dp=1, zero_stage=0) != replace(pred.layout, dp=1, zero_stage=0):
        return None          # a measured run of the account refutes one factor on it: the OOM bounds its twins only
    act = pred.memory_breakdown.get("activations", 0.0)
    if b.act_gb <= 0.0 or act <= 0.0:
        return None
    rest = pred.memory_gb - act
    return min(s * (b.total_gb - b.act_gb) + b.act_gb * (capacity_gb - s * rest) / act for s in b.shares)


def fit_given_oom(b: OomBound, log_room: float) -> float:
    """P(the OOM'd layout `b` needed at most exp(`log_room`) times its predicted peak | it needed more than the
    capacity). Its log need is a mixture: the memory correction's belief N(b.mean, b.sd) and, with weight
    ALLOCATOR_TAIL_WEIGHT, the heavy tail the published OOM messages show (ALLOCATOR_TAIL_SD about the same mean). An
    OOM the belief explains stays with the belief; one it calls a far surprise (many sd beyond its mean: the account
    misses something there) is the tail's, and its need is spread far above the capacity rather than just over it
    (issue 30: a 2N pick that was an OOM'd layout at twice the dp, its need 1.26x what the belief allowed, ran out
    again)."""
    parts = ((1.0 - ALLOCATOR_TAIL_WEIGHT, b.sd), (ALLOCATOR_TAIL_WEIGHT, math.hypot(b.sd, ALLOCATOR_TAIL_SD)))
    over = [(w, sd, _ndtr((b.mean - b.bound) / sd)) for w, sd in parts]    # survival at the bound, no cancellation
    inside = sum(w * max(s - _ndtr((b.mean - log_room) / sd), 0.0) for w, sd, s in over)
    return min(inside / max(sum(w * s for w, _, s in over), 1e-300), 1.0)


def oom_fit_cap(pred, bounds: list[OomBound], capacity_gb: float) -> tuple[float, str | None]:
    """The probability that a layout (its Prediction) fits as far as the OOMs say, and the OOM that limits it:
    for each OOM'd layout with the same activation account, the memory correction's belief that it needed at
    most `room_gb`, given that it needed more than the capacity."""
    best, why = 1.0, None
    for b in bounds:
        room = room_gb(pred, b, capacity_gb)
        if room is None:
            continue
        p = 0.0 if room <= capacity_gb else fit_given_oom(b, math.log(room / b.total_gb))
        if p < best:
            twin = replace(b.layout, dp=1, zero_stage=0) == replace(pred.layout, dp=1, zero_stage=0)
            best, why = p, (f"{'its twin ' if twin else ''}{b.layout.key()} ran out of memory at {b.nodes} node(s)"
                            + ("" if twin else " with the same activation account (tp, cp, recompute)"))
    return best, why
