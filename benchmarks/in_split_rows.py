"""The new machines' IN-SPLIT rows only, grouped: what a choice may look at (issue 26). Held-out rows
(benchmarks/published.held_out, a hash of the configuration) are dropped BEFORE any row is predicted, so no held-out
row's error is ever computed here; hardware_accuracy.py prints every row, so it is run only once a choice is made.

Run: python benchmarks/in_split_rows.py [--clusters b200,gb200,b300,gb300] [--rows] [--split] [--hopper-ratio]
     [--gemm-scale F]
Prints the median signed error (predicted / measured - 1) and how many rows are too fast, by machine and precision,
by machine and source (Megatron-Bridge tables by release, MLPerf, NeMo, dgxc, torchtitan), and with --rows each row
with its layout, the share of its predicted step in GEMMs and the releases whose median it is. --split: the dense
Megatron rows (NVIDIA's stacks: no torchtitan / torchao row) by parallel dimension, and whether their error grows
with the predicted step's share outside the GEMMs (attention + element-wise), as it would if that work were
under-charged. --hopper-ratio: the medians again with each Blackwell part's GEMM, attention and element-wise rates
times HOPPER_RATIO (a diagnostic, not a model: nothing is chosen from it). --gemm-scale F: the medians and the split
again with every Blackwell part's GEMM fractions (bf16, FP8, FP4) times F, the rest as the files stand: what a GEMM
curve F times the files' would leave (issue 26's fifteenth session: F 0.9 puts the one-node Llama 3 8B rows at -5.3 to
+1.2 % and the B200 / GB200 data-parallel-only dense rows at +1.2 % while tp > 1 stays +14.1 %; a what-if, nothing
chosen from it).
"""

from __future__ import annotations

import dataclasses
import statistics
import sys
from collections import defaultdict
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import hardware_accuracy  # noqa: E402  (one reading of a row)
import published  # noqa: E402
import reading  # noqa: E402

BLACKWELL = ("b200", "gb200", "b300", "gb300")


def in_split(clusters=BLACKWELL) -> list[dict]:
    """The distinct rows of `clusters` that are NOT hashed out (held-out rows are never predicted here)."""
    return [r for r in published.hardware() if r["cluster"] in clusters and not published.held_out(r)]


def source_of(row: dict) -> str:
    """A row's source family: 'MB 25.09-26.08' (Megatron-Bridge's tables: its first and last release), or the first
    words of its release (MLPerf Training v5.1, NeMo 25.04, dgxc-benchmarking, torchtitan, ...)."""
    rel = sorted(row["releases"])
    if all(r.startswith("Megatron-Bridge ") for r in rel):
        first, last = (r.split()[1] for r in (rel[0], rel[-1]))
        return f"MB {first}" + (f"-{last}" if last != first else "")
    return " ".join(rel[0].split(" (")[0].split(",")[0].split()[:4])


def evaluate(row: dict) -> dict | None:
    """The row predicted as it ran (hardware_accuracy.evaluate, one reading), with the share of its step in GEMMs;
    None where the model refuses it."""
    e = hardware_accuracy.evaluate(row)
    if e["refused"]:
        return None
    return {"layout": e["layout"].key(), "error": e["error"], "gemm": e["gemm"],
            "non_gemm": e["shares"].get("attention", 0.0) + e["shares"].get("elementwise", 0.0)}


def summary(label: str, groups: dict) -> None:
    print(f"\n== by {label}: rows, median signed error, too fast")
    for key, errors in sorted(groups.items()):
        print(f"  {' '.join(map(str, key)):34s} {len(errors):3d}  {100 * statistics.median(errors):+6.1f} %  "
              f"{sum(e > 0 for e in errors):3d}")


#: h100.toml's ESTIMATEs over what kernel microbenchmarks measure on Hopper: GEMMs 0.7 against 0.818 (XLA's sm_90
#: cuBLAS table, h100.toml's comment); attention 0.7 against 1.08 on tuner's count (cuDNN 9.19 SDPA on an H200, Llama
#: 3.1 shape, causal, bf16: 1.02 / 1.15 at sequence 4,096 / 8,192, NVIDIA/cudnn-frontend @ 3929da2ef4c1
#: benchmark/sdpa_benchmark_training/results/h200_919_only_cudnn/llama3.1_20260227_034703.csv, counted as gb200.toml
#: [5] counts GB200's); element-wise 0.75 against 0.687 (cuDNN RMSNorm / LayerNorm on an H200, the median of the 30
#: bandwidths, benchmark/norms/results/h200/all_models_20260227_035147.csv at the same commit, as gb200.toml [6]).
HOPPER_RATIO = {"matmul": 0.7 / 0.818, "attention": 0.7 / 1.08, "hbm": 0.75 / 0.687}


@contextmanager
def patched(obj, name: str, value):
    """`obj.name` is `value` inside the context (a candidate's account in place of the model's), restored after: the
    diagnostics' one swap (hopper_ratio here, benchmarks/parallel_bounds.py and dp_bounds.py)."""
    saved = getattr(obj, name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        setattr(obj, name, saved)


def scaled_rates(matmul: float, attention: float = 1.0, hbm: float = 1.0):
    """A context in which rows read the Blackwell clusters with their GEMM fractions (bf16, FP8, FP4) times `matmul`,
    attention_efficiency times `attention` and memory_bandwidth_efficiency times `hbm`; other clusters as they stand."""
    load = reading.load_cluster

    def scaled(name):
        c = load(name)
        if c.name not in BLACKWELL:
            return c
        return dataclasses.replace(
            c, matmul_efficiency=c.matmul_efficiency * matmul,
            matmul_efficiency_fp8=c.matmul_efficiency_fp8 and c.matmul_efficiency_fp8 * matmul,
            matmul_efficiency_fp4=c.matmul_efficiency_fp4 and c.matmul_efficiency_fp4 * matmul,
            attention_efficiency=c.attention_efficiency * attention,
            memory_bandwidth_efficiency=c.memory_bandwidth_efficiency * hbm)
    return patched(reading, "load_cluster", scaled)


def hopper_ratio():
    """A context in which rows read the Blackwell clusters with their GEMM, attention and element-wise rates times
    HOPPER_RATIO: what their predictions would say if those constants stood for what H100's do."""
    return scaled_rates(HOPPER_RATIO["matmul"], HOPPER_RATIO["attention"], HOPPER_RATIO["hbm"])


def split(done: list) -> None:
    """The dense Megatron rows by parallel dimension, and the correlation of their error with the non-GEMM share."""
    dense = [(r, e) for r, e in done if r.get("ep", 1) == 1 and not any(
        w in " ".join(r["releases"]) for w in ("torchtitan", "torchao"))]
    for fam in (("b200", "gb200"), ("b300", "gb300")):
        mine = [(r, e) for r, e in dense if r["cluster"] in fam]
        if len(mine) < 3:
            continue
        share, err = [e["non_gemm"] for _, e in mine], [e["error"] for _, e in mine]
        print(f"\n== {' + '.join(fam)} dense Megatron rows: {len(mine)}; correlation of the error with the step's share "
              f"outside the GEMMs (attention + element-wise): {statistics.correlation(share, err):+.2f}")
        groups = {"data-parallel only (tp = cp = pp = 1)": lambda t, c, p: t == c == p == 1,
                  "tp > 1": lambda t, c, p: t > 1, "cp > 1": lambda t, c, p: c > 1, "pp > 1": lambda t, c, p: p > 1}
        for name, pick in groups.items():
            errors = [e["error"] for r, e in mine if pick(r["tp"], r["cp"], r.get("ran_pp", r["pp"]))]
            if errors:
                print(f"  {name:38s} {len(errors):3d}  {100 * statistics.median(errors):+6.1f} %")


def compare(done: list, scaled: list, label: str = "HOPPER_RATIO") -> None:
    """Median signed error by machine: as the cluster files stand, and with `label`'s rates (hopper_ratio, scaled_rates)."""
    print(f"\n== by machine: rows, median signed error as the files stand | with {label}")
    for fam in sorted({r["cluster"] for r, _ in done}):
        now = [e["error"] for r, e in done if r["cluster"] == fam]
        then = [e["error"] for r, e in scaled if r["cluster"] == fam]
        print(f"  {fam:6s} {len(now):3d}  {100 * statistics.median(now):+6.1f} %  | {100 * statistics.median(then):+6.1f} %")


def main(clusters=BLACKWELL, rows: bool = False) -> list[tuple[dict, dict]]:
    done = [(r, e) for r in in_split(clusters) if (e := evaluate(r)) is not None]
    print(f"in-split rows of {', '.join(clusters)}: {len(done)} predicted (held-out rows skipped before prediction)")
    by_precision, by_source = defaultdict(list), defaultdict(list)
    for r, e in done:
        by_precision[(r["cluster"], r["precision"])].append(e["error"])
        by_source[(r["cluster"], source_of(r))].append(e["error"])
    summary("machine and precision", by_precision)
    summary("machine and source", by_source)
    if rows:
        print("\n== rows (gemm: the GEMMs' share of the predicted step)")
        for r, e in sorted(done, key=lambda x: (x[0]["cluster"], x[0]["model"], x[0]["precision"], x[0]["gpus"])):
            print(f"  {r['cluster']:5s} {r['model'][:14]:14s} {r['precision']:5s} {r['gpus']:5d} {e['layout'][:46]:46s} "
                  f"{100 * e['error']:+6.1f} %  gemm {e['gemm']:.2f}  {source_of(r)}")
    return done


if __name__ == "__main__":
    args = sys.argv[1:]
    flags = {a for a in args if a in ("--rows", "--split", "--hopper-ratio")}
    args = [a for a in args if a not in flags]
    gemm = None
    if "--gemm-scale" in args:
        i = args.index("--gemm-scale")
        gemm, args = (args[i + 1] if i + 1 < len(args) else ""), args[:i] + args[i + 2:]
        try:
            gemm = float(gemm)
        except ValueError:
            gemm = -1.0
    if (args and (args[0] != "--clusters" or len(args) != 2)) or (gemm is not None and gemm <= 0):
        print("usage: python benchmarks/in_split_rows.py [--clusters b200,gb200,b300,gb300] [--rows] [--split] "
              "[--hopper-ratio] [--gemm-scale F (a positive factor, e.g. 0.9)]", file=sys.stderr)
        sys.exit(2)
    chosen = tuple(args[1].split(",")) if args else BLACKWELL
    done = main(chosen, "--rows" in flags)
    if "--split" in flags:
        split(done)
    if "--hopper-ratio" in flags:
        with hopper_ratio():
            scaled = [(r, e) for r in in_split(chosen) if (e := evaluate(r)) is not None]
        compare(done, scaled)
    if gemm is not None:
        with scaled_rates(gemm):
            scaled = [(r, e) for r in in_split(chosen) if (e := evaluate(r)) is not None]
        compare(done, scaled, f"GEMM fractions x {gemm:g}")
        print(f"\n(the split below: GEMM fractions x {gemm:g})")
        split(scaled)
