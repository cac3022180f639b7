"""The performance and memory model per training framework, against PUBLISHED, MEASURED runs (issue 18).

Run: python benchmarks/framework_accuracy.py [--all-rows]

Rows: benchmarks/data/llama_published.toml (NVIDIA's Megatron-Core recipes, torchtitan's 2024-12 tables)
and benchmarks/data/framework_published.toml (MosaicML llm-foundry's FSDP tables, torchtitan's tables with
peak memory, NeMo / Megatron-Bridge). Every row is in the headline of its framework: none is reported
apart. llm-foundry's rows ran PyTorch FSDP (ZeRO-3, FULL_SHARD; a few SHARD_GRAD_OP) and are predicted as
framework torchtitan (FSDP), the stack tuner has for FSDP; its "fsdp" label is kept in the table. Each row is
read as every accuracy benchmark reads it (benchmarks/reading.py): a recipe's `ran_*` keys and its memory as it
ran (apex's bf16 optimizer state, activation offloading) enter its p_fit here as in memory_accuracy.py.

Held out: the rows whose configuration hashes into the held-out third (benchmarks/published.py: the
configuration only, never its source or line; one configuration stated in both files, or in several
releases, is one row) AND that no speed choice saw (published.SEEN names the rows each saw); the tuning
line has the rest. The choices, each with what it saw:
- chosen after seeing rows: `UNFUSED_TRAFFIC` (tuner/perfmodel/compute.py, 2.5) after one torchtitan
  row (8B, 8 GPUs, FSDP eager: 5,762 tokens/s/GPU); `FA2_ON_HOPPER` (2.0: PyTorch SDPA's FlashAttention-2
  against the fused attention the H100 constants describe) on the TUNING rows of fsdp and torchtitan (1.6,
  2.0 and 2.4 tried; before it, torchtitan bf16 / fp8 medians were 20 % / 38 % and fsdp bf16 8.4 %, all
  too fast, worst on long sequences); Megatron-Core's overlaps after the NVIDIA rows
  of llama_published.toml (issue 14); the frameworks' `memory_sd` (tuner/frameworks.py) from the
  spread of log(measured / predicted peak) of the tuning rows with a stated peak, printed below;
- read from source after the in-split torchtitan / fsdp rows had been printed, no constant chosen: torchtitan's
  Qwen3 TP plan before pytorch/torchtitan #1870 (q and k gathered at q_norm / k_norm), charged to the rows that
  state `ran_qk_norm` (benchmarks/reading.py qk_norm_gather_s; seen.SEEN names the rows it saw);
- nothing else was fitted: the cluster files' constants are quoted hardware numbers.
The held-out rows check the speed error and the fit probability: a row that ran must not be pruned
(p_fit < PRUNE_BELOW). Published runs are all runs that fit (nobody publishes an OOM), so their mean
stated p_fit against "all ran" shows only which way p_fit errs (low: cautious); its calibration on runs
that can fail is search_efficiency.py's transfer line.
"""

from __future__ import annotations

import math
import statistics
import sys
import tomllib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

sys.path.insert(0, str(Path(__file__).resolve().parent))
import published  # noqa: E402  (one configuration = one row; the held-out rule)
import reading  # noqa: E402  (one reading of a row: its model, machine, layout, and memory as it ran)
from tuner.layout import why_invalid  # noqa: E402
from tuner.perfmodel import PRUNE_BELOW, predict  # noqa: E402

DATA = Path(__file__).resolve().parent / "data"
FILES = ("llama_published.toml", "framework_published.toml")
GIB = 1.073741824          # GB per GiB
PREDICTED_AS = reading.PREDICTED_AS


def load_rows() -> list[dict]:
    """The distinct configurations of both files (a configuration stated in both, or in several releases,
    is one row: the median of its measurements)."""
    rows = []
    for name in FILES:
        with open(DATA / name, "rb") as f:
            for r in tomllib.load(f)["row"]:
                rows.append({**r, "file": name})
    return published.distinct(rows)


def held_out(row: dict) -> bool:
    """Held out by the configuration's hash AND seen by no speed choice (benchmarks/published.py): the only
    rows this benchmark calls held out."""
    return published.clean(row, "speed")


#: the one reading of a row every accuracy benchmark shares (benchmarks/reading.py); scaling_accuracy imports it here
layout_of = reading.layout_of


def evaluate(row: dict) -> dict:
    """A row predicted as it ran (benchmarks/reading.py: its model, machine, layout and `ran_*` keys; the overlaps its
    config turned off, reading.exchange_as_ran; a step's seconds beyond tuner's where its launch ran more,
    reading.qk_norm_gather_s / attention_kernel_s); its memory and p_fit as tuner states them for
    that run (reading.memory_as_ran)."""
    w, lay = reading.workload_of(row), reading.layout_of(row)
    bad = why_invalid(lay, w)
    if bad:
        return {"refused": bad, "layout": lay}
    exchange = reading.exchange_as_ran(row)
    pr = predict(lay, w, exchange)
    memory_gb, p_fit = reading.memory_as_ran(row, lay, w)
    tps = reading.tps_as_ran(row, lay, w, pr, exchange)
    out = {"refused": None, "layout": lay, "error": tps / row["tokens_per_s_per_gpu"] - 1.0, "pred": tps,
           "p_fit": p_fit, "memory_gb": memory_gb, "capacity": w.cluster.memory_gb}
    if row.get("peak_memory_gib"):
        out["mem_log_ratio"] = math.log(row["peak_memory_gib"] * GIB / memory_gb)
    return out


def error_stats(errors: list[float]) -> str:
    if not errors:
        return "no rows"
    a = [abs(e) for e in errors]
    return (f"{len(a):3d} rows, median |error| {100 * statistics.median(a):5.1f} %, worst "
            f"{100 * max(errors, key=abs):+6.1f} %, mean {100 * statistics.fmean(errors):+6.1f} %")


def _mem_stats(x: list[float]) -> str:
    if len(x) < 2:
        return f"{len(x)} rows with a stated peak"
    return (f"{len(x)} rows with a stated peak: log(measured/predicted) mean {statistics.fmean(x):+.3f}, "
            f"sd {statistics.stdev(x):.3f}, worst {max(x, key=abs):+.3f}")


def main(all_rows: bool = False) -> dict:
    results = [(r, evaluate(r)) for r in load_rows()]
    print("== Published runs per framework (tokens/s/GPU: predicted / measured - 1; every row in the headline)")
    if all_rows:
        for r, e in results:
            tag = "held-out" if held_out(r) else "tuning"
            what = e["refused"] or f"{100 * e['error']:+6.1f} %  p_fit {e['p_fit']:.2f}"
            print(f"  {r['framework']:17s} {r['model']:11s} {r['cluster']:9s} {r['gpus']:5d} {r['precision']} "
                  f"s{r['seq_length']:<6d} {e['layout'].key():38s} {tag:8s} {what}")
    summary = {}
    for fw in sorted({r["framework"] for r in load_rows()}):
        mine = [(r, e) for r, e in results if r["framework"] == fw]
        ok = [(r, e) for r, e in mine if not e["refused"]]
        print(f"\n{fw} (predicted as {PREDICTED_AS.get(fw, fw)}): {len(mine)} rows, {len(mine) - len(ok)} refused by "
              "the model's rules" + "".join(f"\n    refused: {e['refused']}" for _, e in mine if e["refused"])[:400])
        for label, sel in (("all", ok), ("tuning", [x for x in ok if not held_out(x[0])]),
                           ("held-out", [x for x in ok if held_out(x[0])])):
            for p in ("bf16", "fp8"):
                errs = [e["error"] for r, e in sel if r["precision"] == p]
                if errs:
                    print(f"  {label:8s} {p}: {error_stats(errs)}")
            ran = [e for r, e in sel if not r.get("oom")]
            pruned = sum(e["p_fit"] < PRUNE_BELOW for e in ran)
            unlikely = sum(e["p_fit"] < 0.5 for e in ran)
            mean = statistics.fmean(e["p_fit"] for e in ran) if ran else math.nan
            print(f"  {label:8s} memory: {_mem_stats([e['mem_log_ratio'] for r, e in sel if 'mem_log_ratio' in e])}; "
                  f"of {len(ran)} that ran, {pruned} would be pruned (p_fit < {PRUNE_BELOW}), {unlikely} have p_fit < 0.5 "
                  f"(mean stated p_fit {mean:.2f}; all ran)")
        summary[fw] = {"errors": [e["error"] for _, e in ok],
                       "held_out": [e["error"] for r, e in ok if held_out(r)],
                       "mem_tuning": [e["mem_log_ratio"] for r, e in ok if "mem_log_ratio" in e and not held_out(r)]}
    return summary


if __name__ == "__main__":
    main(all_rows="--all-rows" in sys.argv)
