"""The performance model on the machines of issue 26, against PUBLISHED, MEASURED runs, each predicted with
the layout it ran (tokens/s/GPU: predicted / measured - 1).

Run: python benchmarks/hardware_accuracy.py [--source TEXT]   (--source: only the rows whose source names TEXT,
e.g. "training_results_v5.1" for the MLPerf rows, "performance_long_sequence" for NeMo's long-sequence rows)

Rows: benchmarks/data/hardware_published.toml (NVIDIA Megatron-Bridge's DGX-GB200 / B200 / GB300 / B300
pre-training tables, 25.09 to 26.08, NVIDIA dgxc-benchmarking v25.05.05's GB200 tables (Grok-1 with its own shape),
DeepSeek-V3's H800 run, MLPerf Training v5.1's Llama 3.1 405B / 8B result logs and configs (NVIDIA GB200 / GB300,
B200 / B300 submitters, AMD MI355X, AMD and Cisco MI350X) and v5.0's GB200 Llama 3.1 405B ones, NeMo's long-sequence B200 table,
torchao's torchtitan benchmarks on MI300X and on B200 at 750 W), every source named in the file; each row is predicted with the
layout it ran, its pipeline split included (the DeepSeek-V3 recipes' "light-last" layers per stage, the
data file's `pipeline_split`). One configuration is one row
(benchmarks/published.py: a configuration stated in several releases is the median of its measurements).
Every row is in the headline: each is printed, and each GPU family's line counts all its rows (a row the
model's rules refuse is counted and named as refused). Held out: the configurations hashed into the
held-out third (data/held_out.txt, written before this benchmark first ran) that no choice saw
(published.HARDWARE_SEEN: the MI325X rows, seen by their global batch's correction and by the choice of
mi325x.toml's GEMM fractions; every other constant is quoted or marked ESTIMATE in its file, none chosen on these
rows; published.HARDWARE_SEEN also names the MI355X rows, seen by the choice of mi355x.toml's CDNA 4 GEMM fractions,
and every B200 / GB200 / B300 / GB300 row, seen by the Blackwell GEMM curve of issue 26's sixth session, but those
added after it, whose `added` says so: issue 26's seventh session's MLPerf rows).
AMD Instinct MI325X and MI355X rows: AMD's measured Primus-Megatron runs and MLPerf (the data file names the source and
each unstated value it takes); MI300X: torchao's torchtitan benchmarks (Llama 3 8B on 8 GPUs, bf16 / fp8); MI300A has
none: unvalidated.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import published  # noqa: E402  (one configuration = one row; the held-out rule)
import reading  # noqa: E402  (one reading of a row: its model, machine, layout, and memory as it ran)
from moe_accuracy import exchange_of  # noqa: E402  (the row's token exchange as its config set it)
from tuner.layout import why_invalid  # noqa: E402
from tuner.perfmodel import predict  # noqa: E402

FAMILIES = {"b200": "Blackwell DGX B200", "gb200": "Blackwell GB200 NVL72", "b300": "Blackwell Ultra DGX B300",
            "gb300": "Blackwell Ultra GB300 NVL72", "h800": "Hopper H800", "mi325x": "AMD Instinct MI325X",
            "mi355x": "AMD Instinct MI355X", "mi350x": "AMD Instinct MI350X", "mi300x": "AMD Instinct MI300X"}
#: AMD presets no published run validates (benchmarks/data/hardware_published.toml says why)
UNVALIDATED = ("mi300a",)


def evaluate(row: dict) -> dict:
    """A row predicted as it ran (benchmarks/reading.py: its model, layout, `ran_*` keys, the overlaps its config turned
    off), with its token exchange;
    its p_fit as tuner states it for that run (reading.memory_as_ran: a recipe's activation offloading included)."""
    lay = reading.layout_of(row)
    try:
        w = reading.workload_of(row)
    except Exception as exc:      # a precision the model refuses on this machine: counted as refused
        return {"refused": str(exc), "layout": lay}
    bad = why_invalid(lay, w)
    if bad:
        return {"refused": bad, "layout": lay}
    exchange = exchange_of(row) if row.get("ep", 1) > 1 else reading.exchange_as_ran(row)
    pr = predict(lay, w, exchange)
    tps = reading.tps_as_ran(row, lay, w, pr, exchange)
    memory_gb, p_fit = reading.memory_as_ran(row, lay, w)
    return {"refused": None, "layout": lay, "error": tps / row["tokens_per_s_per_gpu"] - 1.0, "pred": tps,
            "p_fit": p_fit, "memory_gb": memory_gb, "gemm": pr.time_breakdown.get("gemm", 0.0) / pr.step_time_s,
            "shares": {k: v / pr.step_time_s for k, v in pr.time_breakdown.items()}}


def stats(errors: list[float]) -> str:
    if not errors:
        return "  0 rows"
    a = [abs(e) for e in errors]
    return (f"{len(a):3d} rows, median |error| {100 * statistics.median(a):5.1f} %, worst "
            f"{100 * max(errors, key=abs):+6.1f} %")


def main(source: str | None = None) -> dict:
    rows = [r for r in published.hardware() if source is None or any(source in s for s in r["sources"])]
    if source is not None:
        print(f"rows whose source names {source!r}: {len(rows)} configurations")
    results = [(r, evaluate(r)) for r in rows]
    print("== Published runs on the new machines (tokens/s/GPU: predicted / measured - 1; every row)")
    for r, e in results:
        tag = "held-out" if published.hardware_clean(r, "speed") else "in-split"
        what = e["refused"][:110] if e["refused"] else (
            f"{100 * e['error']:+6.1f} %  pred {e['pred']:7.0f}  meas {r['tokens_per_s_per_gpu']:7.0f}  p_fit {e['p_fit']:.2f}")
        print(f"  {r['cluster']:6s} {r['model']:16s} {r['precision']:5s} {r['gpus']:5d} {e['layout'].key():42s} "
              f"{tag:8s} {r['measurements']}x  {what}")
    summary = {}
    print("\n== Per GPU family: all rows | held-out rows (hashed out, seen by no choice)")
    for fam, title in FAMILIES.items():
        mine = [(r, e) for r, e in results if r["cluster"] == fam]
        ok = [(r, e) for r, e in mine if not e["refused"]]
        ho = [e["error"] for r, e in ok if published.hardware_clean(r, "speed")]
        refused = len(mine) - len(ok)
        print(f"  {title:28s} all: {stats([e['error'] for _, e in ok])}; held out: {stats(ho)}"
              f"{f'; {refused} refused by the model' if refused else ''}")
        summary[fam] = {"all": [e["error"] for _, e in ok], "held_out": ho, "refused": refused}
    every = [e["error"] for _, e in results if not e["refused"]]
    ho = [e["error"] for r, e in results if not e["refused"] and published.hardware_clean(r, "speed")]
    print(f"  {'every family':28s} all: {stats(every)}; held out: {stats(ho)}")
    print(f"  AMD Instinct ({', '.join(UNVALIDATED)}): no published run with its layout in the stored sources: "
          "unvalidated")
    fit_report(results)
    return summary


def fit_report(results: list) -> None:
    """Every run here ran: how many tuner gives p_fit >= 0.5, and each below it (its memory against the GPU's)."""
    ran = [(r, e) for r, e in results if not e["refused"]]
    low = [(r, e) for r, e in ran if e["p_fit"] < 0.5]
    print(f"\n== p_fit of the runs that ran (memory as each ran: benchmarks/reading.py): {len(ran) - len(low)} of "
          f"{len(ran)} have p_fit >= 0.5")
    for r, e in low:
        print(f"  {r['cluster']:6s} {r['model']:16s} {r['precision']:5s} {r['gpus']:5d} {e['layout'].key():42s} "
              f"{e['memory_gb']:6.1f} of {reading.cluster_of(r).memory_gb:.1f} GB  p_fit {e['p_fit']:.2f}")


if __name__ == "__main__":
    args = sys.argv[1:]
    if args and (args[0] != "--source" or len(args) != 2):
        print("usage: python benchmarks/hardware_accuracy.py [--source TEXT]", file=sys.stderr)
        sys.exit(2)
    main(args[1] if args else None)
