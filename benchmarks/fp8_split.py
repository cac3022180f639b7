"""Megatron-Core's low-precision rows, IN SPLIT only, grouped by what could carry an FP8-only mechanism (issue 25).

Run: python benchmarks/fp8_split.py [--hardware] [--moe] [--rows] [--cast-scale F]

Rows: the distinct Megatron-Core rows of benchmarks/data/llama_published.toml + framework_published.toml (with
--moe also moe_published.toml's, with --hardware the new machines', benchmarks/data/hardware_published.toml) whose configuration is NOT hashed out
(benchmarks/published.held_out): held-out rows are dropped BEFORE any prediction, so no held-out row's error is ever
computed here (framework_accuracy.py, which prints them, is run only once a choice is committed). Each row is predicted
as it ran (benchmarks/hardware_accuracy.evaluate: benchmarks/reading.py's one reading) and as the same layout in bf16
(the model's own FP8 speed-up for that row).

Prints the median signed error (predicted / measured - 1; > 0: predicted too fast) and how many rows are too fast,
grouped by: the low-precision recipe (the row's precision, and for per-tensor FP8 the scaling its note names: delayed
(NeMo's / MLPerf's FP8 hybrid, TE's default), tensorwise current scaling ('FP8-CS', 'current scaling'), blockwise;
'unstated' where the note names none); FP8 weights (reading.ran_fp8_params, else what tuner's launch runs:
Framework.quantized_params); the GEMM sizes (hidden / tp; tokens per micro-batch, micro-batch x sequence / cp); the
share of the predicted step in GEMMs; CUDA graphs and TP-communication overlap as the note states them; the machine
family (Hopper, Blackwell, AMD); the source family (benchmarks/in_split_rows.source_of). Then the cleanest evidence:
for pairs of in-split rows whose configurations differ only in precision, the published fp8 / bf16 speed ratio against
the predicted one. --rows: every row with its groups.
"""

from __future__ import annotations

import dataclasses
import statistics
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import framework_accuracy  # noqa: E402  (its two files' distinct rows)
import hardware_accuracy  # noqa: E402  (one reading of a row, with its step's shares)
import published  # noqa: E402
import reading  # noqa: E402
from in_split_rows import patched, source_of  # noqa: E402
from tuner.perfmodel import compute  # noqa: E402
from tuner.frameworks import of  # noqa: E402
from tuner.perfmodel import predict  # noqa: E402

LOW = ("fp8", "mxfp8", "nvfp4")
HOPPER, BLACKWELL = ("h100", "h200", "h800"), ("b200", "gb200", "b300", "gb300")
#: words of a row's note that name its per-tensor FP8 scaling (first match wins)
SCALING_WORDS = (("blockwise", ("blockwise", "block-wise", "FP8-BS", "fp8_bs")),
                 ("tensorwise", ("current scaling", "FP8-CS", "fp8_cs", "tensorwise", "Float8CurrentScaling")),
                 ("delayed", ("delayed", "FP8_HYBRID", "fp8_hybrid", "hybrid", "DelayedScaling")))


def in_split(hardware: bool = False, moe: bool = False) -> list[dict]:
    """The distinct Megatron-Core rows of framework_accuracy's two files (all three published files with `moe`; and the
    hardware file's with `hardware`) that are NOT hashed out: held-out rows never reach a prediction here."""
    rows = ((published.published() if moe else framework_accuracy.load_rows())
            + (published.hardware() if hardware else []))
    return [r for r in rows if r["framework"] == "megatron-core" and not published.held_out(r)]


def recipe(row: dict) -> str:
    """The row's low-precision recipe: mxfp8 / nvfp4 by precision; per-tensor FP8's scaling by its note's words."""
    if row["precision"] != "fp8":
        return row["precision"]
    note = row.get("note", "")
    for name, words in SCALING_WORDS:
        if any(w.lower() in note.lower() for w in words):
            return f"fp8 {name}"
    return "fp8 unstated"


def note_says(row: dict, on: tuple, off: tuple = ()) -> str:
    """'on' / 'off' where the row's note (or its key) states a feature, else 'unstated'."""
    note = row.get("note", "").lower()
    if any(w.lower() in note for w in off):
        return "off"
    return "on" if any(w.lower() in note for w in on) else "unstated"


def features(row: dict, lay, w) -> dict:
    """What could carry an FP8-only mechanism, for one row."""
    alone = reading.ran_fp8_params(row, lay, w)
    fp8_weights = alone if alone is not None else of(w).quantized_params(lay, w)
    tp_overlap = ("n/a (tp 1)" if lay.tp == 1 else
                  ("on" if row["tp_comm_overlap"] else "off") if "tp_comm_overlap" in row else
                  note_says(row, ("tp_comm_overlap=true", "tp comm overlap", "tp_comm_overlap true", "tp-comm-overlap"),
                            ("tp_comm_overlap=false", "tp_comm_overlap false", "no tp overlap")))
    graphs = note_says(row, ("cuda graph", "cuda_graph=true", "full_cuda_graph=1", "_cg.sh", "cuda_graph_scope",
                             "enable_cuda_graph"), ("full_cuda_graph=0", "no cuda graph", "cuda_graph=false"))
    fam = "hopper" if row["cluster"] in HOPPER else "blackwell" if row["cluster"] in BLACKWELL else "amd/other"
    return {"recipe": recipe(row), "fp8 weights": "yes" if fp8_weights else "no",
            "hidden/tp": w.model.hidden_size // lay.tp, "tokens/mb": lay.micro_batch * w.model.seq_length // lay.context_parallel,
            "tp overlap": tp_overlap, "cuda graphs": graphs, "machine": fam, "source": source_of(row)}


def bf16_speedup(row: dict, lay, w, pred_tps: float) -> float:
    """The model's FP8 speed-up for this row: its prediction over the same layout's in bf16, with the exchange
    hardware_accuracy.evaluate predicts it with (an MoE row's token exchange as its config set it)."""
    wb = dataclasses.replace(w, precision="bf16")
    exchange = (hardware_accuracy.exchange_of(row) if row.get("ep", 1) > 1 else reading.exchange_as_ran(row))
    return pred_tps / reading.tps_as_ran(row, lay, wb, predict(lay, wb, exchange), exchange)


def evaluate(row: dict) -> dict | None:
    """The row predicted as it ran, with its features and the model's fp8 / bf16 ratio; None where refused."""
    e = hardware_accuracy.evaluate(row)
    if e["refused"]:
        return None
    lay, w = e["layout"], reading.workload_of(row)
    out = {"error": e["error"], "pred": e["pred"], "layout": lay.key(), "gemm": e["gemm"],
           "elementwise": e["shares"].get("elementwise", 0.0), **features(row, lay, w)}
    if row["precision"] in LOW:
        out["model ratio"] = bf16_speedup(row, lay, w, e["pred"])
    return out


def bucket(value: float, edges: tuple) -> str:
    """`value`'s bin among `edges`: '< a', 'a-b', ..., '>= z'."""
    for lo, hi in zip((None,) + edges, edges + (None,)):
        if (lo is None or value >= lo) and (hi is None or value < hi):
            return f"< {hi:g}" if lo is None else f">= {lo:g}" if hi is None else f"{lo:g}-{hi:g}"
    return "?"


GROUPS = {"recipe": lambda e: e["recipe"], "fp8 weights": lambda e: e["fp8 weights"],
          "hidden / tp": lambda e: bucket(e["hidden/tp"], (2048, 4096, 8192)),
          "tokens per micro-batch": lambda e: bucket(e["tokens/mb"], (4096, 8192, 16384)),
          "GEMM share of the step": lambda e: bucket(e["gemm"], (0.5, 0.6, 0.7)),
          "model's fp8 / bf16 ratio": lambda e: bucket(e["model ratio"], (1.2, 1.35, 1.5)),
          "cuda graphs": lambda e: e["cuda graphs"], "tp overlap": lambda e: e["tp overlap"],
          "machine": lambda e: e["machine"], "source family": lambda e: e["source"]}


def summary(done: list) -> None:
    low = [(r, e) for r, e in done if r["precision"] in LOW]
    for label, key in GROUPS.items():
        groups = defaultdict(list)
        for _, e in low:
            groups[key(e)].append(e["error"])
        print(f"\n== by {label}: rows, median signed error, mean, too fast")
        for k, errors in sorted(groups.items(), key=lambda kv: str(kv[0])):
            print(f"  {str(k)[:40]:40s} {len(errors):3d}  {100 * statistics.median(errors):+6.1f} %  "
                  f"{100 * statistics.fmean(errors):+6.1f} %  {sum(x > 0 for x in errors):3d}")


def pairs(done: list) -> list[tuple]:
    """(low-precision row, bf16 row) pairs whose configurations differ only in precision."""
    def key(r):
        return published.split_key({**r, "precision": ""})
    bf16 = {key(r): (r, e) for r, e in done if r["precision"] == "bf16"}
    return [(lo, bf16[key(lo[0])]) for lo in done if lo[0]["precision"] in LOW and key(lo[0]) in bf16]


def ratios(done: list) -> None:
    print("\n== pairs that differ only in precision: published low / bf16 speed vs the model's (both rows in split)")
    found = pairs(done)
    for (r, e), (rb, eb) in found:
        meas = r["tokens_per_s_per_gpu"] / rb["tokens_per_s_per_gpu"]
        pred = e["pred"] / eb["pred"]
        print(f"  {r['cluster']:5s} {r['model'][:12]:12s} {r['precision']:5s} {r['gpus']:5d} {e['layout'][:40]:40s} "
              f"published {meas:5.3f}  model {pred:5.3f}  ({100 * (pred / meas - 1):+5.1f} %)  bf16 row "
              f"{100 * eb['error']:+5.1f} %  {e['recipe']}  {e['source']}")
    if not found:
        print("  none")


def cast_scaled(factor: float):
    """A context in which every GEMM input's quantisation traffic (compute.cast_units) is `factor` times the model's:
    a what-if, nothing chosen from it."""
    units = compute.cast_units
    return patched(compute, "cast_units", lambda *a: factor * units(*a))


def what_if(factor: float, hardware: bool, moe: bool, done: list) -> None:
    """The low-precision medians and the precision pairs again with the casts' traffic times `factor`."""
    with cast_scaled(factor):
        scaled = [(r, e) for r in in_split(hardware, moe) if (e := evaluate(r)) is not None]
    print(f"\n== with the casts' HBM traffic x {factor:g}: low-precision rows, median signed error as the model stands "
          f"| x {factor:g}; mean")
    for fam in ("hopper", "blackwell", "amd/other"):
        now = [e["error"] for r, e in done if r["precision"] in LOW and e["machine"] == fam]
        then = [e["error"] for r, e in scaled if r["precision"] in LOW and e["machine"] == fam]
        if now:
            print(f"  {fam:10s} {len(now):3d}  {100 * statistics.median(now):+6.1f} % | {100 * statistics.median(then):+6.1f} %"
                  f";  mean {100 * statistics.fmean(now):+6.1f} % | {100 * statistics.fmean(then):+6.1f} %")
    ratios(scaled)


def main(hardware: bool = False, rows: bool = False, moe: bool = False) -> list:
    done = [(r, e) for r in in_split(hardware, moe) if (e := evaluate(r)) is not None]
    low = [e["error"] for r, e in done if r["precision"] in LOW]
    print(f"in-split Megatron-Core rows{' (with the new machines)' if hardware else ''}: {len(done)} predicted, "
          f"{len(low)} low-precision (held-out rows skipped before prediction); low-precision median signed error "
          f"{100 * statistics.median(low):+.1f} %, mean {100 * statistics.fmean(low):+.1f} %")
    summary(done)
    ratios(done)
    if rows:
        print("\n== rows (gemm / elt: shares of the predicted step; ratio: the model's fp8 / bf16)")
        for r, e in sorted(done, key=lambda x: (x[0]["cluster"], x[0]["model"], x[1]["error"])):
            ratio = f"{e['model ratio']:.2f}" if "model ratio" in e else "  - "
            print(f"  {r['cluster']:5s} {r['model'][:11]:11s} {r['precision']:5s} {r['gpus']:5d} {e['layout'][:34]:34s} "
                  f"{100 * e['error']:+6.1f} %  gemm {e['gemm']:.2f} elt {e['elementwise']:.2f} ratio {ratio}  "
                  f"{e['recipe']:15s} w8 {e['fp8 weights']:3s} g {e['cuda graphs'][:3]:3s} o {e['tp overlap'][:3]:3s} "
                  f"{e['source'][:24]}")
    return done


if __name__ == "__main__":
    args, factor = sys.argv[1:], None
    if "--cast-scale" in args:
        i = args.index("--cast-scale")
        try:
            factor = float(args[i + 1])
        except (IndexError, ValueError):
            factor = -1.0
        args = args[:i] + args[i + 2:]
    unknown = [a for a in args if a not in ("--hardware", "--moe", "--rows")]
    if unknown or (factor is not None and factor < 0):
        print(f"{'unknown option ' + unknown[0] if unknown else '--cast-scale needs a factor >= 0'}: usage: python "
              "benchmarks/fp8_split.py [--hardware] [--moe] [--rows] [--cast-scale F (e.g. 0.5)]", file=sys.stderr)
        sys.exit(2)
    done = main("--hardware" in args, "--rows" in args, "--moe" in args)
    if factor is not None:
        what_if(factor, "--hardware" in args, "--moe" in args, done)
