"""`tuner scale`: how many nodes, which machine, how long and how much. Pure (no I/O).

For every (cluster, framework, node count) a Request names, the library (tuner.planning) answers each
global batch the run trains at with the layout `tuner best` answers (a study's measured trial where one
measured that workload; else the performance model, corrected by measurements at other node counts, with
best's 90 % interval). This module turns those answers into the table:

- time to train: tokens / (samples/s x sequence), per batch phase, divided by the goodput
  (tuner.goodput: failures, checkpoints, restarts): days; gpu_hours = days x 24 x GPUs exactly;
  cost = gpu_hours x the cluster's --price; energy_mwh = node power x nodes x days x 24 / 1000;
- the global batch as trained: fixed tokens per step (the workload's global batch), a schedule
  (global batch by tokens seen) or weak scaling (--batch-per-gpu x GPUs). A node count whose
  data-parallel degree the batch cannot feed says so (`feed_refusal`), with no layout invented;
- the Pareto set of days against cost (GPU-hours without prices) and, with a deadline, the cheapest
  point that meets it.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from tuner.errors import UsageError
from tuner.goodput import goodput, operation
from tuner.perfmodel.flops import model_flops

MAX_NODE_COUNTS = 64          # node counts one request may ask for


# ------------------------------------------------------------------------------------------- parsing

def parse_nodes(text: str) -> tuple[int, ...]:
    """'16,32,64', '16:512' (doubling from 16 to 512) or both ('8,16:128'), as sorted distinct counts."""
    out: set[int] = set()
    for part in str(text).replace(" ", "").split(","):
        m = re.fullmatch(r"(\d+)(?::(\d+))?", part)
        if not m or int(m.group(1)) < 1 or (m.group(2) and int(m.group(2)) < int(m.group(1))):
            raise UsageError(f"--nodes {text}: give node counts as 16,32,64 or a range FROM:TO doubling from "
                             "FROM (16:512), FROM >= 1 and TO >= FROM")
        n, last = int(m.group(1)), int(m.group(2) or m.group(1))
        while n <= last and len(out) <= MAX_NODE_COUNTS:
            out.add(n)
            n *= 2
    if len(out) > MAX_NODE_COUNTS:
        raise UsageError(f"--nodes {text} names more than {MAX_NODE_COUNTS} node counts: give fewer")
    return tuple(sorted(out))


def parse_prices(text: str | None, clusters: list[str]) -> dict[str, float]:
    """--price: one number for every cluster (2.5) or CLUSTER=PRICE pairs (h100=2.5,frontier=1.8), per
    GPU-hour; every cluster asked for needs one."""
    if not text:
        return {}
    try:
        if "=" not in text:
            value = float(text)
            prices = {c: value for c in clusters}
        else:
            pairs = [p.split("=", 1) for p in text.replace(" ", "").split(",") if p]
            prices = {k: float(v) for k, v in pairs}
    except ValueError:
        raise UsageError(f"--price {text}: give a price per GPU-hour (2.5) or CLUSTER=PRICE pairs "
                         "(h100=2.5,frontier=1.8)") from None
    unknown = sorted(set(prices) - set(clusters))
    missing = [c for c in clusters if c not in prices]
    if unknown or missing or not all(math.isfinite(v) and v >= 0 for v in prices.values()):
        why = (f"names {', '.join(unknown)}, not among --cluster {','.join(clusters)}" if unknown else
               f"has no price for {', '.join(missing)}" if missing else "needs prices >= 0")
        raise UsageError(f"--price {text} {why}: give CLUSTER=PRICE for each of {', '.join(clusters)}")
    return prices


def parse_schedule(text: str) -> tuple[tuple[float, int], ...]:
    """--batch-schedule 'GB@TOKENS,...': global batch GB (sequences) from TOKENS tokens seen on
    ('1024@0,2048@2.5e11'); the first from 0, tokens increasing."""
    try:
        steps = tuple((float(t), int(g)) for g, t in (p.split("@") for p in text.replace(" ", "").split(",")))
    except ValueError:
        steps = ()
    ok = (steps and steps[0][0] == 0 and all(g >= 1 for _, g in steps)
          and all(a[0] < b[0] for a, b in zip(steps, steps[1:])))
    if not ok:
        raise UsageError(f"--batch-schedule {text}: give GLOBAL_BATCH@TOKENS pairs from 0 tokens on, tokens "
                         "increasing (1024@0,2048@2.5e11: 1024 sequences per step, 2048 after 250B tokens)")
    return steps


# ------------------------------------------------------------------------------------------- request

@dataclass(frozen=True)
class Batch:
    """How the global batch follows the node count: fixed (`global_batch`), a `schedule` of (from token,
    global batch), or weak scaling (`per_gpu` sequences per GPU)."""

    global_batch: int | None = None
    schedule: tuple = ()
    per_gpu: int | None = None

    def phases(self, tokens: float, gpus: int) -> list[tuple[float, int]]:
        """(tokens trained, global batch) of each phase of a run of `tokens` on `gpus` GPUs."""
        if self.per_gpu:
            return [(tokens, self.per_gpu * gpus)]
        if not self.schedule:
            return [(tokens, self.global_batch)]
        ends = [t for t, _ in self.schedule[1:]] + [math.inf]
        return [(min(end, tokens) - start, gb) for (start, gb), end in zip(self.schedule, ends) if start < tokens]

    def words(self) -> str:
        if self.per_gpu:
            return f"weak scaling: {self.per_gpu} sequence(s) per GPU per step"
        if self.schedule:
            return "batch schedule " + ", ".join(f"{gb} from {t:.3g} tokens" for t, gb in self.schedule)
        return f"global batch {self.global_batch} fixed (the same tokens per step at every node count)"


@dataclass(frozen=True)
class Request:
    """What `tuner scale` asks: a model on clusters x frameworks x node counts, trained for `tokens` (or
    `steps`) at `batch`; prices per GPU-hour by cluster name, a deadline in days, a GPU cap."""

    model: object                   # ModelSpec
    clusters: tuple                 # ClusterSpecs
    frameworks: dict                # cluster name -> the frameworks to answer for
    nodes: tuple[int, ...]
    batch: Batch
    tokens: float | None = None
    steps: int | None = None
    precision: str = "bf16"
    grad_reduce: str = ""
    optimizer_moments: str = ""     # "" = fp32; bf16: Megatron-Core's precision-aware optimizer
    prices: dict = field(default_factory=dict)
    deadline_days: float | None = None
    max_gpus: int | None = None

    def tokens_for(self, gpus: int) -> float:
        """Tokens of the run: --tokens, or --steps x tokens per step (weak scaling: per step at these GPUs)."""
        if self.tokens is not None:
            return self.tokens
        gb = self.batch.per_gpu * gpus if self.batch.per_gpu else self.batch.global_batch
        return self.steps * gb * self.model.seq_length


def check_request(r: Request) -> None:
    """One line naming the fix for a request `scale` cannot answer."""
    if (r.tokens is None) == (r.steps is None):
        raise UsageError("give the run's length as --tokens (e.g. 15e12) or as --steps, one of them")
    if r.tokens is not None and not (math.isfinite(r.tokens) and r.tokens > 0):
        raise UsageError(f"--tokens must be > 0 (got {r.tokens:g})")
    if r.steps is not None and r.batch.schedule:
        raise UsageError("--steps with --batch-schedule: the schedule is in tokens seen; give --tokens")
    if r.deadline_days is not None and not r.deadline_days > 0:
        raise UsageError(f"--deadline must be > 0 days (got {r.deadline_days:g})")


def points(r: Request) -> tuple[list[tuple], list[str]]:
    """The (cluster, framework, nodes, [(tokens, global batch), ...]) to answer, and notes on node counts
    --max-gpus leaves out."""
    out, notes = [], []
    for c in r.clusters:
        for n in r.nodes:
            gpus = n * c.gpus_per_node
            if r.max_gpus is not None and gpus > r.max_gpus:
                notes.append(f"{c.name}: {n} nodes ({gpus} GPUs) left out: more than --max-gpus {r.max_gpus}")
                continue
            for fw in r.frameworks[c.name]:
                out.append((c, fw, n, r.batch.phases(r.tokens_for(gpus), gpus)))
    return out, notes


def feed_refusal(workload, space) -> str | None:
    """Why the global batch cannot feed the data parallelism on this many GPUs (each data-parallel rank
    needs a sequence per step), or None: every model-parallel group (tp x cp x pp) a layout of `space` can
    have here -- the framework's and the space's rules but the batch's -- leaves more data-parallel ranks
    than the batch has sequences."""
    from dataclasses import replace

    from tuner.frameworks import of as framework_of
    from tuner.layout import Layout
    gpus, gb = workload.gpus, workload.global_batch
    roomy = replace(workload, global_batch=gpus * 64)              # a batch no layout is refused for
    zero = framework_of(workload).zero_stages[0]
    groups = [(tp, cp, pp) for tp in space.choices("tp", workload) for cp in space.choices("context_parallel", workload)
              for pp in space.choices("pp", workload) if gpus % (tp * cp * pp) == 0]
    runnable = [(tp, cp, pp) for tp, cp, pp in groups if space.why_invalid(Layout(
        tp=tp, sequence_parallel=tp > 1, context_parallel=cp, pp=pp, dp=gpus // (tp * cp * pp), micro_batch=1,
        zero_stage=zero, recompute="full"), roomy) is None]
    if not runnable:
        return None                                  # refused for other reasons: valid_layouts says which
    tp, cp, pp = max(runnable, key=lambda g: (g[0] * g[1] * g[2], -g[2]))
    if gpus // (tp * cp * pp) <= gb:
        return None
    return (f"global batch {gb} cannot feed {gpus} GPUs: the widest model-parallel group a layout can have here "
            f"(tp {tp} x cp {cp} x pp {pp} = {tp * cp * pp}) leaves {gpus // (tp * cp * pp)} data-parallel ranks, "
            f"more than the {gb} sequences of a step; use fewer nodes, a larger --global-batch or "
            "--batch-schedule, or --batch-per-gpu")


# --------------------------------------------------------------------------------------------- answers

@dataclass(frozen=True)
class Found:
    """The layout that answers one workload: measured (a stored trial) or predicted (best's answer)."""

    layout: object
    samples_per_second: float
    band: tuple | None              # best's 90 % interval on samples/s (None: measured)
    measured: bool
    source: str                     # the study and trial, or the prediction's evidence


@dataclass(frozen=True)
class Refused:
    reason: str
    status: str = "no layout"       # or "batch cannot feed"


def answer_key(cluster, framework: str, nodes: int, global_batch: int) -> tuple:
    return (cluster.name, framework, nodes, global_batch)


def row(r: Request, point: tuple, answers: dict) -> dict:
    """One row of the table for (cluster, framework, nodes, phases) from the answers of its workloads."""
    c, fw, n, phases = point
    gpus, seq = n * c.gpus_per_node, r.model.seq_length
    got = [answers[answer_key(c, fw, n, gb)] for _, gb in phases]
    base = {"cluster": c.name, "framework": fw, "nodes": n, "gpus": gpus,
            "global_batch": phases[0][1] if len(phases) == 1 else [gb for _, gb in phases],
            "tokens": sum(t for t, _ in phases)}
    refused = next((a for a in got if isinstance(a, Refused)), None)
    if refused:
        return {**base, "status": refused.status, "note": refused.reason}
    main = got[max(range(len(phases)), key=lambda i: phases[i][0])]          # the phase of most tokens
    by_gb = {gb: a for (_, gb), a in zip(phases, got)}
    secs = sum(t / (by_gb[gb].samples_per_second * seq) for t, gb in phases)
    ends = [sum(t / ((a.band or (a.samples_per_second,) * 2)[i] * seq) for (t, _), a in zip(phases, got))
            for i in (1, 0)]                                                  # the fast end, then the slow
    g = goodput(r.model.num_parameters, fw, c, n)
    days, sps = secs / 86400 / g.fraction, sum(t for t, _ in phases) / seq / secs
    power, _ = operation(c, "node_power_kw")
    out = {**base, "status": "ok", "layout": main.layout.as_dict(), "layout_key": main.layout.key(),
           "samples_per_second": sps, "mfu": sps * model_flops(r.model, 1) / (gpus * c.peak_tflops * 1e12),
           "samples_per_second_90": [main.band[0], main.band[1]] if main.band and len(phases) == 1 else None,
           "measured": all(a.measured for a in got), "source": "; ".join(dict.fromkeys(a.source for a in got)),
           "steps": sum(t / (gb * seq) for t, gb in phases), "raw_days": secs / 86400,
           "goodput": g.fraction, "failures_per_day": g.failures_per_day,
           "checkpoint_interval_min": g.interval_s / 60, "days": days,
           "days_90": [e / 86400 / g.fraction for e in ends] if any(a.band for a in got) else None,
           "gpu_hours": days * 24 * gpus, "energy_mwh": None if power is None else power * n * days * 24 / 1000,
           "phases": [{"tokens": t, "global_batch": gb, "layout": a.layout.as_dict(),
                       "samples_per_second": a.samples_per_second, "measured": a.measured}
                      for (t, gb), a in zip(phases, got)]}
    if r.prices:
        out["price_per_gpu_hour"] = r.prices[c.name]
        out["cost"] = out["gpu_hours"] * r.prices[c.name]
    return out


# --------------------------------------------------------------------------------------- the table

def cost_axis(rows: list[dict]) -> str:
    """'cost' when every answered row has a price, else 'gpu_hours'."""
    ok = [x for x in rows if x["status"] == "ok"]
    return "cost" if ok and all("cost" in x for x in ok) else "gpu_hours"


def mark_pareto(rows: list[dict]) -> None:
    """pareto = True on the answered rows no other row beats on both days and cost (or GPU-hours)."""
    axis = cost_axis(rows)
    ok = [x for x in rows if x["status"] == "ok"]
    for x in rows:
        x["pareto"] = x["status"] == "ok" and not any(
            y["days"] <= x["days"] and y[axis] <= x[axis] and (y["days"] < x["days"] or y[axis] < x[axis])
            for y in ok)


def mark_efficiency(rows: list[dict]) -> None:
    """scaling_efficiency: samples/s per GPU against the fewest nodes answered of the same cluster and
    framework (1 there): strong scaling with a fixed batch, weak scaling with --batch-per-gpu."""
    first: dict = {}
    for x in sorted((x for x in rows if x["status"] == "ok"), key=lambda x: x["nodes"]):
        per_gpu = x["samples_per_second"] / x["gpus"]
        base = first.setdefault((x["cluster"], x["framework"]), per_gpu)
        x["scaling_efficiency"] = per_gpu / base


def choose(rows: list[dict], deadline: float | None) -> tuple[dict | None, str]:
    """The cheapest answered row that trains within `deadline` days (ties: the faster), and a sentence."""
    if deadline is None:
        return None, ""
    axis = cost_axis(rows)
    ok = [x for x in rows if x["status"] == "ok"]
    meets = [x for x in ok if x["days"] <= deadline]
    for x in ok:
        x["meets_deadline"] = x["days"] <= deadline
    if not meets:
        fastest = min(ok, key=lambda x: x["days"], default=None)
        return None, (f"no answered point meets --deadline {deadline:g} days" + (
            f": the fastest is {fastest['nodes']} x {fastest['cluster']} ({fastest['framework']}) at "
            f"{fastest['days']:.1f} days; add nodes or another cluster" if fastest else ""))
    best = min(meets, key=lambda x: (x[axis], x["days"]))
    best["chosen"] = True
    what = f"${best['cost']:,.0f}" if axis == "cost" else f"{best['gpu_hours']:,.0f} GPU-hours"
    return best, (f"cheapest within {deadline:g} days: {best['nodes']} x {best['cluster']} ({best['gpus']} GPUs, "
                  f"{best['framework']}, {best['layout_key']}): {best['days']:.1f} days, {what}")


def table(r: Request, answered: list[tuple], answers: dict) -> tuple[list[dict], dict | None, str]:
    """Every row (in cluster, framework, nodes order), the Pareto set and efficiencies marked, and the
    deadline's choice with its sentence."""
    rows = [row(r, p, answers) for p in answered]
    mark_pareto(rows)
    mark_efficiency(rows)
    chosen, sentence = choose(rows, r.deadline_days)
    return rows, chosen, sentence


def basis_notes(r: Request, rows: list[dict]) -> list[str]:
    """What the figures rest on: the batch, the run's length, the speeds (measured or best's prediction,
    its 90 % interval), each cluster's goodput and power figures with their sources, the cost axis."""
    ok = [x for x in rows if x["status"] == "ok"]
    measured = sum(x["measured"] for x in ok)
    length = f"{r.tokens:.4g} tokens" if r.tokens is not None else f"{r.steps} steps"
    notes = [f"{r.model.name}, {length}, {r.batch.words()}, {r.precision}",
             f"samples/s: {measured} of {len(ok)} row(s) measured by a stored study (measured = yes); the others "
             "are `tuner best`'s prediction, corrected by stored measurements of the model at other node counts "
             "where there are some, with its 90 % interval (days_90)"]
    for c in r.clusters:
        figures = []
        for key in ("node_mtbf_hours", "filesystem_bandwidth_gbps", "restart_minutes", "node_power_kw"):
            value, source = operation(c, key)
            figures.append(f"{key} {'-' if value is None else f'{value:g}'} ({source})")
        notes.append(f"{c.name}: " + "; ".join(figures))
    notes.append("days = tokens / (samples/s x sequence) / goodput (failures, checkpoints at Daly's interval, "
                 f"restarts: tuner/goodput.py); Pareto set of days against {cost_axis(rows).replace('_', '-')}"
                 + ("" if r.prices else "; give --price for costs"))
    return notes
