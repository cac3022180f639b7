"""A study's trials as rows and series: what `tuner trials`, `tuner export`, the library and the report
read (export rows, the fastest-first order, top rows, status counts, best so far, the TP x PP cells, the
model's error). Pure: TrialRecords in, plain data out.
"""

from __future__ import annotations

from datetime import datetime, timezone

from tuner.layout import DIMENSIONS, LAYOUT_FIELDS, flat_layout
from tuner.metrics import trial_rank_key
from tuner.trial import SIMULATED, Status

STATUS_ORDER = [s.value for s in Status]
EXPORT_COLUMNS = ["study", "trial", "layout_key", *LAYOUT_FIELDS, "status", "samples_per_second", "mfu",
                  "tflops_per_gpu", "peak_fraction", "peak_memory_gb", "predicted_mfu", "predicted_tflops_per_gpu",
                  "predicted_peak_fraction",
                  "predicted_memory_gb", "predicted_step_time_s", "runner", "attempts", "started", "ended",
                  "duration_s", "message", "log_path"]
#: What each TP x PP cell of the heatmap takes the best over: every other dimension (table columns).
COLLAPSED = tuple(d.column for d in DIMENSIONS if d.name not in ("tp", "pp"))


def _iso(t: datetime | None) -> str | None:
    return None if t is None else t.astimezone(timezone.utc).isoformat()


def export_row(t) -> dict:
    """One trial as a flat row: layout, status, measured and predicted metrics (EXPORT_COLUMNS)."""
    dur = (t.ended - t.started).total_seconds() if t.started and t.ended else None
    return {"study": t.study, "trial": t.number, "layout_key": t.layout.key(), **t.layout.as_dict(),
            "status": str(t.status), "samples_per_second": t.samples_per_second, "mfu": t.mfu,
            "tflops_per_gpu": t.tflops_per_gpu, "peak_fraction": t.peak_fraction, "peak_memory_gb": t.peak_memory_gb,
            "predicted_mfu": t.predicted_mfu, "predicted_tflops_per_gpu": t.predicted_tflops_per_gpu,
            "predicted_peak_fraction": t.predicted_peak_fraction, "predicted_memory_gb": t.predicted_memory_gb,
            "predicted_step_time_s": t.predicted_step_time_s, "runner": t.runner, "attempts": t.attempts,
            "started": _iso(t.started), "ended": _iso(t.ended), "duration_s": dur,
            "message": t.message or "", "log_path": t.log_path}


def export_rows(trials) -> list[dict]:
    return [export_row(t) for t in sorted(trials, key=lambda t: t.number)]


def ok_trials(trials) -> list:
    """Successful trials with a measured speed, fastest (highest MFU) first (ties: tuner.metrics.rank_key)."""
    ok = [t for t in trials if t.status == Status.OK and t.mfu is not None]
    return sorted(ok, key=trial_rank_key)


def top_rows(trials, k: int, reserve_gb: float) -> list[dict]:
    """The `k` fastest layouts as table rows (percentages, not fractions). mfu_% ranks; mgt_* is
    Megatron's count with recompute (the Frontier study's figure). mem_gb is the prediction's quantity (the
    runner's peak plus the cluster's fixed reserve `reserve_gb`, tuner.perfmodel.fit.trial_need_gb), so it stands
    beside pred_mem_gb like with like."""
    from tuner.perfmodel.fit import trial_need_gb
    pct = lambda v: None if v is None else 100 * v                  # noqa: E731
    return [{"rank": i + 1, "trial": t.number, **flat_layout(t.layout.as_dict()),
             "samples_s": t.samples_per_second, "mfu_%": pct(t.mfu), "pred_mfu_%": pct(t.predicted_mfu),
             "mgt_tflops": t.tflops_per_gpu, "mgt_peak_%": pct(t.peak_fraction),
             "mem_gb": trial_need_gb(t, reserve_gb), "pred_mem_gb": t.predicted_memory_gb}
            for i, t in enumerate(ok_trials(trials)[:k])]


def columns_at_default(rows: list[dict]) -> set[str]:
    """The layout columns a layout key names only when set (sp, cp, vp, ep, etp) that every row leaves at
    their default: tables leave them out (a dense study's ep and etp are 1 throughout)."""
    return {d.column for d in DIMENSIONS if d.in_key == "set" and rows
            and all(r.get(d.column, d.default) == d.default for r in rows)}


def status_counts(trials) -> dict[str, int]:
    """Trials per status, in Status order, statuses with no trial left out."""
    counts = {s: 0 for s in STATUS_ORDER}
    for t in trials:
        counts[str(t.status)] += 1
    return {s: n for s, n in counts.items() if n}


def best_so_far(trials) -> tuple[list[int], list[float], list[int], list[float]]:
    """(numbers, running best, ok numbers, ok values) of MFU (training speed) over launched trials.

    Pruned trials were never launched and are left out; the running best starts at the first success.
    """
    launched = sorted((t for t in trials if t.status not in (Status.PRUNED, Status.RUNNING)), key=lambda t: t.number)
    xs, ys, ok_x, ok_y, best = [], [], [], [], None
    for t in launched:
        if t.status == Status.OK and t.mfu is not None:
            ok_x.append(t.number)
            ok_y.append(t.mfu)
            best = t.mfu if best is None else max(best, t.mfu)
        if best is not None:
            xs.append(t.number)
            ys.append(best)
    return xs, ys, ok_x, ok_y


def tp_pp_cells(trials) -> dict[tuple[int, int], tuple]:
    """(tp, pp) -> (the fastest ok trial with that TP and PP, whatever its other dimensions (COLLAPSED),
    how many ok trials the cell holds)."""
    cells: dict[tuple[int, int], tuple] = {}
    for t in ok_trials(trials):                       # fastest first: a cell's first trial is its best
        key = (t.layout.tp, t.layout.pp)
        best, n = cells.get(key, (t, 0))
        cells[key] = (best, n + 1)
    return cells


def tp_pp_grid(trials) -> tuple[list[int], list[int], list[list[float | None]]]:
    """(tps, pps, grid[pp index][tp index]): the best MFU of each TP x PP over the other dims."""
    cells = tp_pp_cells(trials)
    tps = sorted({tp for tp, _ in cells})
    pps = sorted({pp for _, pp in cells})
    return tps, pps, [[cells[(tp, pp)][0].mfu if (tp, pp) in cells else None for tp in tps] for pp in pps]


def simulated(t) -> bool:
    """Whether a trial's numbers are the simulator's (the model's prediction), not a measurement."""
    return t.runner in SIMULATED


def pairs(trials, measured: str, predicted: str) -> tuple[list[float], list[float]]:
    """(predicted, measured) of the successful trials that have both."""
    got = [(getattr(t, predicted), getattr(t, measured)) for t in trials if t.status == Status.OK]
    got = [(p, m) for p, m in got if p is not None and m is not None]
    return [p for p, _ in got], [m for _, m in got]


def memory_pairs(trials, reserve_gb: float) -> tuple[list[float], list[float]]:
    """(predicted peak, measured need) of the successful trials that have both, in GB: a runner's peak is the bytes
    its tensors allocated, so the cluster's fixed reserve, which every predicted peak holds, is added to it before
    the two are compared (tuner.perfmodel.fit.measured_need_gb, as the memory correction and `best` compare them)."""
    from tuner.perfmodel.fit import measured_need_gb
    pred, meas = pairs(trials, "peak_memory_gb", "predicted_memory_gb")
    return pred, [measured_need_gb(m, reserve_gb) for m in meas]


def model_error(predicted: list[float], measured: list[float]) -> dict | None:
    """Mean absolute and mean signed relative error of the prediction against the measurement."""
    rel = [(p - m) / m for p, m in zip(predicted, measured) if m]
    if not rel:
        return None
    return {"n": len(rel), "mape": sum(abs(r) for r in rel) / len(rel), "bias": sum(rel) / len(rel)}
