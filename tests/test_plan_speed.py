"""plan's shortcuts answer exactly as the plain model (issue 25 item 6, issue 27): `rank`'s memo of sub-results
shared between layouts, `rank_shown` (memory of every layout, time only of the rows plan may list) and the
enumeration's order of checks change no prediction, no ranking and no count. benchmarks/golden_predictions.py
checks the same over whole plans of the largest shipped workloads, and one tree against another."""

from __future__ import annotations

import pytest

from tuner.layout import LAYOUT_FIELDS
from tuner.perfmodel import predict, rank
from tuner.perfmodel.screening import rank_shown
from tuner.space import SearchSpace, load_space, valid_layouts
from tuner.specs import make_workload

WORKLOADS = [   # dense, MoE, uneven splits, cp, torchtitan, Megatron-DeepSpeed, fp8; a few hundred to 6,405 layouts
    ("175b", 8, "frontier", None, "bf16", None),
    ("llama3-8b", 1, "h100", "torchtitan", "bf16", 16384),
    ("llama3-8b", 1, "h100", None, "fp8", None),
    ("qwen3-30b-a3b", 1, "h200", None, "bf16", None),
]


@pytest.fixture(scope="module", params=WORKLOADS, ids=lambda p: f"{p[0]}-{p[2]}-{p[3] or 'own'}-{p[4]}")
def planned(request):
    model, nodes, cluster, framework, precision, seq = request.param
    w = make_workload(model, nodes, cluster, None, precision, framework, None, seq)
    layouts = valid_layouts(load_space("default"), w)
    return w, layouts, rank(layouts, w)


def test_rank_with_its_memo_predicts_each_layout_as_alone(planned):
    w, layouts, ranked = planned
    by_layout = {p.layout: p for p in ranked}
    assert len(by_layout) == len(layouts) > 100
    for lay in layouts[::7]:
        assert predict(lay, w) == by_layout[lay]          # every field, every breakdown entry: bit for bit


def test_peak_memory_is_the_largest_stage_memory(planned):
    """peak_memory (each stage's total summed without its dict, the dict built for the worst alone, its parts kept
    per group of layouts in rank's memo) answers as max() over stage_memory's whole breakdowns, one stage at a time."""
    from tuner.layout import micro_batches_per_pipeline, stage_candidates
    from tuner.perfmodel.memory import peak_memory, stage_memory
    w, layouts, _ = planned
    memo: dict = {}
    for lay in layouts[::5]:
        m = micro_batches_per_pipeline(lay, w.global_batch)
        want = max(((s, stage_memory(lay, w, s, m)) for s in stage_candidates(lay, w.model)),
                   key=lambda sm: sm[1]["total"])
        assert peak_memory(lay, w, m, memo=memo) == peak_memory(lay, w, m) == want, lay.key()


@pytest.mark.parametrize("top,show_all", [(10, False), (1, True), (None, False), (None, True), (100000, True)])
def test_rank_shown_is_ranks_rows_and_counts(planned, top, show_all):
    w, layouts, ranked = planned
    got = rank_shown(layouts, w, top, show_all)
    assert got.shown == [p for p in ranked if show_all or p.fits][:top]
    by_layout = {p.layout: p for p in ranked}
    assert [(s.layout, s.memory_gb, s.p_fit, s.fits) for s in got.screened] == \
        [(lay, by_layout[lay].memory_gb, by_layout[lay].p_fit, by_layout[lay].fits) for lay in layouts]
    assert got.may_fit == sum(p.fits for p in ranked)


def test_no_step_is_shorter_than_its_micro_batches_of_the_slowest_stage(planned):
    """What plan's shortcut with --top rests on (screening.speed_bound): every entry of a step beyond m micro-batches
    of the stage it waits for is >= 0, and that stage's own are at least the slowest stage's; so the bound of the
    expected speed is never below the prediction's; and stage_floor is never above the slowest stage, so floor_bound
    never below speed_bound."""
    from tuner.perfmodel import memory_fit, slowest_stage
    from tuner.perfmodel.fit import expected_speed
    from tuner.perfmodel.screening import floor_bound, speed_bound
    from tuner.perfmodel.stages import stage_floor
    w, layouts, ranked = planned
    memo: dict = {}
    for p in ranked:
        fitted = memory_fit(p.layout, w, memo)
        floor = fitted[0] * slowest_stage(p.layout, w, fitted[1], None, memo)[1]
        assert p.step_time_s >= floor, p.layout.key()
        assert fitted[0] * stage_floor(p.layout, w, fitted[1], memo) <= floor, p.layout.key()
        assert floor_bound(p.layout, w, fitted[4], memo) >= speed_bound(p.layout, w, fitted[4], memo) >= \
            expected_speed(p), p.layout.key()


BATCHED = [   # what memory_batch answers over columns: Megatron-Core (dense, MoE, MLA + MTP, uneven splits, fp8 on
    # Hopper and Blackwell), Megatron-DeepSpeed; (model, nodes, cluster, framework, precision)
    ("llama3-8b", 1, "h100", None, "bf16"), ("llama3-8b", 1, "h100", None, "fp8"), ("qwen3-30b-a3b", 1, "h200", None, "bf16"),
    ("175b", 8, "frontier", None, "bf16"), ("175b", 16, "frontier", "megatron-core", "bf16"),
    ("llama3-70b", 2, "b200", None, "fp8"), ("deepseek-v3", 64, "h100", None, "bf16"),
    ("bloom-176b", 8, "a100", "megatron-deepspeed", "bf16"), ("mixtral-8x7b", 2, "h100", None, "fp8")]


@pytest.mark.parametrize("model,nodes,cluster,framework,precision", BATCHED)
def test_memory_over_columns_is_memory_fit_bit_for_bit(model, nodes, cluster, framework, precision):
    """memory_batch.screen_memory (numpy over columns of layouts, plan's memory from BATCH_FROM layouts) gives every
    layout memory_fit's memory_gb and p_fit, the same floats: a change to the memory formulas that it mirrors fails
    here until memory_batch makes it too (plan itself would fall back to memory_fit, found out by its sample)."""
    from tuner.perfmodel import memory_fit
    from tuner.perfmodel.memory_batch import screen_memory
    w = make_workload(model, nodes, cluster, None, precision, framework)
    pins = {"expert_parallel": 64, "tp": 4} if model == "deepseek-v3" else {}       # 2,392 of its layouts
    layouts = valid_layouts(load_space("default").pinned(pins), w)
    mems, p_fits = screen_memory(layouts, w)
    memo: dict = {}
    want = [memory_fit(lay, w, memo) for lay in layouts]
    assert [(lay.key(), m, p) for lay, m, p in zip(layouts, mems, p_fits)] == \
        [(lay.key(), f[3]["total"], f[4]) for lay, f in zip(layouts, want)]
    assert 0 < sum(p >= 0.02 for p in p_fits) < len(layouts)     # both kinds of answer


def test_plan_uses_the_columns_from_batch_from_layouts_and_memory_fit_where_they_differ(monkeypatch):
    """rank_shown answers as rank whether the memory is asked per layout or over columns (BATCH_FROM lowered so a small
    plan takes the columns' path); a torchtitan plan (FSDP) keeps memory_fit; and columns that answer otherwise than
    memory_fit on the sample screen_memory checks are not used (here: every p_fit a little off)."""
    from tuner.perfmodel import memory_batch, screening
    calls: list = []
    real = memory_batch.screen_memory
    monkeypatch.setattr(screening, "BATCH_FROM", 100)
    for framework, off, batched in ((None, 0.0, True), ("torchtitan", 0.0, False), (None, 1e-12, False)):
        def spy(layouts, w):
            got = real(layouts, w)
            calls.append(got)
            return got and (got[0], [p + off for p in got[1]])
        monkeypatch.setattr(memory_batch, "screen_memory", spy)
        w = make_workload("llama3-8b", 1, "h100", None, "bf16", framework)
        layouts = valid_layouts(load_space("default"), w)
        ranked, calls[:] = rank(layouts, w), []
        got = rank_shown(layouts, w, 10)
        assert got.shown == [p for p in ranked if p.fits][:10]
        by_layout = {p.layout: p for p in ranked}
        assert [(s.memory_gb, s.p_fit) for s in got.screened] == \
            [(by_layout[lay].memory_gb, by_layout[lay].p_fit) for lay in layouts]
        assert len(calls) == 1 and (calls[0] is not None) == (framework is None)
        if framework is None:               # the columns' answer was used, or memory_fit's
            assert (got.screened[0].p_fit == calls[0][1][0] + off) == batched


def test_rank_shown_lists_ruled_out_layouts_only_with_all():
    w = make_workload("175b", 8, "frontier")       # 219 of 1,272 layouts may fit on 64 GPUs
    layouts = valid_layouts(load_space("default"), w)
    ranked = rank(layouts, w)
    fitting = sum(p.fits for p in ranked)
    assert 0 < fitting < 300
    assert len(rank_shown(layouts, w, 300).shown) == fitting
    assert rank_shown(layouts, w, 300, show_all=True).shown == ranked[:300]


def _enumerate_plainly(space: SearchSpace, w) -> list:
    """Every layout of the space's product that space.why_invalid and the framework accept: the rules one by one."""
    import itertools

    from tuner.layout import Layout
    from tuner.space import DIMENSIONS
    out = []
    for values in itertools.product(*(space.choices(d, w) for d in DIMENSIONS)):
        lay = dict(zip(DIMENSIONS, values))
        n = lay["tp"] * lay["context_parallel"] * lay["pp"]
        if w.gpus % n:
            continue
        layout = Layout(**lay, dp=w.gpus // n)
        if space.why_invalid(layout, w) is None:
            out.append(layout)
    return sorted(out)


@pytest.mark.parametrize("model,nodes,cluster,constraints", [
    ("175b", 16, "frontier", {"outer_only": "pp <= 4 or virtual_pipeline == 1 or tp * context_parallel > 2"}),
    ("mixtral-8x7b", 1, "h100", {"few_micro_batches": "m <= 64",
                                 "no_z0_full": "zero_stage > 0 or recompute != 'full'"}),
    ("llama3-8b", 1, "h100", {"no_checkpointing": "not activation_checkpointing"}),
])
def test_enumeration_is_every_layout_the_rules_allow(model, nodes, cluster, constraints):
    base = load_space("default")     # narrowed so that the plain product stays small
    narrow = {"tp": [1, 2, 8], "context_parallel": [1, 2], "virtual_pipeline": [1, 2],
              "pipeline_split": ["auto", "balanced"], "micro_batch": [1, 2], "expert_parallel": [1, 8],
              "expert_tensor_parallel": [1, 2]}
    space = SearchSpace(base.name, {**base.dimensions, **narrow}, {**base.constraints, **constraints})
    w = make_workload(model, nodes, cluster)
    got = space.enumerate_layouts(w)
    assert got == _enumerate_plainly(space, w)
    assert {tuple(vars(lay)) for lay in got} == {LAYOUT_FIELDS}     # layout_from's fields, as Layout() sets them


@pytest.mark.parametrize("model,framework,precision", [("deepseek-v3", "megatron-core", "bf16"),
                                                       ("mixtral-8x7b", "torchtitan", "fp8"),
                                                       ("175b", "megatron-deepspeed", "fp8"),
                                                       ("qwen3-30b-a3b", "megatron-core", "fp8")])
def test_a_refusal_never_reads_the_micro_batch(model, framework, precision):
    """The enumeration asks a framework's refusal once per cut and ZeRO / recompute choice (tuner.space): every
    refusal, on every kind of layout, answers the same at each micro-batch."""
    import dataclasses
    import itertools

    from tuner.frameworks import of
    from tuner.layout import Layout
    w = make_workload(model, 8, "h100", None, precision, framework)
    refusal, answers = of(w).refusal, set()
    for tp, sp, pp, vp, split, ep, etp, zero, rc in itertools.product(
            (1, 2, 8), (False, True), (1, 4), (1, 2), ("auto", "light-last"), (1, 8), (1, 2), (0, 1, 2, 3),
            ("none", "selective", "mla_up", "moe_act", "full")):
        lay = Layout(tp=tp, sequence_parallel=sp, pp=pp, virtual_pipeline=vp, pipeline_split=split,
                     dp=64 // (tp * pp), expert_parallel=ep, expert_tensor_parallel=etp, micro_batch=1,
                     zero_stage=zero, recompute=rc)
        first = refusal(lay, w)
        answers.add(first is None)
        assert all(refusal(dataclasses.replace(lay, micro_batch=mb), w) == first for mb in (2, 4, 16)), lay
    assert answers == {True, False}          # both kinds of answer were asked


@pytest.mark.parametrize("model,framework,precision", [("deepseek-v3", "megatron-core", "bf16"),
                                                       ("mixtral-8x7b", "torchtitan", "fp8"),
                                                       ("llama3-8b", "torchtitan", "mxfp8"),
                                                       ("175b", "megatron-deepspeed", "fp8"),
                                                       ("qwen3-30b-a3b", "megatron-core", "fp8")])
def test_a_refusal_reads_only_the_cut_fields_it_declares(model, framework, precision):
    """The enumeration asks a framework's refusal once per the values of frameworks.REFUSAL_READS of a cut (tuner.space):
    layouts that differ in any other field of the cut (or dp, micro-batch) get the same answer, and both answers occur."""
    import itertools

    from tuner.frameworks import REFUSAL_READS, of
    from tuner.layout import Layout
    w = make_workload(model, 8, "b200" if precision == "mxfp8" else "h100", None, precision, framework)
    refusal, reads = of(w).refusal, REFUSAL_READS[framework]
    answers: dict = {}
    for tp, sp, cp, pp, vp, split, ep, etp, zero, rc in itertools.product(
            (1, 2, 8), (False, True), (1, 2), (1, 4), (1, 2), ("auto", "light-last"), (1, 8), (1, 2), (0, 1, 2, 3),
            ("none", "selective", "mla_up", "moe_act", "full")):
        lay = Layout(tp=tp, sequence_parallel=sp, context_parallel=cp, pp=pp, virtual_pipeline=vp, pipeline_split=split,
                     dp=64 // (tp * cp * pp), expert_parallel=ep, expert_tensor_parallel=etp, micro_batch=1 + ep % 3,
                     zero_stage=zero, recompute=rc)
        key = (*(getattr(lay, f) for f in reads), zero, rc)
        answers.setdefault(key, set()).add(refusal(lay, w))
    assert all(len(got) == 1 for got in answers.values()), [k for k, got in answers.items() if len(got) > 1][:3]
    assert {got.pop() is None for got in answers.values()} == {True, False}     # both kinds of answer were asked


@pytest.mark.parametrize("top,show_all", [(10, False), (None, False), (40, True)])
def test_plan_in_worker_processes_is_plan_in_one(planned, top, show_all):
    from tuner.cli.plan import plan_ranking
    w, layouts, _ = planned
    one, many = rank_shown(layouts, w, top, show_all), plan_ranking(layouts, w, top, show_all, jobs=3)
    assert many.shown == one.shown and many.screened == one.screened


@pytest.fixture
def cli_signals():
    """The CLI's handlers (SIGTERM and SIGHUP raise, as in `tuner plan`), put back afterwards."""
    import signal

    from tuner.cli import catch_termination
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP)}
    catch_termination()
    yield
    for s, h in saved.items():
        signal.signal(s, h)


@pytest.mark.timeout(300)
def test_plan_workers_end_with_the_pool_under_the_clis_signal_handlers(planned, cli_signals):
    """Forked under handlers that raise, a worker waiting on a pool's queue lock could outlive terminate()
    and the plan waited on it for ever (seen about once in 150 plans): workers start with SIGTERM's default."""
    import multiprocessing

    from tuner.cli.plan import plan_ranking
    w, layouts, _ = planned
    one = rank_shown(layouts, w, 10, False)
    for _ in range(10):
        assert plan_ranking(layouts, w, 10, False, jobs=2).shown == one.shown
    assert multiprocessing.active_children() == []


@pytest.mark.timeout(300)
def test_a_sigterm_while_workers_rank_ends_every_worker_without_a_traceback(cli_signals, capfd):
    """SIGTERM to `tuner plan` while its workers rank: the plan ends as Ctrl-C does (tuner.cli.Terminated), the
    workers with it, and none prints a traceback (before: one `Terminated: SIGTERM` traceback per worker)."""
    import multiprocessing
    import os
    import signal
    import threading

    import psutil

    from tuner.cli import Terminated
    from tuner.cli.plan import plan_ranking
    w = make_workload("deepseek-v3", 128, "h100")          # 147,768 layouts: seconds of ranking to interrupt
    layouts = valid_layouts(load_space("default"), w)
    before = {p.pid for p in psutil.Process().children()}          # what earlier tests of the session started
    threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGTERM)).start()
    with pytest.raises(Terminated):
        plan_ranking(layouts, w, 10, False, jobs=2)
    assert multiprocessing.active_children() == []
    assert [p for p in psutil.Process().children() if p.pid not in before] == []
    assert "Traceback" not in capfd.readouterr().err


def test_plan_ranks_with_the_collector_paused_and_turns_it_on_again():
    """`tuner plan` enumerates and screens with Python's cyclic collector off (tuner.workers.collector_paused: a
    fifth of DeepSeek-V3's plan was collections walking the layouts kept); on again afterwards, also when the
    block fails, and left off where it was off."""
    import gc

    from tuner.workers import collector_paused
    assert gc.isenabled()
    with collector_paused():
        assert not gc.isenabled()
    assert gc.isenabled()
    with pytest.raises(ValueError), collector_paused():
        raise ValueError("a refusal")
    assert gc.isenabled()
    gc.disable()
    try:
        with collector_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_tuner_plan_ranks_with_the_collector_off(tuner, monkeypatch):
    """`tuner plan` itself ranks inside collector_paused (the test above checks the context manager alone): its
    ranking runs with the collector off, and the collector is on again once the command has printed."""
    import gc

    from tuner.cli import plan as plan_cli
    seen, real = [], plan_cli.plan_ranking

    def spy(*args, **kw):
        seen.append(gc.isenabled())
        return real(*args, **kw)

    monkeypatch.setattr(plan_cli, "plan_ranking", spy)
    code, out, err = tuner("plan", "--model", "llama3-8b", "--cluster", "h100", "--nodes", "1", "--top", "1")
    assert code == 0, err
    assert seen == [False] and gc.isenabled()


def test_the_cli_and_plan_start_without_numpy():
    """numpy is a quarter of the CLI's start-up (every command's); a plan below screening.BATCH_FROM layouts needs none
    of it (the searchers and the correction import it where they run, a larger plan its memory over columns), so neither
    `tuner --help` nor such a plan imports it."""
    import subprocess
    import sys
    code = ("import sys; from tuner.cli import main\n"
            "try: main(['plan', '--model', 'llama3-8b', '--cluster', 'h100', '--nodes', '1', '--top', '1'])\n"
            "except SystemExit as e: assert not e.code, e.code\n"
            "assert 'numpy' not in sys.modules, 'numpy imported'\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "valid megatron-core layouts" in done.stdout


def _fails_on_two(task):
    if task == 2:
        raise ValueError("task two refused")
    return task * 10


def _dies_on_two(task):
    import os
    if task == 2:
        os._exit(3)
    return task * 10


def test_forked_map_answers_in_order_and_a_workers_error_or_death_reaches_the_caller():
    """tuner.workers.forked_map (plan's workers): answers in the tasks' order; a worker's exception is raised in
    the parent, a worker that dies without answering is one clear error; no worker outlives either."""
    import multiprocessing

    from tuner.workers import fork_context, forked_map
    context = fork_context()
    assert forked_map(context, _fails_on_two, [3, 1, 0]) == [30, 10, 0]
    with pytest.raises(ValueError, match="task two refused"):
        forked_map(context, _fails_on_two, [1, 2, 3])
    with pytest.raises(RuntimeError, match="exit code 3"):
        forked_map(context, _dies_on_two, [1, 2, 3])
    assert multiprocessing.active_children() == []


def test_a_signal_while_workers_start_or_join_is_raised_once_they_are_all_listed(cli_signals):
    """forked_map starts and joins its workers with SIGTERM noted, not raised (a SIGTERM between a fork and the
    list of workers, or during one join, left a worker running): it is raised when the block ends, through the
    CLI's handler, which is back in place."""
    import os
    import signal

    from tuner.cli import Terminated
    from tuner.workers import _signals_held
    handler = signal.getsignal(signal.SIGTERM)
    reached = []
    with pytest.raises(Terminated):
        with _signals_held():
            os.kill(os.getpid(), signal.SIGTERM)
            reached.append("after the signal")
    assert reached == ["after the signal"] and signal.getsignal(signal.SIGTERM) is handler
