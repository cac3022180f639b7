"""How much of the correction learned at N should `best --nodes 2N` carry? A diagnostic (issue 30 item 3).

For each world of benchmarks/worlds_ext (seeds drawn at run time, printed; `--seed-list` reproduces a run), the
10-trial guided study at N exactly as `ext_search.py --transfer` runs it, then `best_for_unmeasured`'s rows at 2N
ranked five ways: by log(model's prediction) + SHARE * (log(corrected) - log(model's prediction)), SHARE in
SHARES (1.0 is what `best` ranks by today; 0.0 the model alone), layouts that keep the memory headroom first as
`best` does. Prints per world and seed the world's true speed of each ranking's pick / the 2N fastest, then per
world the median / worst seed. Nothing here is used by tuner: it says whether a shrunk correction would transfer
better, before anyone builds one.

    python benchmarks/transfer_share.py [--seeds 3] [--seed-list 1,2,3] [--families gemm-roofline,moe]
"""

from __future__ import annotations

import argparse
import math
import os
import secrets
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import ext_search  # noqa: E402  (the study at N as the search benchmark runs it)
from worlds_ext import FAMILIES, WORKLOADS, draw_world  # noqa: E402

from tuner.best import best_for_unmeasured  # noqa: E402
from tuner.space import load_space  # noqa: E402
from tuner.specs import make_workload  # noqa: E402

SHARES = (0.0, 0.25, 0.5, 0.75, 1.0)


def picks_at_2n(family: str, case: int, seed: int) -> tuple[str, list[float]]:
    """(the world's label, each share's pick at 2N as a fraction of the world's 2N fastest)."""
    world = draw_world(family, case, seed)
    w = world.workload
    trials, _, _ = ext_search.run_study(world, "guided", seed, 10, {"stop_threshold": None})
    space = load_space(world.space) if isinstance(world.space, str) else world.space
    w2 = make_workload(w.model, 2 * w.nodes, w.cluster, framework=w.framework)
    rows = best_for_unmeasured(w2, space, trials, k=10 ** 6, studies=None)
    roomy = [r for r in rows if r["headroom_ok"]] or rows
    world2 = world.at_nodes(2 * w.nodes)
    fastest = world2.optimum()[1]
    out = []
    for share in SHARES:
        def score(r, share=share):
            raw = math.log(r["raw_samples_per_second"])
            return raw + share * (math.log(r["samples_per_second"]) - raw)
        pick = max(roomy, key=score)
        out.append((world2.truth(pick["layout"])[0] or 0.0) / fastest)
    return world.label, out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=3, help="seeds drawn at run time")
    ap.add_argument("--seed-list", default="", help="comma-separated seeds to reproduce a run")
    ap.add_argument("--families", default="", help=f"comma-separated, of {', '.join(FAMILIES)} (default all)")
    args = ap.parse_args(argv)
    seeds = ([int(s) for s in args.seed_list.split(",")] if args.seed_list
             else [secrets.randbits(31) for _ in range(args.seeds)])
    families = args.families.split(",") if args.families else list(FAMILIES)
    print(f"seeds: {','.join(map(str, seeds))}  (reproduce: --seed-list {','.join(map(str, seeds))})")
    print("share of the correction:", "  ".join(f"{s:g}" for s in SHARES), flush=True)
    results: dict = {}
    for family in families:
        for case in range(len(WORKLOADS[family])):
            for seed in seeds:
                label, fr = picks_at_2n(family, case, seed)
                results.setdefault((family, label), []).append(fr)
                print(f"  {family:14} {label:32} {seed:>10}  " + "  ".join(f"{x:.3f}" for x in fr), flush=True)
    print("\nper world, median / worst seed, for each share:")
    for (family, label), rows in results.items():
        cols = list(zip(*rows))
        print(f"{family:14} {label:32} " + "  ".join(f"{statistics.median(c):.3f}/{min(c):.3f}" for c in cols))
    per_share = [sum(statistics.median(list(zip(*rows))[i]) >= 0.95 for rows in results.values())
                 for i in range(len(SHARES))]
    print("worlds with a median >= 0.95: " + "  ".join(f"share {s:g}: {n} of {len(results)}"
                                                       for s, n in zip(SHARES, per_share)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
