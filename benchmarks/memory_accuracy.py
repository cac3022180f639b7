"""The memory model and its fit probability, per framework, on measured memory (issue 24).

Run: python benchmarks/memory_accuracy.py [--fit] [--all-rows]

Evidence, every row one distinct configuration (benchmarks/published.py):
- exact: peaks measured over the framework's own code on this machine (fake tensors: Megatron-Core's
  GPTModel, torchtitan's Llama 3 under FSDP2; data/memory_measured_*.toml; allocated bytes, compared with
  the predicted peak less the cluster's fixed reserve, which a fake tensor never allocates);
- censored: every published run that ran fit in its GPU: log(true / predicted) <= log(capacity / predicted);
  a stated peak (torchtitan's tables: the caching allocator's max_reserved, which holds more than the run
  needs when the GPU has room) bounds the need from above too.
Each row is predicted as it ran (its framework, precision, sequence, gradient dtype, layout).

--fit: the spread rule's errors per framework (issue 24 round 9: the seen fake-tensor rows' log errors less tuner's
memory_bias, as tuner.perfmodel.fit.error_quantiles' equally likely atoms: what tuner/frameworks.py memory_errors states
and p_fit is computed from); the bias and log-sd of log(true / predicted) per framework, robust (`robust`: the median and 1.4826 x the
median absolute deviation of the fake-tensor rows' errors; what tuner states), and for comparison by maximum
likelihood (a Tobit model: exact rows -- fake-tensor allocated bytes -- by their density under the account's spread
alone, censored ones -- runs that ran on a GPU -- by their probability under the account's spread and the caching
allocator's share, tuner.frameworks ALLOCATOR_SD), on every row some memory choice has already seen (published.SEEN: issue 24 round 4
chose the allocated-bytes spread on them, FRESH2's rows included); rows no choice saw are never read. The
chosen constants go into tuner/frameworks.py by hand, with the rows they saw.

Printed, per framework, on the held-out rows -- hashed out AND seen by no memory choice (published.SEEN;
rows hashed out that a choice saw, and the tuning rows, are printed after them under their own labels):
- the error of the memory model on exact rows (median and worst |log ratio|);
- the allocated-bytes p_fit's reliability: for every exact row and capacities spread around its prediction
  (0.70-1.30 x, 0.05 % apart), P(allocated peak <= capacity) as tuner's account states it (the framework's bias
  and its empirical errors' share below the capacity -- or, without measured errors, its sd plus the per-layout
  terms -- without the allocator's share, which a fake tensor does not have) against
  the realised fit (measured <= capacity), binned by stated p_fit. This tests the account's part of p_fit only;
  the allocator's part is tested against published logs (benchmarks/allocator_share.py);
- the runs that ran: how many have the GPU p_fit (both parts) >= 0.5, and how far `plan` lists each below its
  rank by predicted speed (in the default space plus the row's layout; tuner.perfmodel.rank).
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import reading  # noqa: E402  (one reading of a row: its model, machine, layout, and memory as it ran)
from published import clean, held_out, loss_of, measured, published  # noqa: E402
from tuner.frameworks import ALLOCATOR_SD, FRAMEWORKS  # noqa: E402
from tuner.layout import Layout, micro_batches_per_pipeline, stage_layers, why_invalid  # noqa: E402
from tuner.perfmodel import account_sd, fit_probability, gpu_fit_probability, memory, memory_prior_sd, memory_shares, rank  # noqa: E402
from tuner.perfmodel.fit import account_fit_probability, error_quantiles, errors_fit_probability  # noqa: E402
from tuner.perfmodel.compute import shape_of  # noqa: E402
from tuner.perfmodel.memory_loss import MEASURED_LOSS_CHUNKS  # noqa: E402
from tuner.space import load_space, valid_layouts  # noqa: E402

GIB = 2 ** 30 / 1e9                  # GB per GiB
PREDICTED_AS = reading.PREDICTED_AS
CAPACITY_STEPS = [0.70 + 0.0005 * i for i in range(1201)]  # 0.05 % apart: the allocated-bytes spread is ~0.1-1 %
BINS = [(0.0, 0.1), (0.1, 0.3), (0.3, 0.5), (0.5, 0.7), (0.7, 0.9), (0.9, 0.97), (0.97, 1.0001)]


#: the one reading of a row every accuracy benchmark shares (benchmarks/reading.py)
model_of, layout_of, workload_of = reading.model_of, reading.layout_of, reading.workload_of


def fused_qkv_gb(row: dict, lay: Layout, w) -> float:
    """torchtitan 0.3.0's fused wqkv makes per-op SAC keep K too (memory.op_sac_bytes); tuner predicts the
    separate projections of the torchtitan it launches. A 0.3.0 measurement of a dense model is predicted as it ran."""
    sh = shape_of(lay, w)
    if not sh.op_sac or not str(row.get("release", "")).startswith("torchtitan 0.3"):
        return 0.0
    extra = memory.op_sac_bytes(w.model, sh, fused_qkv=True) - memory.op_sac_bytes(w.model, sh, fused_qkv=False)
    layers = stage_layers(lay, w.model.num_layers, row.get("stage", 0))
    return layers * w.model.seq_length * sh.tokens * w.model.hidden_size * extra / 1e9


def rope_cache_gb(row: dict, lay: Layout, w) -> float:
    """torchtitan 0.3.0 gives every attention layer its own RoPE module with a non-persistent fp32 cache buffer of
    max_seq_len x head_dim (models/common/rope.py register_buffer("cache"); Decoder.update_from_config sets
    max_seq_len to the run's sequence): layers x s x head_dim x 4 bytes on every rank (the tracker's Buffer). The
    torchtitan tuner launches keeps one freqs_cis for the model (s x head_dim/2 complex64): not charged."""
    if not str(row.get("release", "")).startswith("torchtitan 0.3") or w.model.position_embedding != "rope":
        return 0.0
    layers = stage_layers(lay, w.model.num_layers, row.get("stage", 0))
    return layers * w.model.seq_length * w.model.head_dim * 4.0 / 1e9


def tracker_retained_gb(row: dict, lay: Layout, w, m: int) -> float:
    """What torch's MemTracker keeps alive in a measured Megatron-Core row on a pipeline stage after the first: the
    input each finished micro-batch received (recv_forward) and the gradient its backward sent back, 2 + 2 bytes per
    s/cp*b*h element (h/t with sequence parallelism), m - 1 of each at the last micro-batch's peak. Megatron-Core pops
    and drops them (schedules.py forward_backward_pipelining_without_interleaving at 0.16.1); with the tracker replaced
    by a no-op, 3 of 4 received inputs are freed by the end of the schedule, with it none (issue 24 round 5, an ad-hoc
    weakref check), and the tracker's peak grows by exactly these tensors with m. A measurement artifact, so the
    benchmark adds it to the prediction of such a row; tuner's account (a GPU run) does not have it. Derived for 1F1B
    without interleaving only (with vp > 1 every chunk after the first receives inputs, on every stage): 0 there."""
    if row["framework"] != "megatron-core" or row.get("stage", 0) == 0 or lay.pp == 1 or lay.virtual_pipeline > 1:
        return 0.0
    sh = shape_of(lay, w)
    sbh = w.model.seq_length * sh.tokens * w.model.hidden_size / (lay.tp if sh.sp else 1)
    return (m - 1) * 4.0 * sbh / 1e9


def harness_rope_dropout_gb(row: dict, lay: Layout, w, m: int, mem: dict) -> float:
    """What benchmarks/measure_memory_mcore.py's run of a row keeps that the account (a GPU run as tuner launches it)
    does not, and the reverse (issue 24 round 8, second pass; read by creation site on FRESH2's rows), per kept pass of
    each layer (in flight x layers), or the working layer alone under full recompute in its layer-backward phase (not
    where the stage's loss phase is the peak, mem['logits'] > 0):
    (a) RoPE, megatron-core 0.16.1's unfused path (apply_rope_fusion=False, a CUDA kernel; rope_utils.py
        _apply_rotary_pos_emb_bshd): its two multiplies save the bf16 cos and sin, s/cp x head_dim each, for q and for
        k (4 x 2 s d bytes, not split by t; the fused kernel saves one shared table); and the rotated q and k are new
        tensors while the flash stand-in saves v as given, a view that keeps the whole QKV output alive (attention.py
        get_query_key_value_tensors splits it into views): 2 + 2kv/h bytes per s*b*h element / t more than the account's
        Q, K, V. Whether TransformerEngine's fused attention saves v as that view or a contiguous copy (which would free
        the QKV output) is not read, so the account keeps Q, K, V once;
    (b) its Llama runs without dropout (the row's note: dropout 0.0), where the account charges the two 1-byte masks
        per element of Megatron-LM's default hidden dropout, which tuner's launch keeps."""
    if row["framework"] != "megatron-core":
        return 0.0
    sh, model = shape_of(lay, w), w.model
    layers = stage_layers(lay, model.num_layers, row.get("stage", 0))
    if lay.recompute == "full":
        passes = 0 if mem["logits"] > 0 else 1
    else:
        passes = memory.in_flight(row.get("stage", 0), lay.pp, m, lay.virtual_pipeline) * layers / lay.virtual_pipeline
    sbh = model.seq_length * sh.tokens * model.hidden_size
    rope = 0.0
    if model.position_embedding == "rope" and not model.multi_latent_attention:
        rope = 8.0 * model.seq_length / lay.context_parallel * model.head_dim
        rope += sbh * (2.0 + 2.0 * model.kv_size / model.hidden_size) / lay.tp
    masks = 2.0 * sbh / (lay.tp if sh.sp else 1) if "dropout 0.0" in row.get("note", "") else 0.0
    return passes * (rope - masks) / 1e9


def evaluate(row: dict, kind: str) -> dict | None:
    """One row: its log ratio (exact) or upper bound (censored), the raw prediction, the prior sd terms."""
    w, fw_name = workload_of(row), reading.framework_of(row)
    lay = layout_of(row, fw_name)
    if why_invalid(lay, w):
        return None
    raw = dataclasses.replace(w, framework=fw_name)
    if kind == "measured":              # the stage measured, allocated bytes: no fixed reserve, no bias
        m = micro_batches_per_pipeline(lay, w.global_batch)
        chunks = MEASURED_LOSS_CHUNKS if loss_of(row) == "chunked" else 1    # 0.3.0's default; launched: 1
        mem = memory.stage_memory(lay, raw, row.get("stage", 0), m, shape_of(lay, raw), loss_chunks=chunks)
        pred = mem["total"] - mem["reserved"]
        pred += fused_qkv_gb(row, lay, raw) + rope_cache_gb(row, lay, raw) + tracker_retained_gb(row, lay, raw, m)
        pred += harness_rope_dropout_gb(row, lay, raw, m, mem)
        true = row["peak_allocated_gib"] * GIB
    else:                               # a stated peak is the allocator's reserved peak: at least what it needed
        mem = reading.peak_as_ran(row, lay, raw)          # what its recipe ran (ran_* keys) included
        pred, true = mem["total"], None
    shares = memory_shares(mem)
    local = str(row.get("attention", "")).startswith("local")    # Megatron's unfused kernel: keeps the scores
    group = row["framework"] + (" MoE" if w.model.is_moe else "") + (" (scores kept)" if local else "")
    out = {"row": row, "framework": fw_name, "stack": group, "layout": lay, "workload": w, "pred": pred, "kind": kind,
           "shares": shares, "held_out": held_out(row), "clean": clean(row, "memory")}
    if true:
        out["exact"] = math.log(true / pred)
    elif kind == "published" and not row.get("oom"):
        out["bound"] = math.log(min(w.cluster.memory_gb, row.get("peak_memory_gib", math.inf) * GIB) / pred)
        out["reserved_stated"] = bool(row.get("peak_memory_gib"))
    else:
        return None
    return out


def rows() -> list[dict]:
    out = [evaluate(r, "measured") for r in measured()] + [evaluate(r, "published") for r in published()]
    return [e for e in out if e]


# ------------------------------------------------------------------------------------------ fit
def _ndtr(z: float) -> float:
    return 0.5 * math.erfc(-z / math.sqrt(2.0))


def log_likelihood(evs: list[dict], bias: float, sd: float) -> float:
    """Exact rows are fake-tensor (allocated-bytes) peaks: the account's error alone; a published run that ran
    bounds what a GPU run needed: the account's error and the caching allocator's share."""
    ll = 0.0
    for e in evs:
        s = account_sd(sd, e["shares"]) if e["kind"] == "measured" else memory_prior_sd(sd, e["shares"])
        if "exact" in e:
            z = (e["exact"] - bias) / s
            ll += -0.5 * z * z - math.log(s)
        else:
            ll += math.log(max(_ndtr((e["bound"] - bias) / s), 1e-300))
    return ll


def robust(evs: list[dict]) -> tuple[float, float]:
    """The allocated-bytes constants tuner states (issue 24 round 4): on the exact (fake-tensor) rows, the median
    log(true / pred) and 1.4826 x the median absolute deviation of the errors standardised by each row's account
    spread per unit sd (account_sd(1, shares)). Robust, because the errors are a tight bulk with a few far rows: a
    normal fitted by maximum likelihood is pulled wide by the far rows and is then under-confident in every middle
    bin (FRESH3, printed with it, said so)."""
    exact = [e for e in evs if "exact" in e]
    bias = statistics.median(e["exact"] for e in exact)
    z = [abs(e["exact"] - bias) / account_sd(1.0, e["shares"]) for e in exact]
    return bias, 1.4826 * statistics.median(z)


def fit(evs: list[dict]) -> tuple[float, float]:
    """(bias, sd) maximising the likelihood on a grid (bias -0.5..0.5 by 0.005, sd 0.0025..0.5 by 0.0025), then
    on a finer one around that (bias by 0.0005, sd by 0.00025)."""
    grid = [(b / 200, s / 400) for b in range(-100, 101) for s in range(1, 201)]
    b0, s0 = max(grid, key=lambda bs: log_likelihood(evs, *bs))
    fine = [(b0 + b / 2000, s0 + s / 4000) for b in range(-10, 11) for s in range(-9, 11) if s0 + s / 4000 > 0]
    return max(fine, key=lambda bs: log_likelihood(evs, *bs))


# ------------------------------------------------------------------------------------------ report
def stated_p_fit(e: dict, capacity: float, bias: float, sd: float, errors: tuple = ()) -> float:
    """p_fit as tuner states it for a GPU run (the account's error and the allocator's share): the empirical errors
    where the framework has them (tuner.perfmodel.fit.prior_fit_probability), else the normal of its sd."""
    if errors:
        return errors_fit_probability(e["pred"] * math.exp(bias), capacity, errors)
    return gpu_fit_probability(e["pred"] * math.exp(bias), capacity, account_sd(sd, e["shares"]))


def allocated_p_fit(e: dict, capacity: float, bias: float, sd: float, errors: tuple = ()) -> float:
    """The account's part of p_fit alone: P(allocated bytes <= capacity), what a fake-tensor peak can test."""
    if errors:
        return account_fit_probability(e["pred"] * math.exp(bias), capacity, errors)
    return fit_probability(e["pred"] * math.exp(bias), capacity, account_sd(sd, e["shares"]))


def reliability(evs: list[dict], bias: float, sd: float, errors: tuple = ()) -> list[tuple]:
    """(bin, n, mean stated, realised) over every exact row at capacities 0.70-1.30 x its prediction: the
    allocated-bytes p_fit (`allocated_p_fit`) against whether the measured allocated peak fits."""
    pairs = []
    for e in evs:
        if "exact" not in e:
            continue
        true = e["pred"] * math.exp(e["exact"])
        for k in CAPACITY_STEPS:
            cap = k * e["pred"]
            pairs.append((allocated_p_fit(e, cap, bias, sd, errors), float(true <= cap)))
    out = []
    for lo, hi in BINS:
        sel = [(p, y) for p, y in pairs if lo <= p < hi]
        if sel:
            out.append(((lo, min(hi, 1.0)), len(sel), statistics.fmean(p for p, _ in sel),
                        statistics.fmean(y for _, y in sel)))
    return out


def spread_cv(mine: list[dict]) -> None:
    """How the spread rule was chosen (issue 24 round 9), on seen rows only: leave one measured batch (data file) out,
    choose each rule on the others -- the normal of the median and 1.4826 x MAD (`robust`) and the empirical errors'
    quantiles (error_quantiles about the median) -- and bin the left-out batch's (row, capacity) pairs as `reliability`
    does; printed per bin as stated / realised over every batch left out."""
    files = sorted({e["row"].get("file") for e in mine if "exact" in e})
    if len(files) < 2:
        print("  leave-one-batch-out: one measured batch, none to leave out")
        return
    for name in ("normal (median, 1.4826 MAD)", "empirical errors"):
        acc: dict = {}
        for f in files:
            train = [e for e in mine if "exact" in e and e["row"].get("file") != f]
            test = [e for e in mine if "exact" in e and e["row"].get("file") == f]
            bias, sd = robust(train)
            errors = () if name.startswith("normal") else error_quantiles([e["exact"] - bias for e in train])
            for lo_hi, n, p, y in reliability(test, bias, sd, errors):
                a = acc.setdefault(lo_hi, [0, 0.0, 0.0])
                a[0], a[1], a[2] = a[0] + n, a[1] + n * p, a[2] + n * y
        print(f"  leave-one-batch-out ({len(files)} batches), {name}: " + "; ".join(
            f"[{lo:.2f}, {hi:.2f}) {n} {sp / n:.3f} / {sy / n:.3f}" for (lo, hi), (n, sp, sy) in sorted(acc.items())))


def displacement(e: dict) -> tuple[int, int] | None:
    """(rank by predicted speed, rank in plan) of a published run's layout among the default space's
    layouts of its workload (plus its own)."""
    w, lay = e["workload"], e["layout"]
    if w.model.is_moe:
        return None
    layouts = valid_layouts(load_space(), w)
    if lay not in layouts:
        layouts.append(lay)
    ranked = rank(layouts, w)
    keys = [p.layout for p in ranked]
    by_speed = sorted(ranked, key=lambda p: -p.samples_per_second)
    return [p.layout for p in by_speed].index(lay) + 1, keys.index(lay) + 1


def report(evs: list[dict], label: str, all_rows: bool) -> None:
    """Per stack that ran the rows (llm-foundry's FSDP is its own: tuner predicts it as torchtitan, with
    torchtitan's stated p_fit, but its memory is another code's)."""
    for stack in sorted({e["stack"] for e in evs}):
        mine = [e for e in evs if e["stack"] == stack]
        fw = mine[0]["framework"]
        f = FRAMEWORKS[fw]
        exact = [e["exact"] for e in mine if "exact" in e]
        ran = [e for e in mine if "bound" in e]
        measured_n = sum(e["kind"] == "measured" for e in mine if "exact" in e)
        as_fw = "" if stack == fw else f" (predicted as {fw})"
        print(f"\n[{label}] {stack}{as_fw}: {len(exact)} exact rows ({measured_n} measured over its code, "
              f"{len(exact) - measured_n} published peaks), "
              f"{len(ran)} published runs that ran; tuner states bias {f.memory_bias:+.3f}, "
              + (f"the empirical errors {f.memory_errors[0]:+.4f} to {f.memory_errors[-1]:+.4f}" if f.memory_errors
                 else f"sd {f.memory_sd:.3f}")
              + f" on allocated bytes, and the allocator's share sd {ALLOCATOR_SD:.4f} on a GPU")
        if exact:
            a = sorted(abs(x) for x in exact)
            print(f"  memory model: median |log(true/pred)| {statistics.median(a):.3f}, worst "
                  f"{max(exact, key=abs):+.3f}, mean {statistics.fmean(exact):+.3f}")
            if any(e["kind"] == "measured" for e in mine):
                print("  allocated-bytes p_fit (the account's part: P(allocated peak <= capacity), what a fake-tensor "
                      "peak tests; the allocator's share is tested only against published logs, "
                      "benchmarks/allocator_share.py):")
            for (lo, hi), n, p, y in reliability(mine, f.memory_bias, f.memory_sd, f.memory_errors):
                flag = "" if n < 10 or abs(p - y) <= 0.1 else "  <-- off by more than 0.1"
                print(f"  p_fit in [{lo:.2f}, {hi:.2f}): {n:4d} (row, capacity) pairs, stated {p:.3f}, "
                      f"realised {y:.3f}{flag}")
        if ran:
            ps = [stated_p_fit(e, e["workload"].cluster.memory_gb, f.memory_bias, f.memory_sd, f.memory_errors)
                  for e in ran]
            print(f"  runs that ran: {sum(p >= 0.5 for p in ps)} of {len(ps)} with GPU p_fit >= 0.5 (min {min(ps):.2f}, "
                  f"mean {statistics.fmean(ps):.2f})")
        if all_rows:
            for e in mine:
                r = e["row"]
                val = f"exact {e['exact']:+.3f}" if "exact" in e else f"bound {e['bound']:+.3f}"
                print(f"    {r.get('model', 'custom'):12s} {r['gpus']:5d} {e['layout'].key():44s} "
                      f"pred {e['pred']:6.1f} GB {val}")


def placements(evs: list[dict]) -> None:
    ran = [e for e in evs if "bound" in e]
    moved = []
    for e in ran:
        d = displacement(e)
        if d:
            moved.append((d[1] - d[0], d, e))
    if not moved:
        return
    worst = max(moved, key=lambda x: x[0])
    print(f"\n[held-out] published runs that ran, placed by `plan` against their rank by predicted speed: "
          f"{sum(m[0] <= 5 for m in moved)} of {len(moved)} at most 5 places below; worst {worst[0]} "
          f"({worst[2]['row']['model']} {worst[2]['layout'].key()}: speed rank {worst[1][0]}, plan rank {worst[1][1]})")


def main(do_fit: bool = False, all_rows: bool = False) -> None:
    evs = rows()
    tuning = [e for e in evs if not e["held_out"]]                # what --fit may use
    held = [e for e in evs if e["clean"]]                         # hashed out AND seen by no memory choice
    seen = [e for e in evs if e["held_out"] and not e["clean"]]   # hashed out, but a choice saw them
    print(f"{len(evs)} rows with memory evidence: {len(tuning)} tuning, {len(held)} held out and seen by no memory "
          f"choice (data/held_out.txt, published.SEEN), {len(seen)} hashed out but seen by a choice")
    if do_fit:                  # every row some memory choice has seen (issue 24 round 4: the allocated-bytes spread
        fitted = [e for e in evs if not e["clean"]]    # is chosen on seen rows; published.SEEN names them)
        for fw in sorted({e["stack"] for e in fitted}):
            mine = [e for e in fitted if e["stack"] == fw]
            if sum("exact" in e for e in mine) < 3:
                print(f"fit on the rows a memory choice saw, {fw}: not identifiable ({sum('exact' in e for e in mine)} exact rows; "
                      f"{len(mine)} censored rows only bound it from above): its sd stays assumed")
                continue
            rb, rs = robust(mine)
            print(f"robust on the rows a memory choice saw, {fw}: bias {rb:+.4f}, sd {rs:.4f} "
                  f"({sum('exact' in e for e in mine)} exact rows) -- what tuner/frameworks.py states")
            q = error_quantiles([e["exact"] - FRAMEWORKS[mine[0]["framework"]].memory_bias for e in mine if "exact" in e])
            print(f"  the spread rule's errors (log error less tuner's memory_bias, {len(q)} quantiles of "
                  f"{sum('exact' in e for e in mine)} exact rows): ({', '.join(f'{a:+.5f}' for a in q)})")
            spread_cv(mine)
            b, s = fit(mine)
            print(f"  (maximum likelihood, Tobit, for comparison: bias {b:+.4f}, sd {s:.4f}; {len(mine)} rows: "
                  f"{sum('exact' in e for e in mine)} exact, {sum('bound' in e for e in mine)} censored)")
    report(held, "held-out", all_rows)
    report(seen, "hashed out, seen", all_rows)
    report(tuning, "tuning", all_rows)
    placements(held)


if __name__ == "__main__":
    main(do_fit="--fit" in sys.argv, all_rows="--all-rows" in sys.argv)
