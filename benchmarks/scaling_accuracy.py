"""How well tuner predicts strong- and weak-scaling efficiency: published series against `tuner scale`.

    python benchmarks/scaling_accuracy.py [--series SUBSTRING]

Every series of benchmarks/data/scaling_published.toml (sources there and in the rows' files) is the same
training at several GPU counts. A point's efficiency is its per-GPU rate over the series' first point's
(MFU, TFLOP/s per GPU or tokens/s per GPU: ratios of one count, so the count's convention cancels).
Predicted two ways, both by the performance model alone (no store, nothing fitted here):

- answer: the layout `tuner scale` / `tuner best` recommends at each point (the default space), its MFU;
- published layout: the dimensions the source states pinned (a row's whole layout; a table's TP and PP),
  the rest the model's best (`tuner plan`'s ranking), its MFU.

Prints every point, per series, and the median and worst |delta efficiency| over the points past each
series' first (the first is 1 by definition), for all points, for the points of published rows that
benchmarks/published.py calls clean for speed (hashed out and seen by no speed choice), for the points
given in the toml that no choice saw (a given series a choice saw names it in `seen`: column clean "seen"),
and for those two together (every point no choice saw).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import tomllib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import published  # noqa: E402  (benchmarks/published.py: the split and what saw which row)
from framework_accuracy import layout_of  # noqa: E402  (a published row's layout, as its accuracy benchmark reads it)
import reading  # noqa: E402  (one reading of a run for every accuracy benchmark: its attention kernel)
from tuner.best import best_for_unmeasured  # noqa: E402
from tuner.errors import TunerError  # noqa: E402
from tuner.perfmodel import expected_speed, predict, rank  # noqa: E402
from tuner.perfmodel.moe_exchange import TokenExchange  # noqa: E402
from tuner.space import load_space  # noqa: E402
from tuner.specs import ModelSpec, load_cluster, load_model, make_workload  # noqa: E402

DATA = Path(__file__).resolve().parent / "data"
PREDICTED_AS = {"fsdp": "torchtitan"}          # tuner's stack for FSDP (benchmarks/framework_accuracy.py)
SPACE = load_space()


def model_of(spec, seq_length: int | None = None) -> ModelSpec:
    m = ModelSpec.from_dict(dict(spec), "scaling_published.toml") if isinstance(spec, dict) else load_model(spec)
    if seq_length and seq_length != m.seq_length:
        import dataclasses
        m = dataclasses.replace(m, seq_length=seq_length)
    return m


def given_series(s: dict) -> list[dict]:
    """A series given point by point: each point's workload arguments, pins and published value."""
    points = []
    for p in s["point"]:
        points.append({"gpus": p["gpus"], "global_batch": p["global_batch"], "value": p["value"],
                       "model": model_of(p.get("model", s.get("model"))), "pins": {**s.get("pins", {}),
                                                                                  **p.get("pins", {})},
                       "layout": None, "clean": None, "source": s["source"], "grad_reduce": s.get("grad_reduce"),
                       "optimizer_moments": s.get("optimizer_moments"), "ran_attention": s.get("ran_attention")})
    return [{"name": s["name"], "kind": s["kind"], "framework": s["framework"], "cluster": s["cluster"],
             "precision": s["precision"], "metric": s["metric"], "points": points, "overlaps": s.get("overlaps"),
             "seen": list(s.get("seen", []))}]


def _row_layout(r: dict):
    return layout_of(r, PREDICTED_AS.get(r.get("framework"), r.get("framework")))


def _matches(r: dict, match: dict) -> bool:
    """A row matches when every key is equal, or starts with a value that ends in '*'."""
    return all(str(r.get(k, "")).startswith(v[:-1]) if isinstance(v, str) and v.endswith("*") else r.get(k) == v
               for k, v in match.items())


def _row_key(r: dict) -> tuple:
    lay = _row_layout(r)
    return (lay.tp, lay.pp, lay.context_parallel, lay.virtual_pipeline, lay.micro_batch, lay.recompute,
            lay.sequence_parallel, lay.zero_stage, r["global_batch"] / r["gpus"], r["cluster"], r["seq_length"])


def row_series(s: dict) -> list[dict]:
    """The published rows a series matches, split by layout and per-GPU batch: one weak series per split
    with two or more GPU counts; rows of one configuration at one GPU count give their median."""
    with open(DATA / s["rows_from"], "rb") as f:
        rows = [{**r, "file": s["rows_from"]} for r in tomllib.load(f)["row"]]
    rows = [r for r in rows if _matches(r, s["match"])]
    groups: dict = {}
    for r in rows:
        groups.setdefault(_row_key(r), {}).setdefault(r["gpus"], []).append(r)
    out = []
    for key, by_gpus in groups.items():
        if len(by_gpus) < 2:
            continue
        points = []
        for gpus, rs in sorted(by_gpus.items()):
            r = rs[0]
            points.append({"gpus": gpus, "global_batch": r["global_batch"],
                           "value": statistics.median(x["tokens_per_s_per_gpu"] for x in rs),
                           "model": model_of(r["model"], r["seq_length"]), "pins": None, "layout": _row_layout(r),
                           "clean": all(published.clean(x, "speed") for x in rs), "source": r["source"],
                           "grad_reduce": published.grad_reduce(r) if r.get("framework") == "megatron-core" else None,
                           "ran_attention": r.get("ran_attention")})
        lay = points[0]["layout"]
        out.append({"name": f"{s['name']} [{lay.key()}]" if len(groups) > 1 else s["name"], "kind": s["kind"],
                    "framework": PREDICTED_AS.get(rows[0]["framework"], rows[0]["framework"]),
                    "cluster": key[-2], "precision": rows[0]["precision"], "metric": "tokens_per_s_per_gpu",
                    "points": points})
    return out


def load_series(path: Path = DATA / "scaling_published.toml") -> list[dict]:
    with open(path, "rb") as f:
        data = tomllib.load(f)
    return [x for s in data["series"] for x in (row_series(s) if "rows_from" in s else given_series(s))]


def workload(series: dict, p: dict):
    cluster = load_cluster(series["cluster"])
    if p["gpus"] % cluster.gpus_per_node:
        raise ValueError(f"{series['name']}: {p['gpus']} GPUs is not a whole number of {cluster.name} nodes")
    return make_workload(p["model"], p["gpus"] // cluster.gpus_per_node, cluster, p["global_batch"],
                         series["precision"], series["framework"], p.get("grad_reduce"),
                         optimizer_moments=p.get("optimizer_moments"))


def as_run(series: dict) -> TokenExchange | None:
    """The series' run where it is not the framework's current release: `overlaps` (the overlaps that
    release had; [] for a Megatron-LM older than all of them), credited at the published layout only."""
    return None if series.get("overlaps") is None else TokenExchange(overlaps=frozenset(series["overlaps"]))


def _best_pinned(layouts, w, exchange: TokenExchange | None):
    """The best layout that fits among `layouts`, as `tuner plan` ranks them, predicted as the run ran."""
    if exchange is None:
        ranked = rank(layouts, w)
    else:
        ranked = sorted((predict(lay, w, exchange) for lay in layouts), key=lambda pr: (not pr.fits, -expected_speed(pr)))
    ranked = [x for x in ranked if x.fits]
    return ranked[0] if ranked else None


def _mfu_as_ran(pr, p: dict, w, exchange: TokenExchange | None) -> float:
    """MFU of pinned prediction `pr` with the attention kernel the point's launch ran (`ran_attention`,
    benchmarks/speed_as_ran.attention_kernel_s): the published layout's as it ran; tuner's answer is tuner's own."""
    extra = reading.attention_kernel_s(p, pr.layout, w, exchange, pr)
    return pr.mfu * pr.step_time_s / (pr.step_time_s + extra) if extra else pr.mfu


def predicted_mfu(series: dict, p: dict) -> tuple[float | None, float | None, str]:
    """(MFU of tuner's answer, MFU at the published layout, a note): None where the model refuses."""
    w = workload(series, p)
    note = ""
    try:
        answer = best_for_unmeasured(w, SPACE, [], k=1)[0]["mfu"]
    except TunerError as exc:
        answer, note = None, f"answer: {str(exc)[:90]}"
    try:
        if p["layout"] is not None:
            from tuner.layout import validate
            pinned = _mfu_as_ran(predict(validate(p["layout"], w), w, as_run(series)), p, w, as_run(series))
        else:
            from tuner.space import valid_layouts
            top = _best_pinned(valid_layouts(SPACE.pinned(p["pins"]), w), w, as_run(series))
            pinned = _mfu_as_ran(top, p, w, as_run(series)) if top else None
            note = note or ("" if top else "published layout: none of the pinned layouts fits")
    except TunerError as exc:
        pinned, note = None, note or f"published layout: {str(exc)[:90]}"
    return answer, pinned, note


def evaluate(series: dict) -> list[dict]:
    base = series["points"][0]
    mfus = [predicted_mfu(series, p) for p in series["points"]]
    out = []
    for p, (ans, pin, note) in zip(series["points"], mfus):
        eff = p["value"] / base["value"]
        row = {"series": series["name"], "kind": series["kind"], "gpus": p["gpus"], "published": eff,
               "clean": p["clean"], "seen": bool(series.get("seen")), "note": note, "first": p is base,
               "abs": pin / p["value"] - 1.0 if pin is not None and series["metric"] == "mfu" else None}
        for label, v, v0 in (("answer", ans, mfus[0][0]), ("pinned", pin, mfus[0][1])):
            row[label] = None if v is None or v0 is None else v / v0
        out.append(row)
    return out


def _clean_mark(r: dict) -> str:
    """yes / no: a published row's split (clean for speed); seen: a given series a choice saw; -: a given one."""
    if r["clean"] is None:
        return "seen" if r["seen"] else "-"
    return "yes" if r["clean"] else "no"


def unseen_point(r: dict) -> bool:
    """A point no choice saw: a published row's, clean for speed, or a given series' not marked `seen`."""
    return bool(r["clean"]) if r["clean"] is not None else not r["seen"]


def summary(label: str, deltas: list[float]) -> str:
    if not deltas:
        return f"{label}: no points"
    return (f"{label}: median |delta efficiency| {statistics.median(deltas):.3f}, worst {max(deltas):.3f} "
            f"({len(deltas)} points)")


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--series", default="", help="only the series whose name contains this")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    rows = [r for s in load_series() if args.series in s["name"] for r in evaluate(s)]
    fmt = lambda v: "-" if v is None else f"{v:.3f}"      # noqa: E731
    print(f"{'series':70s} {'kind':6s} {'gpus':>5s} {'published':>9s} {'answer':>7s} {'d':>7s} {'pinned':>7s} "
          f"{'d':>7s} {'mfu err':>8s}  clean  note")
    for r in rows:
        d = [None if r[k] is None else r[k] - r["published"] for k in ("answer", "pinned")]
        ab = "-" if r["abs"] is None else f"{100 * r['abs']:+.1f}%"      # MFU at the published layout / published - 1
        print(f"{r['series'][:70]:70s} {r['kind']:6s} {r['gpus']:5d} {r['published']:9.3f} {fmt(r['answer']):>7s} "
              f"{fmt(d[0]) if d[0] is None else f'{d[0]:+.3f}':>7s} {fmt(r['pinned']):>7s} "
              f"{fmt(d[1]) if d[1] is None else f'{d[1]:+.3f}':>7s} {ab:>8s}  {_clean_mark(r):5s}  {r['note']}")
    later = [r for r in rows if not r["first"]]
    result = {}
    print()
    for label, key in (("tuner's answer (what `tuner scale` says)", "answer"), ("at the published layout", "pinned")):
        for kind in ("strong", "weak", None):
            got = [abs(r[key] - r["published"]) for r in later if r[key] is not None and kind in (None, r["kind"])]
            print(summary(f"{label}, {kind or 'all'}", got))
            result[(key, kind)] = statistics.median(got) if got else None
        clean = [abs(r[key] - r["published"]) for r in later if r[key] is not None and r["clean"]]
        print(summary(f"{label}, points of published rows clean for speed (held out, seen by no speed choice)", clean))
        print(summary(f"{label}, points given in scaling_published.toml that no choice saw (its `seen`)",
                      [abs(r[key] - r["published"]) for r in later
                       if r[key] is not None and r["clean"] is None and not r["seen"]]))
        unseen = [abs(r[key] - r["published"]) for r in later if r[key] is not None and unseen_point(r)]
        print(summary(f"{label}, every point no choice saw (the two lines above together)", unseen))
        result[(key, "unseen")] = statistics.median(unseen) if unseen else None
    refused = [r for r in later if r["answer"] is None or r["pinned"] is None]
    print(f"\n{len(rows)} points in {len({r['series'] for r in rows})} series; {len(refused)} later point(s) the model "
          f"refused one way (note); {time.perf_counter() - t0:.0f} s")
    return result


if __name__ == "__main__":
    main()
