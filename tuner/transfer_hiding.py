"""The overlap an answer at an unmeasured node count rests on (issue 30 round 44). Pure.

The model hides a collective under compute wholly until it outlasts that compute: Megatron-FSDP's and FSDP2's per-layer
gathers under the neighbouring layer (tuner.perfmodel.fsdp_time), the distributed optimizer's gradient reduce under the
last backward. A measured trial tests that assumption only as far as its own step hid: a study whose trials hid at
most a third of their step under compute says nothing of a layout the model lets hide two thirds -- the ZeRO-3 layout
at twice the nodes with half the micro-batch, whose gathers the model still hides where the world exposes them. So
`best` at a node count nobody measured (tuner.best.fastest_unmeasured) ranks each layout as if the share of its step
that it hides beyond the most any measured trial hid showed in full (by_verified_hiding): the step that much longer.
Only the order moves; the stated speed, interval and p_fit stay. No constant is chosen: the reference is the study's
own largest measured share. Where nothing was measured, or the framework hides nothing (Megatron-DeepSpeed), the
order is the corrected speed's. And a ZeRO-3 layout gives way to its ZeRO-2 sibling where that keeps the memory headroom
(less_work_first): the gathers are all stage 3 adds to stage 2's step; so does an offloaded layout to its sibling
offloading fewer layers.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import replace

from tuner.correction import left_out, record_workload
from tuner.layout import Layout, micro_batches_per_pipeline, why_invalid
from tuner.perfmodel import _NO_COMPUTE, _gradient_sync, framework_as_run, memory, predict
from tuner.perfmodel.stages import overlaps_of
from tuner.specs import Workload
from tuner.trial import Status


def hidden_sync_share(layout: Layout, workload: Workload, pred=None, memo: dict | None = None) -> float:
    """The share of `layout`'s predicted step (`pred`, predict's) that the model hides of its gradient sync under
    compute: the data-parallel / ZeRO / FSDP collectives' seconds with no compute to hide under (the model's own
    gradient sync of the stage holding the most parameters, as predict takes them) less the seconds its breakdown shows
    (dp_*), over the step. 0 where the framework overlaps nothing (Megatron-DeepSpeed). `memo`: predict's, kept for
    one workload's layouts."""
    pred = pred or predict(layout, workload, memo=memo)
    m = micro_batches_per_pipeline(layout, workload.global_batch)
    bare = _gradient_sync(layout, workload, framework_as_run(workload, None), dict(_NO_COMPUTE), m,
                          *memory.largest_stage_params(workload.model, layout), overlaps_of(workload, None))
    shown = sum(v for k, v in pred.time_breakdown.items() if k.startswith("dp_"))
    return max(0.0, bare["grad_reduce"] + bare["param_gather"] - shown) / max(pred.step_time_s, 1e-12)


def measured_hiding(records, workload: Workload, studies: dict | None = None) -> tuple[float, Workload] | None:
    """The largest share of its step any measured ok trial of `workload`'s model, cluster and framework hid under
    compute (hidden_sync_share, in the workload it ran: record_workload), among those at the measured node count
    nearest `workload`'s (the smaller at a tie), and that node count's workload; None where nothing was measured."""
    ok = [r for r in records or () if r.status == Status.OK and r.mfu and not left_out(r, workload, studies)]
    ran = [(r.layout, record_workload(r, workload, studies)) for r in ok]
    ran = [(lay, w) for lay, w in ran if lay.gpus == w.gpus]
    if not ran:
        return None
    nodes = min({w.nodes for _, w in ran}, key=lambda n: (abs(math.log(n / workload.nodes)), n))
    there = [(lay, w) for lay, w in ran if w.nodes == nodes]
    return max(hidden_sync_share(lay, w) for lay, w in there), there[0][1]


def unverified_hiding(layout: Layout, workload: Workload, measured: tuple[float, Workload],
                      memo: dict | None = None) -> float:
    """How much more of its step `layout` hides of its gradient sync at the measured node count (the same layout with
    its dp scaled to that node count's GPUs: a measured trial's twin is that trial) than any measured trial there hid
    (measured_hiding): a share no measurement has shown the model's overlap to hold. 0 where the layout has no such
    counterpart there. `memo`: predict's, kept for the measured node count's layouts."""
    most, w = measured
    dp = layout.dp * w.gpus / workload.gpus
    if dp < 1 or dp != int(dp):
        return 0.0
    there = replace(layout, dp=int(dp))
    if why_invalid(there, w):
        return 0.0
    return max(0.0, hidden_sync_share(there, w, memo=memo) - most)


def by_verified_hiding(rows: list[dict], workload: Workload, measured: tuple[float, Workload] | None,
                       k: int) -> list[dict]:
    """The first k of `rows` (tuner.best.corrected's, likely to fit), those keeping the memory headroom first, each
    group by corrected speed over 1 + its unverified hiding (the step that share longer), then fewer layers offloaded
    and the smaller peak (tuner.best.fastest_unmeasured's ties). `measured`: measured_hiding's answer (None: the
    corrected order). Rows are visited fastest first, only until none left can rank among the k."""
    def ties(r: dict) -> tuple:
        return r["layout"].offload_layers, r["memory_gb"]

    out: list[dict] = []
    memo: dict = {}
    for keep in (True, False):
        need = k - len(out)
        if need <= 0:
            break
        group = sorted((r for r in rows if r["headroom_ok"] == keep), key=lambda r: (-_speed(r), *ties(r)))
        if measured is None:
            out += group[:need]
            continue
        worst: list[tuple] = []     # the `need` best so far, negated: worst[0] the worst of them (later ones lose ties)
        for i, r in enumerate(group):  # a score is at least -log(mfu): none after this one can rank among the first
            if len(worst) >= need and -math.log(_speed(r)) > -worst[0][0]:
                break
            score = -(math.log(_speed(r)) - math.log1p(unverified_hiding(r["layout"], workload, measured, memo)))
            entry = (-score, *(-x for x in ties(r)), -i)
            (heapq.heappush if len(worst) < need else heapq.heappushpop)(worst, entry)
        out += [group[-e[-1]] for e in sorted(worst, reverse=True)]
    return out


def less_work_first(rows: list[dict]) -> list[dict]:
    """`rows` (tuner.best.corrected's) without each layout that has a sibling among them doing strictly less of the same
    work and keeping the memory headroom, each such sibling ranked (its "rank_mfu") at the fastest corrected speed of
    itself and the layouts it stands for; the stated speeds stay. The siblings (the same layout otherwise): stage 2 for
    stage 3, which runs stage 2's step, collectives and all, and gathers the parameters for every micro-batch besides
    (DeepSpeed ZeRO-3, FSDP's full shard against SHARD_GRAD_OP, Megatron-FSDP's optim_grads_params against
    optim_grads); fewer layers' activations offloaded to the host, whose copies only add to the step. Neither is ever
    the slower, and the memory the heavier layout saves is what the sibling does not need. The correction can still put
    the heavier one ahead -- it carries a ZeRO-3 trial's residual to the ZeRO-3 layouts alone (tuner.correction's
    ZERO_COORD), an offloaded trial's along the offloading coordinate -- where what the model hides shows at the new
    node count (issue 30 round 45). Heavier layouts go first, so a chain (ZeRO-3 offloading 36 layers, then 24, then
    ZeRO-2) carries the fastest speed down to the lightest sibling that keeps the headroom."""
    keep = {r["layout"]: r for r in rows if r["headroom_ok"]}
    by_base: dict[Layout, list[Layout]] = {}
    for lay in keep:
        by_base.setdefault(replace(lay, offload_layers=0), []).append(lay)

    def lighter(lay: Layout) -> list[Layout]:
        out = [o for o in by_base.get(replace(lay, offload_layers=0), ()) if o.offload_layers < lay.offload_layers]
        stage2 = replace(lay, zero_stage=2)
        return out + ([stage2] if lay.zero_stage == 3 and stage2 in keep else [])

    lifted: dict[Layout, float] = {}
    dropped = set()
    for r in sorted(rows, key=lambda r: (-(r["layout"].zero_stage == 3), -r["layout"].offload_layers)):
        siblings = lighter(r["layout"])
        if siblings:
            dropped.add(r["layout"])
            speed = lifted.get(r["layout"], r["mfu"])
            for o in siblings:
                lifted[o] = max(lifted.get(o, keep[o]["mfu"]), speed)
    return [dict(r, rank_mfu=lifted[r["layout"]]) if r["layout"] in lifted else r for r in rows
            if r["layout"] not in dropped]


def _speed(row: dict) -> float:
    """The corrected speed a row ranks by: its own, or the faster sibling's it stands for (less_work_first)."""
    return row.get("rank_mfu", row["mfu"])
