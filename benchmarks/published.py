"""Published and measured rows, as every accuracy benchmark reads them: one configuration is one row.

Run: python benchmarks/published.py [--write]   (prints the distinct configurations and the held-out ones;
--write rewrites benchmarks/data/held_out.txt from the rule, which tests/test_published_split.py checks)

- Rows come from the published data files (`PUBLISHED`: NVIDIA's recipes and performance pages,
  torchtitan's tables, MosaicML llm-foundry's FSDP tables, Megatron-Bridge's MoE rows) and the memory
  measurements taken over the frameworks' own code on this machine (`MEASURED`: fake-tensor runs of
  Megatron-Core's GPTModel and torchtitan's Llama 3 with FSDP2).
- A configuration is what ran, never where it was read: framework, model (or its shape), cluster, GPUs,
  precision, sequence, batch, the layout and the knobs that change memory or speed (`CONFIG_KEYS`). The
  same configuration in two files (torchtitan's tables are in both published files) or in two releases
  is ONE distinct row (`distinct`): its measurements are kept together (the median is its value), so it
  cannot land on both sides of the split.
- Held out: a third of the distinct configurations, by a hash of the configuration alone (`held_out`);
  no source, release or line number enters the hash. The list is committed in data/held_out.txt
  (before any constant of the memory fit was chosen), and a test checks that the file is the rule.
- A choice that saw rows names them (`SEEN`, benchmarks/seen.py): a benchmark counts as "held out" only held-out
  configurations that no choice saw (`clean`).
"""

from __future__ import annotations

import sys
from pathlib import Path

if str(Path(__file__).resolve().parent) not in sys.path:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
# Reading, dedup and the split are benchmarks/published_rows.py's; what saw which row (SEEN, HARDWARE_SEEN,
# clean, ...) is benchmarks/seen.py's and hardware_seen.py's: every name stays importable from here.
from published_rows import (  # noqa: E402,F401
    CONFIG_KEYS, DATA, HARDWARE, HELD_OUT_FILE, MEASURED, PUBLISHED, ROW_MODEL_KEYS, SHAPE_KEYS, UNSTATED_GRAD_REDUCE,
    _load, _merge, config_key, custom_model, distinct, grad_reduce, hardware, held_out, held_out_lines, loss_of,
    measured, published, split_key, zero_stage)
from seen import (BATCHES, SEEN, _any_source, _bucket_moved, _legacy_third, _saw,  # noqa: E402,F401
                  _seen_configurations, clean, seen_by)
from hardware_seen import HARDWARE_SEEN, _hardware_seen, hardware_clean  # noqa: E402,F401


def main(write: bool = False) -> None:
    pub, mea = published(), measured()
    raw = len(_load(PUBLISHED))
    print(f"published: {raw} rows in {len(PUBLISHED)} files -> {len(pub)} distinct configurations; "
          f"measured memory: {len(mea)} configurations")
    hw = hardware()
    print(f"new machines (issue 26): {len(_load(HARDWARE))} rows -> {len(hw)} distinct configurations, "
          f"{sum(held_out(r) for r in hw)} held out")
    for label, rows in (("published", pub), ("measured", mea)):
        for fw in sorted({r["framework"] for r in rows}):
            mine = [r for r in rows if r["framework"] == fw]
            ho = [r for r in mine if held_out(r)]
            print(f"  {label:9s} {fw:18s} {len(mine):4d} configurations, {len(ho):3d} held out; seen by no "
                  f"speed choice {sum(clean(r, 'speed') for r in mine):3d}, by no memory choice "
                  f"{sum(clean(r, 'memory') for r in mine):3d}")
    if write:
        HELD_OUT_FILE.write_text("# held-out configurations (benchmarks/published.py held_out), one per line\n"
                                 + "\n".join(held_out_lines()) + "\n")
        print(f"wrote {HELD_OUT_FILE}")


if __name__ == "__main__":
    main(write="--write" in sys.argv)
