"""The model's answers as a library: `tuner.predict`, `tuner.plan`, `tuner.best` and `tuner.scale`, the
commands `tuner predict`, `plan`, `best` and `scale` return as Python objects (dataclasses and pandas
DataFrames), with the same checks and the same words (a UsageError naming the fix). The application
layer: it reads the store (read-only, as the commands do) and never imports tuner.cli; the CLI prints
what these return.

    import tuner
    tuner.predict(model="llama3-70b", nodes=64, cluster="h100", tp=4, pp=4, vp=5, cp=2, micro_batch=1)
    tuner.plan(model="175b", nodes=128, top=5)                     # a DataFrame, best first
    tuner.best(model="175b", nodes=128)                            # measured, or a corrected prediction
    tuner.scale(model="175b", cluster="frontier", nodes="16:512", tokens=3e11).dataframe()
"""

from __future__ import annotations

from dataclasses import dataclass

from tuner.errors import UsageError
from tuner.layout import Layout, flat_layout, validate
from tuner.scale_answer import ScaleResult, answer_scale, scale_request

# ------------------------------------------------------------------------------------ predict / plan


def workload_line(w) -> str:
    """What a prediction is for, as `predict` and `plan` head their answer."""
    return (f"{w.model.name} on {w.nodes} x {w.cluster.name} node(s) = {w.gpus} GPUs, global batch {w.global_batch}, "
            f"{w.precision}, {w.framework} (gradients in {w.gradient_dtype}"
            + (f", Adam's moments in {w.optimizer_moments})" if w.optimizer_moments else ")"))


def prediction_row(p, w) -> dict:
    """mfu_% (model FLOPs) ranks; mgt_* is Megatron's count with recompute, the Frontier study's figure."""
    from tuner.perfmodel import keeps_headroom, risk
    return {**flat_layout(p.layout.as_dict()), "samples_s": p.samples_per_second, "mfu_%": 100 * p.mfu,
            "mgt_tflops": p.tflops_per_gpu, "mgt_peak_%": 100 * p.peak_fraction, "step_s": p.step_time_s,
            "mem_gb": p.memory_gb, "mem_%": 100 * p.memory_gb / w.cluster.memory_gb,
            "p_fit": p.p_fit, "fits": "yes" if keeps_headroom(p, w) else ("maybe" if p.fits else "no"),
            "risk": risk(p, w)}


def complete_layout(given: dict, w) -> Layout:
    """The layout `predict` predicts: the dimensions given, the rest as the framework runs them (its first
    ZeRO stage, sequence parallelism where its TP needs it, experts over TP on torchtitan), dp from the
    GPUs; validated for the workload (UsageError naming the fix)."""
    from tuner.frameworks import of as framework_of
    layout = dict(given)
    fw = framework_of(w)
    layout.setdefault("zero_stage", fw.zero_stages[0])
    if fw.needs_sp(w.model):
        layout.setdefault("sequence_parallel", layout["tp"] > 1)
    if fw.fsdp and w.model.is_moe and layout.get("expert_parallel", 1) == 1:   # torchtitan: experts split over TP
        layout.setdefault("expert_tensor_parallel", layout["tp"])
    if "dp" not in layout:
        n = layout["tp"] * layout.get("context_parallel", 1) * layout["pp"]
        if w.gpus % n:
            raise UsageError(f"tp*cp*pp = {n} does not divide {w.gpus} GPUs ({w.nodes} x {w.cluster.gpus_per_node}), so no "
                             f"--dp fills them: pick --tp, --cp and --pp whose product divides {w.gpus}")
        layout["dp"] = w.gpus // n
    return validate(Layout(**layout), w)


def _workload(model, nodes, cluster, global_batch, seq_length, precision, framework, grad_reduce,
              optimizer_moments=None):
    from tuner.specs import make_workload
    return make_workload(model, nodes, cluster, global_batch, precision, framework, grad_reduce, seq_length,
                         optimizer_moments)


#: Library spellings of the layout's options (cp, vp, sp) beside the dimensions' own names.
LAYOUT_ALIASES = {"cp": "context_parallel", "vp": "virtual_pipeline", "sp": "sequence_parallel",
                  "ep": "expert_parallel", "etp": "expert_tensor_parallel"}


def _layout_options(options: dict) -> dict:
    from tuner.layout import DIMENSIONS
    names = {d.name for d in DIMENSIONS}
    out = {}
    for k, v in options.items():
        name = LAYOUT_ALIASES.get(k, k)
        if name not in names:
            from tuner.study_options import WORKLOAD        # the workload's options, declared once
            raise UsageError(f"unknown option {k!r}: give the workload ({', '.join(o.name for o in WORKLOAD)}) "
                             f"and layout dimensions ({', '.join(sorted(names))})")
        if v is not None:
            out[name] = v
    return out


@dataclass(frozen=True)
class PredictAnswer:
    """`tuner predict`'s answer: the workload, the completed layout and the model's Prediction."""

    workload: object
    layout: Layout
    prediction: object
    p_fit_basis: str

    @property
    def headline(self) -> str:
        return f"{workload_line(self.workload)}, layout {self.layout.key()}"

    def as_dict(self) -> dict:
        return {**self.prediction.as_dict(), "p_fit_basis": self.p_fit_basis}


def predict(model, nodes: int, cluster="frontier", *, global_batch: int | None = None, seq_length: int | None = None,
            precision: str = "bf16", framework: str | None = None, grad_reduce: str | None = None,
            optimizer_moments: str | None = None,
            **layout) -> PredictAnswer:
    """Predict one layout (tp, pp and micro_batch required; the rest as `tuner predict` fills them in)."""
    from tuner.frameworks import of as framework_of
    from tuner.perfmodel import predict as model_predict
    given = _layout_options(layout)
    missing = [d for d in ("tp", "pp", "micro_batch") if d not in given]
    if missing:
        raise UsageError(f"predict needs {', '.join(missing)}: the layout to predict (e.g. tp=4, pp=8, micro_batch=1)")
    w = _workload(model, nodes, cluster, global_batch, seq_length, precision, framework, grad_reduce,
                  optimizer_moments)
    lay = complete_layout(given, w)
    return PredictAnswer(w, lay, model_predict(lay, w), framework_of(w).memory_note(w))


def plan(model, nodes: int, cluster="frontier", *, global_batch: int | None = None, seq_length: int | None = None,
         precision: str = "bf16", framework: str | None = None, grad_reduce: str | None = None,
         optimizer_moments: str | None = None,
         space: str = "default", top: int | None = 10, show_all: bool = False, **pins):
    """Every valid layout ranked by the model (expected speed: samples/s x p_fit), as `tuner plan` lists
    them: a DataFrame, best first, `top` rows (None: all); `df.attrs` holds the workload line and counts.
    Raises UsageError when no layout fits (unless show_all), naming the fewest nodes at which one does."""
    import pandas as pd

    from tuner.best import require_fit
    from tuner.perfmodel.screening import rank_shown
    from tuner.space import load_space, valid_layouts
    w = _workload(model, nodes, cluster, global_batch, seq_length, precision, framework, grad_reduce,
                  optimizer_moments)
    sp = load_space(space).pinned(_layout_options(pins))
    ranking = rank_shown(valid_layouts(sp, w), w, top, show_all)
    if not show_all:
        require_fit(ranking.screened, w, sp)
    df = pd.DataFrame([{"rank": i + 1, **prediction_row(p, w), "layout_key": p.layout.key()}
                       for i, p in enumerate(ranking.shown)])
    df.attrs.update(workload=workload_line(w), valid_layouts=len(ranking.screened), may_fit=ranking.may_fit)
    return df


# ---------------------------------------------------------------------------------------------- best

def stored_reserve_gb(workload: dict | None) -> float:
    """The fixed reserve of a stored study's cluster (its workload as stored), for fit.trial_need_gb."""
    from tuner.cluster_spec import CLUSTER_KEYS
    cluster = (workload or {}).get("cluster") or {}
    return float(cluster.get("memory_reserved_gb", CLUSTER_KEYS["memory_reserved_gb"][1]))


def best_json(t, reserve_gb: float) -> dict:
    """A stored trial as `best` answers it; `simulated`: its numbers are the simulator's (the model's own
    prediction), not a measurement. `memory_gb` is plan's quantity (tuner.perfmodel.fit.trial_need_gb); `peak_memory_gb`
    the runner's allocated peak as read."""
    from tuner.correction import simulated
    from tuner.perfmodel.fit import trial_need_gb
    sim = simulated(t)
    return {"layout": t.layout.as_dict(), "samples_per_second": t.samples_per_second, "mfu": t.mfu,
            "tflops_per_gpu": t.tflops_per_gpu, "peak_fraction": t.peak_fraction,
            "memory_gb": trial_need_gb(t, reserve_gb), "peak_memory_gb": t.peak_memory_gb, "status": str(t.status),
            "runner": t.runner, "measured": not sim, "simulated": sim, "study": t.study, "trial": t.number}


def predicted_json(row: dict, framework: str) -> dict:
    """A corrected prediction (tuner.best.answer) as `best` answers it."""
    return {**{k: v for k, v in row.items() if k != "key"}, "layout": row["layout"].as_dict(), "status": "predicted",
            "runner": None, "measured": False, "simulated": False, "study": None, "trial": None, "framework": framework}


@dataclass(frozen=True)
class BestAnswer:
    """`tuner best`'s answer: `layouts` (as its JSON, fastest first), whether they were measured, and what
    the answer rests on."""

    workload: object
    layouts: list
    measured: bool
    note: str

    def dataframe(self):
        import pandas as pd
        return pd.DataFrame([{**flat_layout(o["layout"]), **{k: v for k, v in o.items() if k != "layout"}}
                             for o in self.layouts])


def _read_store(storage):
    """The store a reading call uses (read-only, never created), or None where there is none."""
    from tuner.errors import NoStore
    from tuner.store import Store, open_store
    if isinstance(storage, Store):
        return storage
    try:
        return open_store(storage, create=False, read_only=True)
    except NoStore:
        return None


def best(model, nodes: int, cluster="frontier", *, global_batch: int | None = None, seq_length: int | None = None,
         precision: str = "bf16", framework: str | None = None, grad_reduce: str | None = None,
         optimizer_moments: str | None = None, k: int = 1,
         study: str | None = None, storage=None) -> BestAnswer:
    """The fastest known layouts, as `tuner best`: measured trials of the store's studies at this node count
    and global batch first (simulated ones only where nothing was measured, and said so); else the
    performance model corrected by the stored measurements at other node counts."""
    from tuner.best import best as best_layouts
    from tuner.specs import stored_framework
    store = _read_store(storage)
    if study and store is None:
        raise UsageError(f"study {study!r}: no store to read it from (storage=URL)")
    if study and framework is None:
        framework = stored_framework(store.get_study(study).workload)
    w = _workload(model, nodes, cluster, global_batch, seq_length, precision, framework, grad_reduce,
                  optimizer_moments)
    answer = best_layouts(store, w, k=k, study=study)
    if answer.trials:
        objs = [{**best_json(t, w.cluster.memory_reserved_gb), "framework": w.framework} for t in answer.trials]
        sim = all(o["simulated"] for o in objs)
        note = ("SIMULATED, not measured: the simulator's trials (the model's own prediction)" if sim
                else f"measured by {len({o['study'] for o in objs})} stud(ies)")
        return BestAnswer(w, objs, not sim, note)
    if study:
        raise UsageError(f"study '{study}' has no finished trial of {w.model.name} on {nodes} x {w.cluster.name} "
                         f"node(s) at global batch {w.global_batch}")
    objs = [predicted_json(r, w.framework) for r in answer.predicted]
    return BestAnswer(w, objs, False, "PREDICTED, not measured: " + answer.predicted[0]["evidence"]["note"])


# --------------------------------------------------------------------------------------------- scale

def scale(model, cluster="frontier", nodes="16:512", *, tokens: float | None = None, steps: int | None = None,
          framework: str | None = None, global_batch: int | None = None, batch_schedule: str | None = None,
          batch_per_gpu: int | None = None, seq_length: int | None = None, precision: str = "bf16",
          grad_reduce: str | None = None, optimizer_moments: str | None = None, price=None,
          deadline: float | None = None, max_gpus: int | None = None, space: str = "default", storage=None,
          jobs: int | None = None) -> ScaleResult:
    """`tuner scale`: for each cluster (a name, a comma list or ClusterSpecs), framework and node count
    ('16,32,64' or '16:512', doubling), the best layout and its samples/s (measured where a stored study
    measured it), days to train `tokens` (or `steps`) with goodput, GPU-hours, cost (with `price`: one
    number or 'h100=2.5,frontier=1.8'), energy; the Pareto set and, with `deadline` days, the cheapest point
    that meets it. `storage`: a Store or URL (read-only; none: the model alone). `jobs`: worker processes
    for the predictions (default: the CPUs)."""
    req, notes = scale_request(model, cluster, nodes, tokens=tokens, steps=steps, framework=framework,
                               global_batch=global_batch, batch_schedule=batch_schedule, batch_per_gpu=batch_per_gpu,
                               seq_length=seq_length, precision=precision, grad_reduce=grad_reduce,
                               optimizer_moments=optimizer_moments, price=price, deadline=deadline, max_gpus=max_gpus)
    return answer_scale(req, notes, _read_store(storage), space, jobs, framework)
