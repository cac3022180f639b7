"""The new machines' IN-SPLIT rows only, grouped: what a choice may look at (issue 26). Held-out rows
(benchmarks/published.held_out, a hash of the configuration) are dropped BEFORE any row is predicted, so no held-out
row's error is ever computed here; hardware_accuracy.py prints every row, so it is run only once a choice is made.

Run: python benchmarks/in_split_rows.py [--clusters b200,gb200,b300,gb300] [--rows]
Prints the median signed error (predicted / measured - 1) and how many rows are too fast, by machine and precision,
by machine and source (Megatron-Bridge tables by release, MLPerf, NeMo, dgxc, torchtitan), and with --rows each row
with its layout, the share of its predicted step in GEMMs and the releases whose median it is.
"""

from __future__ import annotations

import statistics
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import hardware_accuracy  # noqa: E402  (one reading of a row)
import published  # noqa: E402

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
    return None if e["refused"] else {"layout": e["layout"].key(), "error": e["error"], "gemm": e["gemm"]}


def summary(label: str, groups: dict) -> None:
    print(f"\n== by {label}: rows, median signed error, too fast")
    for key, errors in sorted(groups.items()):
        print(f"  {' '.join(map(str, key)):34s} {len(errors):3d}  {100 * statistics.median(errors):+6.1f} %  "
              f"{sum(e > 0 for e in errors):3d}")


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
    show = "--rows" in args
    args = [a for a in args if a != "--rows"]
    if args and (args[0] != "--clusters" or len(args) != 2):
        print("usage: python benchmarks/in_split_rows.py [--clusters b200,gb200,b300,gb300] [--rows]", file=sys.stderr)
        sys.exit(2)
    main(tuple(args[1].split(",")) if args else BLACKWELL, show)
