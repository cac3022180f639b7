"""A golden check of the performance model: every prediction and every plan ranking of a set of workloads,
dumped from one source tree and compared with another's, so a change meant to make `plan` / `scale` faster
(caching, pruning, reordering) is shown to leave every answer as it was.

    python benchmarks/golden_predictions.py dump OUT.json [--quick]      # this tree's answers
    python benchmarks/golden_predictions.py compare A.json B.json        # every difference, exit 1 if any
    python benchmarks/golden_predictions.py against REV [--quick]        # REV's committed tree vs this one

A dump holds, per workload (dense, MoE, MLA, uneven pipeline splits, cp, vp; Megatron-DeepSpeed,
Megatron-Core, torchtitan; Frontier, H100, H200, GB200): the enumerated layouts in order, plan's full
ranking (`rank`), every layout's step time, samples/s, MFU, TFLOPS, memory, p_fit, fits, stage and
reason, and the whole time and memory breakdown of every 5th layout; and `best_for_unmeasured`'s top 5
(what `tuner scale` answers) with no stored history. Floats are compared to 1e-12 relative (repr-equal
unless noted). The model and cluster files are read from the tree being dumped (by path), so `against`
compares two trees whole; `--quick` leaves out the two largest plans.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: (name, model, cluster, nodes, framework, precision, seq_length, pins); pins fix dimensions of the
#: default space as `plan --tp ...` does.
WORKLOADS = [
    ("175b-frontier-128", "gpt-175b", "frontier", 128, None, "bf16", None, {}),
    ("175b-frontier-mcore-32", "gpt-175b", "frontier", 32, "megatron-core", "bf16", None, {}),
    ("llama3-405b-h100-64", "llama3-405b", "h100", 64, None, "bf16", None, {}),
    ("llama3-70b-h100-16-tt-32k", "llama3-70b", "h100", 16, "torchtitan", "bf16", 32768, {}),
    ("llama3-8b-h100-4-fp8", "llama3-8b", "h100", 4, None, "fp8", None, {}),
    ("mixtral-8x7b-h200-16", "mixtral-8x7b", "h200", 16, None, "bf16", None, {}),
    ("mixtral-8x22b-h100-16-tt", "mixtral-8x22b", "h100", 16, "torchtitan", "bf16", None, {}),
    ("qwen3-30b-a3b-h100-2", "qwen3-30b-a3b", "h100", 2, None, "bf16", None, {}),
    ("bloom-176b-a100-48-mds", "bloom-176b", "a100", 48, "megatron-deepspeed", "bf16", None, {}),
    ("llama3-70b-gb200-16", "llama3-70b", "gb200", 16, None, "bf16", None, {}),
    ("deepseek-v3-h100-128-ep64", "deepseek-v3", "h100", 128, None, "bf16", None, {"expert_parallel": 64}),
    ("qwen3-235b-a22b-h100-32", "qwen3-235b-a22b", "h100", 32, None, "bf16", None, {}),
]
QUICK_SKIP = {"deepseek-v3-h100-128-ep64", "qwen3-235b-a22b-h100-32"}
HEADLINE = ("step_time_s", "samples_per_second", "mfu", "tflops_per_gpu", "peak_fraction", "memory_gb", "p_fit",
            "fits", "memory_stage", "reason")
BREAKDOWN_EVERY = 5
REL = 1e-12


def _workload(model, cluster, nodes, framework, precision, seq_length):
    from tuner.specs import make_workload
    tree = Path(__import__("tuner").__file__).resolve().parents[1] / "workloads"
    return make_workload(str(tree / "models" / f"{model}.toml"), nodes, str(tree / "clusters" / f"{cluster}.toml"),
                         None, precision, framework, None, seq_length)


def dump_one(name, model, cluster, nodes, framework, precision, seq_length, pins) -> dict:
    from tuner.best import best_for_unmeasured
    from tuner.perfmodel import rank
    from tuner.space import load_space, valid_layouts
    tree = Path(__import__("tuner").__file__).resolve().parents[1]
    w = _workload(model, cluster, nodes, framework, precision, seq_length)
    sp = load_space(str(tree / "search_spaces" / "default.toml")).pinned(pins)
    t0 = time.perf_counter()
    layouts = valid_layouts(sp, w)
    ranked = rank(layouts, w)
    seconds = time.perf_counter() - t0
    by_key = {p.layout.key(): p for p in ranked}
    rows = {}
    for i, lay in enumerate(layouts):
        p = by_key[lay.key()]
        row = {k: getattr(p, k) for k in HEADLINE}
        if i % BREAKDOWN_EVERY == 0:
            row["time"], row["memory"] = p.time_breakdown, p.memory_breakdown
        rows[lay.key()] = row
    best = best_for_unmeasured(w, sp, [], k=5)
    best = [{k: (v.key() if k == "layout" else v) for k, v in r.items()} for r in best]
    return {"layouts": [lay.key() for lay in layouts], "ranking": [p.layout.key() for p in ranked], "rows": rows,
            "best": best, "seconds": seconds, "self_check": self_check(layouts, w, ranked, sp)}


def self_check(layouts, w, ranked, sp) -> list[str]:
    """Within this tree: every third layout predicted alone (no memo) as `rank` predicted it, best's answer as
    without its shortcut (likely_to_fit), and plan's shortcut (`rank_shown`: the top rows and the counts, with
    and without --all) as `rank`'s; what differs."""
    from tuner.perfmodel import predict
    try:
        from tuner.perfmodel.screening import rank_shown
    except ImportError:          # a tree before plan's shortcut
        rank_shown = None
    bad = []
    by_key = {p.layout.key(): p for p in ranked}
    for i, lay in enumerate(layouts):
        if i % 3 == 0 and predict(lay, w) != by_key[lay.key()]:
            bad.append(f"{lay.key()}: predicted alone differs from rank's")
    import tuner.best as best_module
    if hasattr(best_module, "likely_to_fit"):        # best's shortcut against its full path (no shortcut taken)
        quick = best_module.best_for_unmeasured(w, sp, [], k=5)
        kept, best_module.likely_to_fit = best_module.likely_to_fit, lambda *a: []
        try:
            full = best_module.best_for_unmeasured(w, sp, [], k=5)
        finally:
            best_module.likely_to_fit = kept
        if not _same(*(json.loads(json.dumps([{k: (v.key() if k == "layout" else v) for k, v in r.items()}
                                                for r in rows], default=str)) for rows in (quick, full))):
            bad.append("best_for_unmeasured's shortcut differs from its full path")
    if rank_shown is not None:
        for top, show_all in ((10, False), (len(layouts), True), (None, False)):
            got = rank_shown(layouts, w, top, show_all)
            want = [p for p in ranked if show_all or p.fits][:top]
            if got.shown != want:
                bad.append(f"rank_shown(top={top}, show_all={show_all}) differs from rank's")
            if [(s.layout, s.memory_gb, s.p_fit, s.fits) for s in got.screened] != \
                    [(lay, by_key[lay.key()].memory_gb, by_key[lay.key()].p_fit, by_key[lay.key()].fits)
                     for lay in layouts]:
                bad.append("rank_shown's screened memory differs from rank's")
    return bad


def dump(out: str, quick: bool) -> None:
    got = {}
    for wl in WORKLOADS:
        if quick and wl[0] in QUICK_SKIP:
            continue
        got[wl[0]] = dump_one(*wl)
        print(f"  {wl[0]}: {len(got[wl[0]]['layouts'])} layouts, enumerate + rank {got[wl[0]]['seconds']:.1f} s",
              file=sys.stderr)
    Path(out).write_text(json.dumps(got, default=str))


def _same(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (math.isfinite(a) and abs(a - b) <= REL * max(abs(a), abs(b)))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def compare(a_path: str, b_path: str) -> int:
    """Print every difference between two dumps; the number of differing items."""
    a, b = json.loads(Path(a_path).read_text()), json.loads(Path(b_path).read_text())
    bad = 0
    for name in a:
        if name not in b:
            print(f"{name}: only in {a_path}")
            bad += 1
            continue
        x, y = a[name], b[name]
        for part in ("layouts", "ranking"):
            if x[part] != y[part]:
                first = next((i for i, (p, q) in enumerate(zip(x[part], y[part])) if p != q),
                             min(len(x[part]), len(y[part])))
                print(f"{name}: {part} differ ({len(x[part])} vs {len(y[part])}; first at {first})")
                bad += 1
        diff = [k for k in x["rows"] if k not in y["rows"] or not _same(x["rows"][k], y["rows"][k])]
        for k in diff[:5]:
            print(f"{name}: {k}: {x['rows'][k]} vs {y['rows'].get(k)}")
        bad += len(diff)
        for tree, z in ((a_path, x), (b_path, y)):
            for line in z.get("self_check", [])[:5]:
                print(f"{name}: in {tree}: {line}")
            bad += len(z.get("self_check", []))
        if not _same(x["best"], y["best"]):
            print(f"{name}: best_for_unmeasured differs")
            bad += 1
        print(f"{name}: {len(x['rows'])} layouts, {len(diff)} differ; enumerate + rank {x['seconds']:.1f} s -> "
              f"{y['seconds']:.1f} s")
    print(f"{bad} difference(s)")
    return bad


def against(rev: str, quick: bool) -> int:
    """Dump REV's committed tree (git archive) and this working tree, and compare them."""
    with tempfile.TemporaryDirectory() as tmp:
        old = Path(tmp) / "old"
        old.mkdir()
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "tuner", "workloads", "search_spaces"],
                                 capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(old)], input=archive, check=True)
        outs = []
        for tree in (old, ROOT):
            out = Path(tmp) / f"{len(outs)}.json"
            env = {**os.environ, "PYTHONPATH": str(tree)}
            cmd = [sys.executable, str(ROOT / "benchmarks" / "golden_predictions.py"), "dump", str(out)]
            subprocess.run(cmd + (["--quick"] if quick else []), env=env, cwd=tree, check=True)
            outs.append(out)
        return compare(*map(str, outs))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("dump")
    d.add_argument("out")
    d.add_argument("--quick", action="store_true")
    c = sub.add_parser("compare")
    c.add_argument("a")
    c.add_argument("b")
    g = sub.add_parser("against")
    g.add_argument("rev")
    g.add_argument("--quick", action="store_true")
    a = ap.parse_args(argv)
    if a.cmd == "dump":
        dump(a.out, a.quick)
    elif a.cmd == "compare":
        sys.exit(1 if compare(a.a, a.b) else 0)
    else:
        sys.exit(1 if against(a.rev, a.quick) else 0)


if __name__ == "__main__":
    main()
