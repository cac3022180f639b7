"""Regenerate data/xla_matmul.csv and data/xla_collectives.csv from OpenXLA's measured performance tables.

Source: OpenXLA's GPU cost model tables, measured by its perf-table generators (matmul_perf_table_gen,
collective_perf_table_gen) and shipped with XLA:
  xla/service/gpu/model/matmul_interpolator_data.h      (kDefaultMatmulPTable: FLOP/s per (b, m, n, k, dtype))
  xla/service/gpu/model/collective_interpolator_data.h  (kDefaultCollectivePTable: bytes/s per op, size, group)
read at github.com/ROCm/xla commit d02afb4fc18aa82cf9a8824672fc5eba298b66aa (2026-07-03; the ROCm fork
carries OpenXLA's files unchanged plus the gfx942 tables). Hardware keys: sm_90 (H100 SXM), gfx942 (MI300X).

    git -C <xla mirror> show d02afb4f:xla/service/gpu/model/matmul_interpolator_data.h > mm.h
    git -C <xla mirror> show d02afb4f:xla/service/gpu/model/collective_interpolator_data.h > coll.h
    python benchmarks/worlds_ext/extract_xla.py mm.h coll.h
"""

from __future__ import annotations

import csv
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent / "data"
HARDWARE = ("sm_90", "gfx942")
DTYPES = {"bf16xbf16->bf16": "bf16", "f8e4m3fnxf8e4m3fn->bf16": "fp8"}
BYTES = {"F32": 4, "BF16": 2}


def _sections(text: str) -> dict[str, str]:
    parts = re.split(r'\n    key: "([A-Za-z0-9_]+)"\n', text)
    return dict(zip(parts[1::2], parts[2::2]))


def matmul_rows(text: str) -> list[tuple]:
    rows = []
    for hw, body in _sections(text).items():
        if hw not in HARDWARE:
            continue
        for b, m, n, k, flops in re.findall(r"entries \{\s*b: (\d+)\s*m: (\d+)\s*n: (\d+)\s*k: (\d+)\s*"
                                            r"((?:flops \{[^}]*\}\s*)+)\}", body):
            for key, value in re.findall(r'key: "([^"]+)"\s*value: (\d+)', flops):
                if key.lower() in DTYPES:
                    rows.append((hw, int(b), int(m), int(n), int(k), DTYPES[key.lower()], int(value)))
    return sorted(rows)


def _entries(body: str) -> list[str]:
    """The text of each `entries { ... }` of a hardware section (split where the next one opens)."""
    return re.split(r"\n\s*entries \{\s*\n\s*instruction \{", body)[1:]


def _permute_group(entry: str) -> int:
    """The group a collective-permute's source_target_pairs exchange within: 2 where every device swaps with one
    partner or sends to one partner (a pipeline's send to its neighbour stage), else the devices the pattern spans
    (a ring shift over all eight)."""
    pairs = [(int(s or 0), int(t or 0)) for s, t in
             re.findall(r"source_target_pairs \{\s*(?:source: (\d+))?\s*(?:target: (\d+))?\s*\}", entry)]
    sources = {s for s, _ in pairs}
    cycle = all((t, s) in pairs for s, t in pairs) or not any(t in sources for _, t in pairs)
    return 2 if cycle else len({d for p in pairs for d in p})


def collective_rows(text: str) -> list[tuple]:
    """(hardware, op, bytes, group size, groups, bytes/s) of each measured entry. A collective-permute states
    source_target_pairs, not replica groups: its group is the pattern's (_permute_group; 8 // size groups)."""
    rows = []
    for hw, body in _sections(text).items():
        if hw not in HARDWARE:
            continue
        for entry in _entries(body):
            op = re.search(r'opcode: "([a-z-]+)"', entry)
            bps = re.search(r"network_throughput_bytes_per_sec: (\d+)", entry)
            if not op or not bps:
                continue
            et, n = re.search(r"element_type: (\w+)\s*dimensions: (\d+)", entry).groups()
            if op.group(1) == "collective-permute":
                size = _permute_group(entry)
                groups = 8 // size
            else:
                groups, size = map(int, re.search(r"num_replica_groups: (\d+)\s*num_devices_per_group: (\d+)",
                                                  entry).groups())
            rows.append((hw, op.group(1), int(n) * BYTES[et], size, groups, int(bps.group(1))))
    return sorted(set(rows))


def main(argv: list[str]) -> int:
    mm, coll = (Path(p).read_text() for p in argv[:2])
    with open(HERE / "xla_matmul.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["hardware", "b", "m", "n", "k", "dtype", "flops_per_s"])
        w.writerows(matmul_rows(mm))
    with open(HERE / "xla_collectives.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["hardware", "op", "bytes", "group_size", "groups", "bytes_per_s"])
        w.writerows(collective_rows(coll))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
