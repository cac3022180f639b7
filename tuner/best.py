"""Best layouts for a model, cluster and node count: measured where the store has them, corrected
predictions otherwise. The application layer `tuner best`, `tuner launch` and notebooks call (`best`).

`best_for_unmeasured` (pure) answers "best layout for N nodes" where N was never measured (and `plan` /
`launch` without trials use the same memory rule): the performance model corrected by every stored
measurement of the same model, cluster and framework at other node counts (tuner/correction.py), ranked by
corrected MFU (samples/s for the workload's global batch), the hiding under compute no measured trial verified counted
as shown (tuner/transfer_hiding.py). A simulated trial is the model's own prediction:
it never corrects the model, so simulator studies leave this answer exactly as an empty store gives it.
At a node count that has stored trials, measured ones answer; simulated ones only where nothing was
measured (and `tuner best` says so).

An answer nobody measured must fit: a layout is recommended first only if it fits with probability
>= RECOMMEND_AT (0.95), the probability from the framework's measured memory error (its log-sd,
tuner.frameworks) as the memory correction's prior, narrowed as measured peaks and OOMs of this model
and cluster come in. Layouts less likely to fit come after.
"""

from __future__ import annotations

import math
import sys
import types
from dataclasses import dataclass, replace

import numpy as np

from tuner import metrics
from tuner.errors import UsageError
from tuner.metrics import trial_rank_key
from tuner.layout import Layout
from tuner.frameworks import ALLOCATOR_BIAS, ALLOCATOR_SD, of as framework_of, runnable
from tuner.perfmodel import MEMORY_NOISE_SD, RECOMMEND_AT, gpu_fit_probability, memory_fit, predict
from tuner.perfmodel.communicators import new_dp_group_gb
from tuner.perfmodel.fit import fit_probability, trial_need_gb
from tuner.fit_nodes import more_nodes_hint
from tuner.search import STUDY_DEFAULTS
from tuner.space_offload import RESCUE_BELOW, unoffered_twins
from tuner.specs import STORED_SETTINGS, Workload, stored_setting
from tuner.correction import (Z_DIM, Observations, features, left_out, memory_features, record_workload, simulated,
                              warm_start_records)
from tuner.oom_evidence import oom_bounds, oom_fit_cap, outside_gb, said_capacities, said_outside, usable_workload
from tuner.transfer_hiding import by_verified_hiding, less_work_first, measured_hiding
from tuner.trial import Status

Z90 = 1.645           # two-sided 90 % interval / one-sided 95 % bound of a normal
STALE_MARGIN = 64     # more stored trials asked for than answered: some may be refused by their framework


def require_fit(preds, workload: Workload, space=None) -> None:
    """Refuse a workload none of whose valid layouts (predictions) fits in memory, naming the smallest and
    the fewest nodes at which one of `space`'s layouts fits (tuner.fit_nodes)."""
    if not any(p.fits for p in preds):
        least = min(preds, key=lambda p: p.memory_gb)
        fix = ("use a model sized for this machine (tiny, small, llama3-tiny: llama3-8b's architecture at CPU "
               "size)" if workload.cluster.name.startswith("local") else more_nodes_hint(workload, space))
        raise UsageError(f"none of {len(preds)} valid layouts fits in {workload.cluster.memory_gb:.1f} GB per GPU "
                         f"(smallest needs {least.memory_gb:.1f} GB: {least.layout.key()}); {fix}")


def corrected(layouts: list[Layout], workload: Workload, obs: Observations, preds=None, bounds=(),
              support=None, twin_gb=None, memory=None) -> list[dict]:
    """For each layout: raw and corrected MFU and memory, the residual's uncertainty, the probability
    that it fits in memory (at most what the measured OOMs, `bounds`, leave it: oom_evidence.oom_fit_cap;
    at least what a measured twin at fewer GPUs, `support` (twin_support), says) and whether it keeps the
    memory headroom. `twin_gb` (a stored trial -> the model's GB for it in its own workload; twin_predictions):
    a twin at another dp then supports its layout with the model's difference between them (twin_delta). `memory`: the
    memory correction of `obs` where the caller holds it (obs.memory_gp), not fitted again."""
    memo: dict = {}                 # sub-results the layouts of one workload share (tuner.perfmodel.predict)
    preds = preds or [predict(lay, workload, memo=memo) for lay in layouts]
    fts = [features(lay, workload, p) for lay, p in zip(layouts, preds)]
    Z, F, FM = (np.array([getattr(f, a) for f in fts]) for a in ("z", "f", "fm"))
    mu, sd = obs.time_gp().predict(Z, F)
    sd = np.hypot(sd, obs.far_sd(Z))            # wider away from every measured layout (issue 30)
    mmu, msd = (memory or obs.memory_gp(framework_of(workload).memory_sd)).predict(Z, FM)
    msd = np.hypot(msd, obs.memory_far_sd(Z))   # and so is its memory (correction.memory_far_sd)
    cap = workload.cluster.memory_gb
    out = []
    for i, (lay, p, ft) in enumerate(zip(layouts, preds, fts)):
        mem = math.exp(ft.log_mem + mmu[i])
        p_oom, limited_by = oom_fit_cap(p, bounds, cap)
        p_fit = min(_p_fit(ft.log_mem, mmu[i], msd[i], cap) if obs.my or obs.oy else p.p_fit, p_oom)  # no peak: prior
        delta = twin_delta(lay, p.memory_gb, float(msd[i]), twin_gb) if twin_gb else None
        p_twin, supported_by = supported_fit(lay, support or {}, cap, workload.cluster.memory_reserved_gb, delta)
        if p_twin > p_fit:
            p_fit, limited_by = p_twin, None
        out.append({"layout": lay, "raw": p, "log_mean": ft.log_pred + mu[i], "log_sd": float(sd[i]),
                    "mfu": math.exp(ft.log_pred + mu[i]), "memory_gb": mem, "p_fit": p_fit,
                    "headroom_ok": p_fit >= RECOMMEND_AT, "limited_by": limited_by, "supported_by": supported_by})
    return out


def _p_fit(log_mem: float, mean: float, sd: float, cap: float) -> float:
    """P(fits) of a layout predicted at exp(log_mem) GB whose log error the memory correction puts at (mean, sd),
    with the caching allocator's share on top, as `predict` states p_fit (tuner.perfmodel.gpu_fit_probability)."""
    z = (math.log(cap) - log_mem - mean - ALLOCATOR_BIAS) / math.hypot(sd, ALLOCATOR_SD)
    return 0.5 * math.erfc(-z / math.sqrt(2))


def twin_support(records, workload: Workload, studies: dict | None = None) -> dict[Layout, list]:
    """The measured peaks that bound layouts of `workload` from above (issue 30): its stored ok trials of the
    same model, cluster, framework, precision and optimizer moments at fewer GPUs, keyed by the layout at dp 1.
    A layout that is such a trial with dp multiplied (the same tp, cp, pp, split, experts, micro-batch, ZeRO
    stage and recompute) keeps the same activations and at most as many micro-batches in flight -- when its global
    batch per GPU is at most the trial's (else each replica runs more micro-batches, and a pipeline holds more of
    them) -- and ZeRO shards its state over more ranks: it needs at most the trial's measured peak."""
    moments = workload.optimizer_moments or STORED_SETTINGS["optimizer_moments"]
    out: dict[Layout, list] = {}
    for rec in records or ():
        if rec.status != Status.OK or not rec.peak_memory_gb or left_out(rec, workload, studies):
            continue
        w = record_workload(rec, workload, studies)
        st = (studies or {}).get(getattr(rec, "study", None))
        if (w.precision != workload.precision or rec.layout.gpus != w.gpus or rec.layout.gpus >= workload.gpus
                or workload.global_batch * w.gpus > w.global_batch * workload.gpus     # more micro-batches a replica
                or (st is not None and stored_setting(st.workload, "optimizer_moments") != moments)):
            continue
        out.setdefault(replace(rec.layout, dp=1), []).append(rec)
    return out


def twin_predictions(workload: Workload, studies: dict | None = None):
    """A stored trial -> the model's predicted GB for its layout in the workload it ran (record_workload), kept."""
    memo: dict = {}

    def twin_gb(rec) -> float:
        w = record_workload(rec, workload, studies)
        key = (rec.layout, w.nodes, w.global_batch, w.precision, w.framework)
        if key not in memo:
            memo[key] = predict(rec.layout, w).memory_gb
        return memo[key]
    return twin_gb


def supported_fit(layout: Layout, support: dict, cap: float, reserve_gb: float,
                  delta=None) -> tuple[float, str | None]:
    """The probability that `layout` fits by its measured twins (`support`, twin_support): that the smallest
    measured peak among them, measured again on a GPU, stays within `cap` -- its run-to-run noise (MEMORY_NOISE_SD)
    and the caching allocator's share of that run (gpu_fit_probability: ALLOCATOR_SD, ALLOCATOR_BIAS), since a
    GPU run's measured peak is the bytes its tensors allocated (every runner's max_memory_allocated), to which the
    cluster's fixed reserve `reserve_gb` is added as every prediction has it (measured_need_gb) -- and which twin
    says so; (0, None) without one. A twin whose runner read its caching allocator's reserved peak (the trial's
    extra) needs the larger of that plus the reserve and its allocated need (trial_need_gb), and only its
    run-to-run noise is left: that peak already holds the twin's own fragmentation, so the allocator's share is
    not counted twice (issue 24 round 7). `delta` (twin_delta; None: nothing): a twin at another dp is moved by
    what the layout needs beyond it, (GB, its sd in GB); a twin at the same dp keeps its peak (issue 30 item 3)."""
    twins = [r for r in support.get(replace(layout, dp=1), ()) if layout.dp % r.layout.dp == 0]
    if not twins:
        return 0.0, None
    moved = {id(r): (0.0, 0.0) if delta is None or r.layout.dp == layout.dp else delta(r) for r in twins}
    rec = min(twins, key=lambda r: trial_need_gb(r, reserve_gb) + moved[id(r)][0])
    diff, diff_sd = moved[id(rec)]
    need = max(trial_need_gb(rec, reserve_gb) + diff, 1e-6)
    sd = math.hypot(MEMORY_NOISE_SD, diff_sd / need)   # log-sd: the twin's noise and the difference's error
    said = (f"its twin {rec.layout.key()} ran at {rec.nodes} node(s) with a measured peak of "
            f"{rec.peak_memory_gb:.1f} GB allocated" + (f", {diff:+.2f} GB at dp {layout.dp}" if diff else ""))
    reserved = getattr(rec, "peak_reserved_gb", None)
    if reserved is None:
        return gpu_fit_probability(need, cap, sd), said
    # its reserved peak holds the twin's own fragmentation: only its run-to-run noise is left (issue 24 round 7)
    return fit_probability(need, cap, sd), said + f", {reserved:.1f} GB reserved"


def twin_delta(layout: Layout, pred_gb: float, log_sd: float, twin_gb) -> callable:
    """supported_fit's `delta` for `layout` predicted at `pred_gb`: what it needs beyond a measured twin at another
    dp -- the model's predicted difference (pred(layout) - `twin_gb`(twin), the twin predicted in its own workload:
    negative where ZeRO shards more) plus the NCCL buffers of its larger data-parallel communicator, outside every
    measured peak (tuner.perfmodel.communicators) -- with an sd of that difference's size times `log_sd`, the memory
    model's log error at the layout (the memory correction's: the framework's account prior, narrowed or widened by
    measured peaks)."""
    def delta(rec) -> tuple[float, float]:
        diff = pred_gb - twin_gb(rec) + new_dp_group_gb(rec.layout.dp, layout.dp)
        return diff, abs(diff) * log_sd
    return delta


def likely_to_fit(layouts: list[Layout], workload: Workload, gp) -> list:
    """The predictions of the layouts `corrected` gives p_fit >= 0.5 under a memory correction `gp` that has no
    data (its answer reads the memory shares alone) and no OOM bound, chosen by each layout's memory before any
    step time is predicted."""
    memo: dict = {}
    fitted = [memory_fit(lay, workload, memo) for lay in layouts]
    logs = [math.log(max(f[3]["total"], 1e-6)) for f in fitted]          # as features() reads the Prediction
    fms = [memory_features({k: v for k, v in f[3].items() if k not in ("total", "params_billion")}, lay.recompute,
                           lay.zero_stage)
           for lay, f in zip(layouts, fitted)]
    mmu, msd = gp.predict(np.zeros((len(layouts), Z_DIM)), np.array(fms))
    cap = workload.cluster.memory_gb
    return [predict(lay, workload, memo=memo, fitted=fitted[i]) for i, lay in enumerate(layouts)
            if _p_fit(logs[i], mmu[i], msd[i], cap) >= 0.5]


def _evidence(ws, workload: Workload, studies: dict | None, usable: tuple | None = None) -> dict:
    """What the answer rests on; `usable` (GB, n, the file's GB): the OOMs' usable capacity (usable_capacity)."""
    ev = dict(ws.evidence, usable_memory_gb=usable[0] if usable else None)
    other_gb = sorted({int(st.global_batch) for name, st in (studies or {}).items() if name in ev["studies"]
                       and int(st.global_batch) != workload.global_batch})
    notes = [f"corrected by measurements at other node counts ({ev['node_counts']})" if ev["ok_trials"]
             else "no stored measurements of this model and cluster: the model alone"]
    if ev.get("simulated_trials"):
        notes.append(f"{ev['simulated_trials']} simulated trial(s) left out (the model's own predictions, not "
                     "measurements)")
    if ev.get("other_framework_trials"):
        notes.append(f"{ev['other_framework_trials']} trial(s) of other frameworks left out (a measurement corrects "
                     f"{workload.framework}'s predictions only if it ran on {workload.framework})")
    if usable:
        notes.append(f"{usable[0]:.1f} GB usable per GPU, {_usable_words(usable)}: in use + free")
    if other_gb:
        notes.append(f"studies at global batch {', '.join(map(str, other_gb))} used as evidence only; the answer is "
                     f"for global batch {workload.global_batch}")
    return dict(ev, global_batch=workload.global_batch, other_global_batches=other_gb, note="; ".join(notes))


def answer(row: dict, workload: Workload, evidence: dict) -> dict:
    """One predicted recommendation: layout, speed (MFU, samples/s, a 90 % interval), Megatron's count,
    memory against capacity and the margin kept."""
    lay, cap = row["layout"], workload.cluster.memory_gb
    sps = row["mfu"] / metrics.mfu(1.0, workload)
    lo, hi = (sps * math.exp(s * Z90 * row["log_sd"]) for s in (-1, 1))
    fig = metrics.figures(sps, workload, lay)
    return {"layout": lay, "key": lay.key(), "predicted": True, **fig,
            "samples_per_second_90": [lo, hi], "uncertainty": row["log_sd"],
            "raw_mfu": row["raw"].mfu, "raw_samples_per_second": row["raw"].samples_per_second,
            "raw_peak_fraction": row["raw"].peak_fraction, "raw_tflops_per_gpu": row["raw"].tflops_per_gpu,
            "memory_gb": row["memory_gb"], "raw_memory_gb": row["raw"].memory_gb, "memory_capacity_gb": cap,
            "memory_used_fraction": row["memory_gb"] / cap, "headroom_ok": row["headroom_ok"],
            "p_fit": row["p_fit"], "p_fit_limited_by": row.get("limited_by"), "p_fit_supported_by": row.get("supported_by"),
            "p_fit_basis": framework_of(workload).memory_note(workload), "evidence": evidence}


def unmeasured_rows(workload: Workload, space, records, studies: dict | None = None) -> tuple[
        list[dict], Workload, tuple | None, object, tuple | None]:
    """Every layout of `space` that `best_for_unmeasured` weighs for `workload` (a node count never measured) as
    `corrected` states it (corrected speed, its sd, memory, p_fit), by the stored trials of the same model and
    cluster at other node counts (`studies`: name -> StudyRecord, for their global batch); with the workload on what
    the OOMs' messages said the GPUs hold, those messages' figures (or None), the warm start the rows rest on and the
    most of a step the measured trials hid under compute (transfer_hiding.measured_hiding: None where none ran).
    With no memory data at all, only the layouts likely to fit by memory alone (likely_to_fit; all if none)."""
    from tuner.space import valid_layouts

    layouts = valid_layouts(space, workload)
    # the OOMs' messages: where they say the GPUs hold less than the cluster states, the workload on what they hold
    workload, usable = usable_workload(workload, said_capacities(records, workload, studies))
    ws = warm_start_records(records, workload, studies)
    o, sd = ws.observations, framework_of(workload).memory_sd
    o.outside_gb = outside_gb(said_outside(records, workload, studies))    # what the OOMs said is outside the allocator
    peaks = o.peaks_gp(sd) if o.my else None
    gp = o.memory_gp(sd, peaks)
    bounds = oom_bounds(records, workload, gp, studies, peaks)
    preds = None
    if not bounds and not ws.observations.my and not ws.observations.oy:   # no memory data: p_fit from memory alone
        preds = likely_to_fit(layouts, workload, gp) or None               # (none: all, for the refusal's words)
        layouts = [p.layout for p in preds] if preds else layouts
    support, twin_gb = twin_support(records, workload, studies), twin_predictions(workload, studies)
    rows = corrected(layouts, workload, o, preds, bounds=bounds, support=support, twin_gb=twin_gb, memory=gp)
    rescues = offload_rescues(rows, workload, space) if preds is None else []
    if rescues:                                         # measured memory, the space's offloading rule with it
        rows += corrected(rescues, workload, o, bounds=bounds, support=support, twin_gb=twin_gb, memory=gp)
    return rows, workload, usable, ws, measured_hiding(records, workload, studies)


def offload_rescues(rows: list[dict], workload: Workload, space) -> list[Layout]:
    """The space's offloading rule (tuner.space_offload) with the memory the stored trials measured: every offloaded
    twin, not already weighed, of each layout that surely does not fit by its corrected p_fit
    (space_offload.RESCUE_BELOW). The space gives twins only where the model alone says a layout may not fit; where
    measured peaks and OOMs say the model holds too little (a layout it fits at 57 GB of 64 needs 75), the twin that
    rescues it is what a user runs (issue 30)."""
    have = {r["layout"] for r in rows}
    short = [r["layout"] for r in rows if r["p_fit"] < RESCUE_BELOW]
    return [t for t in unoffered_twins(space, short, workload) if t not in have]


def best_for_unmeasured(workload: Workload, space, records, k: int = 5, studies: dict | None = None) -> list[dict]:
    """The k fastest predicted layouts of `space` for `workload` (a node count never measured), the model
    corrected by the stored trials of the same model and cluster at other node counts (`studies`:
    name -> StudyRecord, for their global batch; unmeasured_rows). Layouts that keep the memory headroom come
    first, each group by corrected speed less the hiding no measurement verified (transfer_hiding). Raises UsageError
    when no layout of the space is valid or likely to fit."""
    return fastest_unmeasured(unmeasured_rows(workload, space, records, studies), space, k, studies)


def fastest_unmeasured(weighed: tuple, space, k: int = 5, studies: dict | None = None) -> list[dict]:
    """best_for_unmeasured's answer from `weighed`, what unmeasured_rows returned for its workload: the k fastest of
    the rows likely to fit (p_fit >= 0.5), those that keep the memory headroom first, each group by corrected speed as
    if the share of its step it hides beyond the most any measured trial hid showed (transfer_hiding.by_verified_hiding;
    issue 30 round 44), a ZeRO-3 layout whose ZeRO-2 sibling keeps the headroom in that sibling's place
    (transfer_hiding.less_work_first, and so an offloaded layout to its sibling offloading fewer layers; round 45);
    UsageError when none is."""
    rows, workload, usable, ws, hiding = weighed
    likely = [r for r in rows if r["p_fit"] >= 0.5]
    if not likely:
        least = min(rows, key=lambda r: r["memory_gb"])
        raise UsageError(f"no valid layout of {workload.model.name} fits on {workload.nodes} node(s) "
                         f"({workload.gpus} GPUs): the smallest needs {least['memory_gb']:.1f} GB per GPU "
                         f"({least['layout'].key()}) of {workload.cluster.memory_gb:.1f}"
                         f"{' usable, ' + _usable_words(usable) if usable else ''}; "
                         f"{more_nodes_hint(workload, space)}")
    # at equal speed the fewer layers offloaded (the copies the model hides under compute are the part it rests on,
    # and they hold the host's memory), then the smaller peak
    ranked = by_verified_hiding(less_work_first(likely), workload, hiding, max(int(k), 1))
    evidence = _evidence(ws, workload, studies, usable)
    out = [answer(r, workload, evidence) for r in ranked]
    riskier = faster_if_it_fits(ranked[:1] + likely, workload)
    if riskier:
        out[0]["faster_if_it_fits"] = riskier
    return out


def faster_if_it_fits(likely: list[dict], workload: Workload) -> dict | None:
    """What one trial would decide: among `likely` (rows that fit with p_fit >= 0.5, the answer first), the fastest one
    short of the memory headroom the answer keeps, where it is predicted faster than the answer by more than the
    study's stop threshold (a gain worth a trial: tuner.search.STUDY_DEFAULTS); None where there is none (or the answer
    itself is short of the headroom). Its p_fit is a probability (benchmarks/fit_reliability.py prints its reliability
    at 2N): the chance that the trial runs."""
    top = likely[0]
    if not top["headroom_ok"]:
        return None
    beyond = top["mfu"] * (1.0 + STUDY_DEFAULTS["stop_threshold"])
    faster = [r for r in likely if not r["headroom_ok"] and r["mfu"] > beyond]
    if not faster:
        return None
    r = max(faster, key=lambda r: r["mfu"])
    return {"key": r["layout"].key(), "layout": r["layout"].as_dict(), "flags": r["layout"].flags(),
            "samples_per_second": r["mfu"] / metrics.mfu(1.0, workload), "faster_by": r["mfu"] / top["mfu"] - 1.0,
            "p_fit": r["p_fit"], "memory_gb": r["memory_gb"], "p_fit_limited_by": r.get("limited_by")}


def _usable_words(usable: tuple) -> str:
    """Why every p_fit compared with `usable` (GB, n, the file's GB) -- 'as 3 out-of-memory message(s) ...'."""
    return (f"as {usable[1]} out-of-memory message(s) of this cluster said the process had (its file states "
            f"{usable[2]:.1f} GB)")


@dataclass
class Answer:
    """`best`'s answer: the fastest stored trials (measured), or else corrected predictions."""

    trials: list            # TrialRecords, fastest first (empty when nothing is stored at this node count)
    predicted: list         # best_for_unmeasured rows when `trials` is empty


def history(store, model: str, cluster: str, exclude: str | None = None) -> tuple[list, dict]:
    """Every stored trial of `model` on `cluster` at any node count, and the studies they belong to (the
    simulated ones and other frameworks' too: correction.warm_start_records leaves them out, and counts
    them in its evidence)."""
    if store is None:
        return [], {}
    studies = {st.name: st for st in store.list_studies()
               if st.model == model and st.cluster == cluster and st.name != exclude}
    return [t for name in studies for t in store.trials(name)], studies


def stored_best(store, workload: Workload, k: int = 1, study: str | None = None) -> list:
    """The k fastest stored trials at `workload`'s node count, global batch, precision, optimizer moments
    and framework that the framework runs; measured ones first: simulated trials (the model's prediction)
    answer only where no study at this node count measured one."""
    args = (workload.model.name, workload.cluster.name, workload.nodes)
    kw = {"k": k + STALE_MARGIN, "global_batch": workload.global_batch, "precision": workload.precision,
          "optimizer_moments": workload.optimizer_moments or STORED_SETTINGS["optimizer_moments"],
          "framework": workload.framework}
    found = runnable(store.best(*args, study=study, **kw), workload)   # one stored before frameworks: refusals
    if study is None and any(simulated(t) for t in found):
        names = [st.name for st in store.list_studies() if (st.model, st.cluster, st.nodes) == args
                 and not simulated(st)]
        measured = sorted((t for name in names for t in store.best(*args, study=name, **kw) if not simulated(t)),
                          key=lambda t: (*trial_rank_key(t), t.study, t.number))
        found = runnable(measured, workload) or found
    return found[:k]


def best(store, workload: Workload, k: int = 1, study: str | None = None, space=None) -> Answer:
    """The k fastest layouts for `workload` (its model, cluster, nodes and global batch): stored trials
    when the store (None: no store) has some (`stored_best`: measured ones first), else the model corrected
    by every stored measurement of the model and cluster in the workload's framework at other node counts,
    global batches or precisions (as residuals of the model, which predicts each in its own). `study`
    limits to one study's trials."""
    found = stored_best(store, workload, k, study) if store is not None else []
    if found or study:
        return Answer(found, [])
    from tuner.space import load_space
    records, studies = history(store, workload.model.name, workload.cluster.name)
    return Answer([], best_for_unmeasured(workload, space or load_space(), records, k=k, studies=studies))


class _CallableModule(types.ModuleType):
    """`tuner.best(...)` is the library's best (tuner.planning.best), also once this module is imported, which
    makes `tuner.best` this module: calling the module calls that function."""

    def __call__(self, *args, **kwargs):
        import tuner                                # the facade: it holds the library's answers (tuner.planning)
        return tuner.answer("best")(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
