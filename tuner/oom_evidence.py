"""What a measured OOM says about other layouts (issue 24): it is a lower bound on the layout's peak, and its
twins -- the same layout at another dp or ZeRO stage, with the same activations -- need its true peak less
the model state they save. `best` caps the probability that a twin fits by the chance that the OOM was over
by less than that (the memory correction's belief about the OOM'd layout, given that it did not fit).

Pure (no I/O): stored trials in, bounds and probabilities out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from tuner.correction import _left_out, _record_workload, features
from tuner.layout import Layout
from tuner.perfmodel import MEMORY_NOISE_SD, predict
from tuner.specs import Workload
from tuner.trial import Status


@dataclass(frozen=True)
class OomBound:
    """A measured OOM as a bound on its twins: its layout and node count, its predicted peak (GB), the
    capacity it exceeded as log(capacity / predicted), and the memory correction's belief about its
    log(true / predicted) before the OOM is known (mean, sd)."""

    layout: Layout
    nodes: int
    total_gb: float
    bound: float
    mean: float
    sd: float


def _activation_shape(layout: Layout) -> Layout:
    """The layout with what changes only the model state's sharding (dp, ZeRO stage) taken out."""
    return replace(layout, dp=1, zero_stage=0)


def oom_bounds(records, workload: Workload, gp, studies: dict | None = None) -> list[OomBound]:
    """The measured OOMs of `workload`'s model, cluster and framework at any node count (the evidence
    `warm_start_records` uses), each with what the memory correction `gp` believes of its peak. An OOM'd
    layout was never measured: that belief is taken as no surer than the framework's memory error (its sd)."""
    from tuner.frameworks import of

    cap, out, floor = workload.cluster.memory_gb, [], of(workload).memory_sd
    for rec in records or ():
        if rec.status != Status.OOM or _left_out(rec, workload, studies):
            continue
        w = _record_workload(rec, workload, studies)
        if rec.layout.gpus != w.gpus:
            continue
        p = predict(rec.layout, w)
        ft = features(rec.layout, w, p)
        mu, sd = gp.predict(ft.z[None, :], ft.fm[None, :])
        out.append(OomBound(rec.layout, int(rec.nodes), p.memory_gb, math.log(cap / p.memory_gb), float(mu[0]),
                            max(math.hypot(float(sd[0]), MEMORY_NOISE_SD), floor)))
    return out


def _ndtr(z: float) -> float:
    return 0.5 * math.erfc(-z / math.sqrt(2.0))


def oom_fit_cap(pred, bounds: list[OomBound], capacity_gb: float) -> tuple[float, str | None]:
    """The probability that a layout (its Prediction) fits as far as the OOMs say, and the OOM that limits it.
    A twin of an OOM'd layout (the same layout but for dp and the ZeRO stage: the same activations, other
    model-state shards) needs that layout's true peak less the model state it saves, so it fits only if the
    OOM'd layout needed less than capacity plus the difference of their predicted peaks: the memory
    correction's belief about that layout, given that it needed more than the capacity."""
    best, why, shape = 1.0, None, _activation_shape(pred.layout)
    for b in bounds:
        if _activation_shape(b.layout) != shape:
            continue
        room = capacity_gb + b.total_gb - pred.memory_gb
        if room <= capacity_gb:
            p = 0.0
        else:
            over = 1.0 - _ndtr((b.bound - b.mean) / b.sd)
            p = max(_ndtr((math.log(room / b.total_gb) - b.mean) / b.sd) - (1.0 - over), 0.0) / max(over, 1e-12)
        if p < best:
            best, why = p, f"its twin {b.layout.key()} ran out of memory at {b.nodes} node(s)"
    return best, why
