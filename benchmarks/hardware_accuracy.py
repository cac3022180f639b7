"""The performance model on the machines of issue 26, against PUBLISHED, MEASURED runs, each predicted with
the layout it ran (tokens/s/GPU: predicted / measured - 1).

Run: python benchmarks/hardware_accuracy.py

Rows: benchmarks/data/hardware_published.toml (NVIDIA Megatron-Bridge's DGX-GB200 / B200 / GB300 / B300
pre-training tables, 25.09 to 26.08, NVIDIA dgxc-benchmarking v25.05.05's GB200 tables (Grok-1 with its own shape), DeepSeek-V3's H800 run), every source named in the file; each row is predicted with the
layout it ran, its pipeline split included (the DeepSeek-V3 recipes' "light-last" layers per stage, the
data file's `pipeline_split`). One configuration is one row
(benchmarks/published.py: a configuration stated in several releases is the median of its measurements).
Every row is in the headline: each is printed, and each GPU family's line counts all its rows (a row the
model's rules refuse is counted and named as refused). Held out: the configurations hashed into the
held-out third (data/held_out.txt, written before this benchmark first ran) that no choice saw
(published.HARDWARE_SEEN: the MI325X rows, seen by their global batch's correction and by the choice of
mi325x.toml's GEMM fractions; every other constant is quoted or marked ESTIMATE in its file, none chosen on these
rows). AMD Instinct MI325X and MI355X rows: AMD's measured Primus-Megatron runs (the data
file names the source and each unstated value it takes); MI300X and MI300A have none: unvalidated.
"""

from __future__ import annotations

import dataclasses
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import published  # noqa: E402  (one configuration = one row; the held-out rule)
from moe_accuracy import exchange_of  # noqa: E402  (the row's token exchange as its config set it)
from memory_accuracy import model_of  # noqa: E402  (a preset, or a row's own shape)
from tuner.layout import Layout, why_invalid  # noqa: E402
from tuner.perfmodel import predict  # noqa: E402
from tuner.specs import load_cluster, make_workload  # noqa: E402

FAMILIES = {"b200": "Blackwell DGX B200", "gb200": "Blackwell GB200 NVL72", "b300": "Blackwell Ultra DGX B300",
            "gb300": "Blackwell Ultra GB300 NVL72", "h800": "Hopper H800", "mi325x": "AMD Instinct MI325X",
            "mi355x": "AMD Instinct MI355X"}
#: AMD presets no published run validates (benchmarks/data/hardware_published.toml says why)
UNVALIDATED = ("mi300x", "mi300a")


def layout_of(row: dict) -> Layout:
    tp, cp, pp = row["tp"], row["cp"], row["pp"]
    rc = "none" if row["recompute"] == "unstated" else row["recompute"]
    return Layout(tp=tp, sequence_parallel=row["sequence_parallel"], context_parallel=cp, pp=pp,
                  virtual_pipeline=row["vp"], dp=row["gpus"] // (tp * cp * pp), expert_parallel=row.get("ep", 1),
                  expert_tensor_parallel=row.get("etp", 1), micro_batch=row["micro_batch"],
                  zero_stage=published.zero_stage(row), recompute=rc,
                  pipeline_split=row.get("pipeline_split", "auto"))


def evaluate(row: dict) -> dict:
    model = model_of(row)               # a preset at the row's sequence, or the row's own shape (Grok-1)
    if row.get("moe_capacity_factor"):      # a row that states its token dropping (as moe_accuracy.evaluate)
        model = dataclasses.replace(model, moe_capacity_factor=row["moe_capacity_factor"])
    cluster = load_cluster(row["cluster"])
    lay = layout_of(row)
    try:
        w = make_workload(model, row["gpus"] // cluster.gpus_per_node, cluster, row["global_batch"],
                          precision=row["precision"], framework=row["framework"],
                          grad_reduce=published.grad_reduce(row))
    except Exception as exc:      # a precision the model refuses on this machine: counted as refused
        return {"refused": str(exc), "layout": lay}
    bad = why_invalid(lay, w)
    if bad:
        return {"refused": bad, "layout": lay}
    pr = predict(lay, w, exchange_of(row)) if row.get("ep", 1) > 1 else predict(lay, w)
    tps = pr.samples_per_second * row["seq_length"] / row["gpus"]
    return {"refused": None, "layout": lay, "error": tps / row["tokens_per_s_per_gpu"] - 1.0, "pred": tps,
            "p_fit": pr.p_fit}


def stats(errors: list[float]) -> str:
    if not errors:
        return "  0 rows"
    a = [abs(e) for e in errors]
    return (f"{len(a):3d} rows, median |error| {100 * statistics.median(a):5.1f} %, worst "
            f"{100 * max(errors, key=abs):+6.1f} %")


def main() -> dict:
    rows = published.hardware()
    results = [(r, evaluate(r)) for r in rows]
    print("== Published runs on the new machines (tokens/s/GPU: predicted / measured - 1; every row)")
    for r, e in results:
        tag = "held-out" if published.hardware_clean(r) else "in-split"
        what = e["refused"][:110] if e["refused"] else (
            f"{100 * e['error']:+6.1f} %  pred {e['pred']:7.0f}  meas {r['tokens_per_s_per_gpu']:7.0f}  p_fit {e['p_fit']:.2f}")
        print(f"  {r['cluster']:6s} {r['model']:16s} {r['precision']:5s} {r['gpus']:5d} {e['layout'].key():42s} "
              f"{tag:8s} {r['measurements']}x  {what}")
    summary = {}
    print("\n== Per GPU family: all rows | held-out rows (hashed out, seen by no choice)")
    for fam, title in FAMILIES.items():
        mine = [(r, e) for r, e in results if r["cluster"] == fam]
        ok = [(r, e) for r, e in mine if not e["refused"]]
        ho = [e["error"] for r, e in ok if published.hardware_clean(r)]
        refused = len(mine) - len(ok)
        print(f"  {title:28s} all: {stats([e['error'] for _, e in ok])}; held out: {stats(ho)}"
              f"{f'; {refused} refused by the model' if refused else ''}")
        summary[fam] = {"all": [e["error"] for _, e in ok], "held_out": ho, "refused": refused}
    every = [e["error"] for _, e in results if not e["refused"]]
    ho = [e["error"] for r, e in results if not e["refused"] and published.hardware_clean(r)]
    print(f"  {'every family':28s} all: {stats(every)}; held out: {stats(ho)}")
    print(f"  AMD Instinct ({', '.join(UNVALIDATED)}): no published run with its layout in the stored sources: "
          "unvalidated")
    return summary


if __name__ == "__main__":
    main()
