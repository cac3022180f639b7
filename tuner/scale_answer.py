"""`tuner scale`'s answer as a library (tuner.planning.scale calls it, the CLI's `tuner scale` too): the checked
request, the best layout of every (cluster, framework, node count) -- measured where a stored study measured it,
else best's corrected prediction, in forked worker processes -- and the table tuner.scaling makes of them.
The application layer: it reads the store (read-only) and never imports tuner.cli.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tuner.errors import UsageError
from tuner.workers import fork_context, quiet_worker, usable_cpus


_SHARED: dict = {}         # what a forked worker reads: the space and each cluster's stored history


def _predicted(key, w):
    """best's corrected prediction for `w` (a node count nobody measured), or why there is none."""
    from tuner.best import best_for_unmeasured
    from tuner.scaling import Found, Refused
    space, histories = _SHARED["space"], _SHARED["histories"]
    records, studies = histories[w.cluster.name]
    try:
        r = best_for_unmeasured(w, space, records, k=1, studies=studies)[0]
    except UsageError as exc:
        return key, Refused(str(exc))
    return key, Found(r["layout"], r["samples_per_second"], tuple(r["samples_per_second_90"]), False,
                      r["evidence"]["note"])


def _measured(store, w):
    """The fastest measured (not simulated) stored trial of `w`, as a Found, or None."""
    from tuner.best import stored_best
    from tuner.correction import simulated
    from tuner.scaling import Found
    if store is None:
        return None
    found = [t for t in stored_best(store, w, 1) if not simulated(t)]
    if not found:
        return None
    t = found[0]
    return Found(t.layout, t.samples_per_second, None, True, f"measured: study {t.study} trial {t.number}")


def _answer_all(jobs_wanted: list[tuple], store, jobs: int) -> dict:
    """key -> Found | Refused for every (key, workload): measured ones from the store here, the predictions
    in `jobs` worker processes (forked: they share what was read) or in this one."""
    from tuner.scaling import Refused, feed_refusal
    out, todo = {}, []
    for key, w in jobs_wanted:
        why = feed_refusal(w, _SHARED["space"])
        got = Refused(why, "batch cannot feed") if why else _measured(store, w)
        if got is not None:
            out[key] = got
        else:
            todo.append((key, w))
    context = fork_context()
    if jobs > 1 and len(todo) > 1 and context is not None:
        from concurrent.futures import ProcessPoolExecutor
        with ProcessPoolExecutor(min(jobs, len(todo)), mp_context=context, initializer=quiet_worker) as pool:
            out.update(pool.map(_predicted, *zip(*todo)))
    else:
        out.update(_predicted(key, w) for key, w in todo)
    return out


@dataclass
class ScaleResult:
    """`tuner scale`'s answer: one row per (cluster, framework, node count) as its JSON, the point a
    deadline chose, and the notes that say what the figures rest on."""

    rows: list
    chosen: dict | None = None
    sentence: str = ""
    notes: list = field(default_factory=list)
    model: str = ""
    deadline: float | None = None

    def dataframe(self):
        import pandas as pd
        return pd.DataFrame([{k: v for k, v in r.items() if k != "phases"} for r in self.rows])


def _frameworks(framework, clusters, model, precision) -> tuple[dict, list[str]]:
    """cluster name -> frameworks to answer: the cluster's own (None), the ones named, or all that can
    run the model in this precision there ('all')."""
    from tuner.frameworks import NAMES
    from tuner.precision import refusal
    names = [f for f in str(framework).replace(" ", "").split(",") if f] if framework else []
    if names == ["all"]:
        out, notes = {}, []
        for c in clusters:
            out[c.name] = [fw for fw in NAMES if refusal(precision, c, fw) is None]
            notes += [f"{c.name}: {fw} left out: {refusal(precision, c, fw)}" for fw in NAMES if fw not in out[c.name]]
        return out, notes
    bad = [f for f in names if f not in NAMES]
    if bad:
        raise UsageError(f"--framework {framework}: {', '.join(bad)} is not one of {', '.join(NAMES)} (or all)")
    return {c.name: names or [c.framework] for c in clusters}, []

def scale_request(model, cluster, nodes, *, tokens=None, steps=None, framework=None, global_batch=None,
                  batch_schedule=None, batch_per_gpu=None, seq_length=None, precision="bf16", grad_reduce=None,
                  optimizer_moments=None, price=None, deadline=None, max_gpus=None):
    """The checked Request of `scale`'s arguments (UsageError naming the fix), and notes on the frameworks
    left out; nothing is predicted or read."""
    from tuner import scaling
    from tuner.specs import load_cluster, load_model, with_seq_length
    flags = [f for f, v in (("--global-batch", global_batch), ("--batch-schedule", batch_schedule),
                            ("--batch-per-gpu", batch_per_gpu)) if v is not None]
    if len(flags) > 1:
        raise UsageError(f"{' and '.join(flags)}: give one way of choosing the global batch")
    m = load_model(model, seq_length) if isinstance(model, str) else with_seq_length(model, seq_length)
    clusters = [load_cluster(c) if isinstance(c, str) else c for c in
                (cluster.replace(" ", "").split(",") if isinstance(cluster, str) else cluster)]
    if len({c.name for c in clusters}) < len(clusters):
        raise UsageError(f"--cluster {cluster} names a cluster twice: give each once")
    fws, notes = _frameworks(framework, clusters, m, precision)
    if optimizer_moments == "bf16":             # Megatron-Core's precision-aware optimizer: no other stack has it
        fws, notes = _with_bf16_moments(fws, notes, framework)
    gb = global_batch if global_batch is not None else (None if batch_schedule or batch_per_gpu else m.global_batch)
    if gb is None and not (batch_schedule or batch_per_gpu):
        raise UsageError(f"model '{m.name}' has no default global batch: pass --global-batch")
    batch = scaling.Batch(gb, scaling.parse_schedule(batch_schedule) if batch_schedule else (), batch_per_gpu)
    if isinstance(price, (int, float)) and not isinstance(price, bool):    # one number, as --price 2.5
        price = repr(float(price))
    elif price is not None and not isinstance(price, str):                 # a mapping, checked as --price's pairs
        price = ",".join(f"{k}={v}" for k, v in dict(price).items())
    prices = scaling.parse_prices(price, [c.name for c in clusters])
    req = scaling.Request(m, tuple(clusters), fws, scaling.parse_nodes(nodes) if isinstance(nodes, str)
                          else tuple(sorted(set(nodes))), batch, tokens, steps, precision, grad_reduce or "",
                          "" if optimizer_moments in (None, "fp32") else optimizer_moments, prices, deadline, max_gpus)
    scaling.check_request(req)
    return req, notes


def _with_bf16_moments(fws: dict, notes: list[str], framework) -> tuple[dict, list[str]]:
    """With Adam's moments in bf16: the stacks that have them (Megatron-Core); with --framework all the
    others left out and said so, else make_workload's refusal names the fix."""
    if str(framework).replace(" ", "") != "all":
        return fws, notes
    notes = notes + [f"{c}: {fw} left out: Adam's moments in bf16 are Megatron-Core's precision-aware optimizer"
                     for c, names in fws.items() for fw in names if fw != "megatron-core"]
    return {c: [fw for fw in names if fw == "megatron-core"] for c, names in fws.items()}, notes


def answer_scale(req, notes: list[str], store, space: str = "default", jobs: int | None = None,
                 framework: str | None = None) -> ScaleResult:
    """The ScaleResult of a checked Request: measured answers from `store` (a Store or None), predictions
    in `jobs` processes, the table, the frameworks --framework all found nothing for left out."""
    from tuner import scaling
    from tuner.best import history
    from tuner.space import load_space
    from tuner.specs import make_workload
    m = req.model
    wanted, skipped = scaling.points(req)
    _SHARED.update(space=load_space(space), histories={c.name: history(store, m.name, c.name) for c in req.clusters})
    jobs_wanted = {scaling.answer_key(c, fw, n, g):
                   make_workload(m, n, c, g, req.precision, fw, req.grad_reduce or None,
                                 optimizer_moments=req.optimizer_moments or None)
                   for c, fw, n, phases in wanted for _, g in phases}
    answers = _answer_all(list(jobs_wanted.items()), store, jobs or usable_cpus())
    rows, chosen, sentence = scaling.table(req, wanted, answers)
    rows, dropped = _drop_silent_frameworks(rows, framework)
    return ScaleResult(rows, chosen, sentence, notes + dropped + skipped + scaling.basis_notes(req, rows), m.name,
                       req.deadline_days)


def _drop_silent_frameworks(rows: list[dict], framework) -> tuple[list[dict], list[str]]:
    """With --framework all: the frameworks with no answer at any node count left out, saying why."""
    if str(framework).replace(" ", "") != "all":
        return rows, []
    keep, notes = [], []
    groups: dict = {}
    for r in rows:
        groups.setdefault((r["cluster"], r["framework"]), []).append(r)
    for (c, fw), rs in groups.items():
        if any(r["status"] == "ok" for r in rs):
            keep += rs
        else:
            notes.append(f"{c}: {fw} left out (no layout at any node count): {rs[0]['note'][:300]}")
    return keep, notes
