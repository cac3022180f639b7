"""benchmarks/worlds_ext: worlds that share none of the model's formulas (issue 30)."""

from __future__ import annotations

import math
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCH))

from worlds_ext import FAMILIES, WORKLOADS, draw_physics, draw_world  # noqa: E402
from worlds_ext import memory_acct, network, schedule, step, tables  # noqa: E402

from tuner.layout import Layout  # noqa: E402
from tuner.perfmodel import rank  # noqa: E402
from tuner.space import SearchSpace  # noqa: E402
from tuner.trial import Status, TrialSpec, oom_capacity_gb  # noqa: E402

#: Small spaces (few seconds per family): the families' own dimensions with fewer choices.
SMALL = {
    "frontier-2023": {"tp": [1, 2, 4, 8], "sequence_parallel": [False], "context_parallel": [1],
                      "pp": "divisors:num_layers",
                      "virtual_pipeline": [1], "micro_batch": [1, 2, 4], "zero_stage": [0, 1, 2, 3],
                      "recompute": ["none", "full"]},
    "default": {"tp": [1, 2, 4, 8], "sequence_parallel": [True, False], "context_parallel": [1, 2], "pp": [1, 2, 4, 8],
                "virtual_pipeline": [1, 2], "expert_parallel": [1, 2, 8], "expert_tensor_parallel": [1],
                "micro_batch": [1, 2], "zero_stage": [0, 1, 3], "recompute": ["none", "selective", "full"]},
}


def small_world(family: str, seed: int, case: int = 0):
    model, nodes, cluster, fw = WORKLOADS[family][case]
    name = "frontier-2023" if (cluster, fw) == ("frontier", "megatron-deepspeed") else "default"
    space = SearchSpace.from_dict({"dimensions": SMALL[name], "constraints": {"enough_micro_batches": "m >= 1"}},
                                  f"small-{name}")
    return draw_world(family, case, seed, space=space)


def test_worlds_import_nothing_of_the_model():
    code = (f"import sys; sys.path.insert(0, {str(BENCH)!r}); from worlds_ext import draw_world, FAMILIES; "
            "from tuner.trial import TrialSpec\n"
            "for f in FAMILIES:\n"
            "    w = draw_world(f, 0, 1); [w.truth(c) for c in w.candidates[::400]]\n"
            "    w.runner().run(TrialSpec('s', 0, w.candidates[0], w.workload))\n"
            "print(sorted(m for m in sys.modules if m.startswith(('tuner.perfmodel', 'tuner.correction', "
            "'tuner.metrics', 'tuner.best')) or m in ('indep_worlds', 'indep_modern', 'world')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_constants_are_drawn_per_seed_and_family_and_not_per_node_count():
    case = WORKLOADS["pipeline-host"][1]
    drawn = [draw_physics("pipeline-host", case, s) for s in range(4)]
    for key in ("mb_ms", "jitter", "straggler", "gemm_scale", "frag0"):
        assert len({d[key] for d in drawn}) == 4, key
    host, roof = draw_physics("pipeline-host", case, 0), draw_physics("gemm-roofline", case, 0)
    assert host["mb_ms"] > roof["mb_ms"] and host["jitter"] > roof["jitter"]
    w = draw_world("pipeline-host", 1, 5)
    assert w.at_nodes(32).physics == w.physics and w.at_nodes(32).workload.nodes == 32
    with pytest.raises(ValueError, match="unknown family"):
        draw_world("quantum", 0, 1)


def test_measured_tables_are_what_xla_measured_and_interpolate_between():
    # a measured H100 row (data/xla_matmul.csv: sm_90, b=1, 4096^3 bf16) comes back as measured
    assert tables.gemm_flops("sm_90", "bf16", 4096, 4096, 4096) == pytest.approx(783328793548203, rel=0.02)
    small, big = tables.gemm_flops("sm_90", "bf16", 512, 512, 512), tables.gemm_flops("sm_90", "bf16", 8192, 8192, 8192)
    assert small < 0.1 * big and big == pytest.approx(tables.gemm_peak("sm_90", "bf16"), rel=0.05)
    times = [tables.collective_seconds("sm_90", "all-reduce", 8, b) for b in (1e4, 1e6, 1e8, 1e9)]
    assert times == sorted(times) and times[-1] / times[-2] > 5          # bandwidth-bound at the top
    ph = {"hw": "sm_90", "nic_gbps": 400.0, "nic_eff": 0.8, "congestion": 0.1, "lat_inter_us": 10.0, "a2a_eff": 0.5}
    inside = network.collective(ph, "all-reduce", 1e9, 8, 1, 8)
    across = network.collective(ph, "all-reduce", 1e9, 64, 1, 8)
    assert across > inside > 0


_XLA_TEXT = """
    key: "sm_90"
    value {
      entries {
        instruction {
          name: "collective-permute"
          opcode: "collective-permute"
          shape {
            element_type: BF16
            dimensions: 1048576
          }
          source_target_pairs {
            target: 1
          }
          source_target_pairs {
            source: 1
          }
        }
        network_throughput_bytes_per_sec: 50000000000
      }
      entries {
        instruction {
          name: "_"
          opcode: "all-reduce"
          shape { element_type: F32 dimensions: 65536 }
          iota_collective_device_list {
            num_replica_groups: 1
            num_devices_per_group: 8
          }
        }
        network_throughput_bytes_per_sec: 4000000000
      }
    }
"""


def test_each_xla_entry_keeps_its_own_throughput():
    """A collective-permute states source_target_pairs, not replica groups: its row is its own (a pair's swap: group
    2), and the entry after it is not swallowed (the extraction once took the next entry's group and throughput)."""
    from worlds_ext.extract_xla import collective_rows
    assert collective_rows(_XLA_TEXT) == [("sm_90", "all-reduce", 262144, 8, 1, 4000000000),
                                          ("sm_90", "collective-permute", 2097152, 2, 4, 50000000000)]
    for hw in ("sm_90", "gfx942"):        # the stored table: a send's speed rises with its size, as a link's does
        rates = [b / tables.collective_seconds(hw, "collective-permute", 2, b) for b in (1e5, 1e6, 1e7, 1e8)]
        assert rates == sorted(rates), (hw, rates)


def test_simulated_pipeline_is_the_closed_form_when_every_op_is_alike():
    rng = np.random.default_rng(0)
    for pp, vp, m in ((4, 1, 16), (4, 2, 16), (8, 4, 32)):
        fwd, bwd = [[1.0 / vp] * vp] * pp, [[2.0 / vp] * vp] * pp
        t = schedule.makespan(fwd, bwd, 0.0, 0.0, [1.0] * pp, 0.0, m, rng)
        assert t == pytest.approx((m + (pp - 1) / vp) * 3.0)
        assert schedule.pipeline_time(fwd, bwd, 0.0, 0.0, [1.0] * pp, 0.0, 4 * m, rng) == \
            pytest.approx((4 * m + (pp - 1) / vp) * 3.0)
    # a straggler stage and jitter make it slower than the closed form; host cost adds per op
    fwd, bwd = [[1.0]] * 4, [[2.0]] * 4
    base = (16 + 3) * 3.0
    assert schedule.makespan(fwd, bwd, 0.0, 0.0, [1.0, 1.0, 1.3, 1.0], 0.0, 16, rng) > base * 1.2
    assert schedule.makespan(fwd, bwd, 0.0, 0.0, [1.0] * 4, 0.1, 16, rng) > base
    assert schedule.makespan(fwd, bwd, 0.0, 0.5, [1.0] * 4, 0.0, 16, rng) == pytest.approx(base + (16 + 3) * 1.0)


def test_in_flight_micro_batches_follow_each_frameworks_schedule():
    ds = draw_world("pipeline-host", 1, 1).workload                      # Megatron-DeepSpeed
    mc = draw_world("alloc-memory", 0, 1).workload                       # Megatron-Core
    lay = Layout(tp=4, pp=16, dp=2, micro_batch=1)
    # DeepSpeed's TrainSchedule.num_pipe_buffers: max(2, min(stages - stage_id, micro_batches))
    assert [memory_acct.in_flight(lay, ds, r) for r in (0, 15)] == [16.0, 2.0]
    assert [memory_acct.in_flight(lay, mc, r) for r in (0, 15)] == [16.0, 1.0]
    vp = Layout(tp=4, sequence_parallel=True, pp=16, virtual_pipeline=2, dp=2, micro_batch=1)
    assert memory_acct.in_flight(vp, mc, 0) == ((16 - 1) * 2 + (2 - 1) * 16 + 1) / 2


def test_runner_measures_the_truth_with_seeded_noise_and_reports_ooms():
    w = small_world("alloc-memory", 3)
    runs = [c for c in w.candidates if w.truth(c)[0] is not None]
    ooms = [c for c in w.candidates if w.truth(c)[0] is None]
    assert runs and ooms
    r = w.runner(noise=0.02, seed=4)
    ok = r.run(TrialSpec("s", 0, runs[0], w.workload))
    again = w.runner(noise=0.02, seed=4).run(TrialSpec("s", 1, runs[0], w.workload))
    assert ok.status == Status.OK and ok.samples_per_second == again.samples_per_second
    assert abs(math.log(ok.samples_per_second / w.truth(runs[0])[0])) < 0.1
    # a run reports its allocated bytes, as a GPU run's max_memory_allocated: less than all the world's GPU needs
    assert ok.peak_memory_gb == memory_acct.peak_allocated_gb(w.physics, runs[0], w.workload) < w.truth(runs[0])[1]
    bad = r.run(TrialSpec("s", 2, ooms[0], w.workload))
    # an OOM learns no more of its need than PyTorch's message says: the memory the process had (in use + free)
    usable = w.workload.cluster.memory_gb * w.physics["usable"]
    assert bad.status == Status.OOM and bad.peak_memory_gb is None and w.truth(ooms[0])[1] > usable
    assert oom_capacity_gb(bad.message, w.workload.cluster.memory_reserved_gb) == pytest.approx(usable, rel=0.006)


def test_moe_world_reduces_expert_gradients_over_the_expert_data_parallel_group(monkeypatch):
    """Megatron-Core reduces the experts' gradients over intra_expt_dp_group, ranks ep x etp apart
    (distributed_data_parallel.py @ 00119989): an expert-heavy ZeRO-1 layout pays it, more on a wider group."""
    from worlds_ext import step
    paid = []
    for nodes in (8, 16):
        lay_n = Layout(tp=1, pp=1, dp=8 * nodes, expert_parallel=8, micro_batch=1, zero_stage=1)   # ep 8, etp 1
        w = draw_world("moe", 0, 3).at_nodes(nodes)
        ph = dict(w.physics, dp_overlap=0.0)
        fwd, bwd = step.chunk_times(ph, lay_n, w.workload)
        dense, experts = memory_acct.rank_params(lay_n, w.workload, 0)
        full = step.tail_s(ph, lay_n, w.workload, fwd, bwd)
        monkeypatch.setattr(step, "rank_params", lambda *a: (dense, 0.0))
        paid.append(full - step.tail_s(ph, lay_n, w.workload, fwd, bwd))
        monkeypatch.undo()
        assert step.expert_dp(lay_n) == (nodes, 8)
        reduce = (network.collective(ph, "reduce-scatter", 4.0 * experts, nodes, 8, 8)
                  + network.collective(ph, "all-gather", 2.0 * experts, nodes, 8, 8))
        assert paid[-1] >= reduce > 0.5 * full                     # the experts' reduce dominates the tail
    assert paid[1] > paid[0]

@pytest.mark.parametrize("family", FAMILIES)
def test_the_worlds_optimum_is_not_the_models_top_pick_in_most_seeds(family):
    """The point of these worlds: a searcher that trusts the model must still search."""
    misses = 0
    seeds = (11, 12, 13)
    for seed in seeds:
        w = small_world(family, seed)
        opt, _ = w.optimum()
        top = rank(w.candidates, w.workload)[0].layout
        misses += top != opt
    assert misses >= 2, f"{family}: the model ranks the optimum first in {len(seeds) - misses} of {len(seeds)} seeds"


def test_ext_search_runs_every_searcher_through_the_driver(capsys):
    import ext_search
    assert ext_search.main(["--seed-list", "5", "--families", "gemm-roofline", "--workloads", "0",
                            "--searchers", "guided,random", "--budget", "3", "--stop-budget", "4", "--transfer"]) == 0
    out = capsys.readouterr().out
    assert "gemm-roofline" in out and "guided" in out and "stop rule" in out and "seeds: 5" in out
    assert "`best --nodes 2N` picks: out of memory at 2N in " in out and "realised fit" in out
    assert "`best --nodes 2N`'s p_fit over every layout it weighs at 2N (" in out and "Brier score" in out
    assert "`best`'s faster-if-it-fits layout: offered in " in out
    assert "guided, belief" in out and "not the fastest measured: better in " in out and " of 1 studies; mean " in out
    assert "ran, fastest" in out and "2N, bound" in out
    line = next(line for line in out.splitlines() if line.startswith("gemm-roofline"))
    cells = [float(m) for m, _ in re.findall(r"(\d\.\d+) / (\d\.\d+)", line)]  # guided, random, belief, ran, 2N, bound
    assert len(cells) == 6
    guided, ran_best, transfer, bound = cells[0], cells[3], cells[4], cells[5]
    assert guided <= ran_best + 1e-9 and transfer <= bound + 1e-9      # the recommendation / answer is in its pool
    target = next(line for line in out.splitlines() if line.startswith("targets (issue 30): guided after 3 meets"))
    assert target.endswith("on 1 of 1 worlds") == (guided >= 0.97), target    # one seed: median = worst


def test_search_efficiency_prints_each_worlds_bounds_beside_guided_and_the_2n_answer(capsys):
    import search_efficiency
    assert search_efficiency.main(["--quick", "--searchers", "guided", "--seed-list", "5", "--jobs", "1"]) == 0
    out = capsys.readouterr().out
    assert "ran, fastest" in out and "2N, bound" in out and "fit_reliability.rule_bound" in out
    rows = [[float(m) for m, _ in re.findall(r"(\d\.\d+) / (\d\.\d+)", line)] for line in out.splitlines()
            if line.split()[:1] and line.split()[0].endswith("-bound") and "@" in line.split()[1]]
    rows = [r for r in rows if r]  # the worlds' model facts carry no "median / worst" pairs
    assert len(rows) == 3          # one world per family (--quick): guided @10, ran fastest, transfer 2N, 2N bound
    for guided, ran_best, transfer, bound in rows:
        assert guided <= ran_best + 1e-9 and transfer <= bound + 1e-9
    met = sum(guided >= 0.97 for guided, *_ in rows)
    assert f"guided after 10 meets 0.97 / 0.93 (median / worst) on {met} of 3 worlds" in out
    assert f"`best --nodes 2N` median >= 0.95 on {sum(t >= 0.95 for _, _, t, _ in rows)} of 3" in out


def test_the_targets_verdict_counts_each_world_by_its_median_and_worst_seed():
    from fit_reliability import verdict
    text = verdict([("a", [1.0, 0.98, 0.94], [0.96, 0.90, 0.99]), ("b", [0.99, 0.99, 0.92], [0.80, 0.99, 0.85]),
                    ("c", [0.96, 1.0, 0.95], None)])
    assert "meets 0.97 / 0.93 (median / worst) on 1 of 3 worlds (misses: b 0.990 / 0.920; c 0.960 / 0.950)" in text
    assert "median >= 0.95 on 1 of 2 (misses: b 0.850)" in text


def test_the_2n_bound_is_the_fastest_row_bests_rule_answers_from():
    """fit_reliability.rule_bound: the truly fastest of the rows that keep the memory headroom; where none does, of
    those likely to fit (p_fit >= 0.5), as tuner.best.fastest_unmeasured answers."""
    import fit_reliability

    speed = {"a": 0.8, "b": 1.0, "c": 0.9, "d": 0.6, "e": 0.95}
    rows = [{"layout": "a", "headroom_ok": True, "p_fit": 0.99}, {"layout": "b", "headroom_ok": False, "p_fit": 0.7},
            {"layout": "c", "headroom_ok": True, "p_fit": 0.96}]
    assert fit_reliability.rule_bound(rows, speed.get) == 0.9
    none_keep = [{"layout": "b", "headroom_ok": False, "p_fit": 0.4},
                 {"layout": "d", "headroom_ok": False, "p_fit": 0.6},
                 {"layout": "e", "headroom_ok": False, "p_fit": 0.5}]
    assert fit_reliability.rule_bound(none_keep, speed.get) == 0.95


def test_best_with_the_one_trial_it_names_keeps_the_faster_of_the_two(capsys):
    """fit_reliability.print_riskier: `best` plus the trial of its faster-if-it-fits layout keeps whichever ran faster;
    a layout that ran out of memory (0) leaves the answer."""
    import fit_reliability

    picks = [{"transfer": 0.8, "riskier": (0.7, 1.0)}, {"transfer": 0.9, "riskier": (0.6, 0.0)}, {"transfer": 0.95}]
    fit_reliability.print_riskier(picks)
    out = capsys.readouterr().out
    assert "offered in 2 of 3 worlds (stated p_fit mean 0.650, ran in 1, faster than the answer in 1)" in out
    assert "`best` alone 0.900 / 0.800, with that one trial 0.950 / 0.900" in out


def test_fit_reliability_bins_every_layout_by_its_stated_p_fit():
    """Each bin: its layouts, the worlds they come from, the mean stated p_fit, the realised fit rate over the layouts
    and over the worlds (each world's own rate, counted once); the Brier score over every pair."""
    import fit_reliability

    worlds = [[(0.01, False), (0.6, True), (0.65, False), (1.0, True)], [(0.6, True)], []]
    rows = {(lo, hi): rest for lo, hi, *rest in fit_reliability.reliability(worlds)}
    assert set(rows) == {(0.0, 0.02), (0.5, 0.7), (0.999, 1.0)}
    n, nw, stated, realised, per_world = rows[(0.5, 0.7)]
    assert (n, nw) == (3, 2)
    assert stated == pytest.approx((0.6 + 0.65 + 0.6) / 3)
    assert realised == pytest.approx(2 / 3) and per_world == pytest.approx((0.5 + 1.0) / 2)
    assert fit_reliability.brier(worlds) == pytest.approx((0.01 ** 2 + 0.4 ** 2 + 0.65 ** 2 + 0.0 + 0.4 ** 2) / 5)


def test_ext_search_cases_put_every_family_on_the_named_workloads():
    import argparse

    import ext_search
    ap_args = argparse.Namespace(seed_list="7", seeds=1, families="gemm-roofline,pipeline-host", searchers="guided",
                                 budget=10, stop_budget=0, transfer=False, workloads=None,
                                 cases=ext_search.cases_arg("1t:128:frontier:megatron-core,22b:2:frontier:megatron-core"))
    tasks, seeds = ext_search.tasks_for(ap_args)
    cases = [(t[1][0], t[1][1]) for t in tasks]
    assert seeds == [7]
    assert cases == [("gemm-roofline", ("1t", 128, "frontier", "megatron-core")),
                     ("gemm-roofline", ("22b", 2, "frontier", "megatron-core")),
                     ("pipeline-host", ("1t", 128, "frontier", "megatron-core")),
                     ("pipeline-host", ("22b", 2, "frontier", "megatron-core"))]
    with pytest.raises(argparse.ArgumentTypeError, match="model:nodes:cluster:framework"):
        ext_search.cases_arg("1t:128:frontier")
    # the hidden checks on each framework's space, by name: the four Frontier workloads
    for name, framework in (("frontier-mcore", "megatron-core"), ("frontier-deepspeed", "megatron-deepspeed")):
        assert ext_search.cases_arg(name) == [(m, n, "frontier", framework)
                                              for m, n in (("22b", 2), ("22b", 8), ("175b", 16), ("1t", 128))]


def test_the_independent_worlds_are_asked_no_offloaded_layout():
    """The independent worlds (search_efficiency.py) have no offloading physics: `best` at 2N, as that benchmark calls
    it, weighs no layout with offloaded activations, where the space alone would add offloaded twins
    (fit_reliability.without_offload)."""
    import fit_reliability

    from tuner.space import load_space, valid_layouts
    from tuner.specs import make_workload

    w2 = make_workload("llama3-70b", 32, "h100", framework="megatron-core")
    space = load_space("default")
    assert any(lay.offload_layers for lay in valid_layouts(space, w2))
    pinned = valid_layouts(fit_reliability.without_offload(space), w2)
    assert pinned and not any(lay.offload_layers for lay in pinned)
    assert set(pinned) == {lay for lay in valid_layouts(space, w2) if not lay.offload_layers}


def test_an_offloaded_layout_in_an_ext_world_frees_memory_and_pays_its_copies():
    """Megatron-Core's CPU activation offloading in the ext worlds: the offloaded layers' activations leave the GPU but
    for the buffers in flight, each crosses the host link both ways per micro-batch, a drawn share hidden; the world
    runs every offloaded layout Megatron-Core runs, the benchmark's searcher gets tuner's twins (study_candidates)."""
    import dataclasses

    import ext_search

    w = draw_world("alloc-memory", 1, 5)               # Llama 3 70B on 16 H100 nodes, Megatron-Core
    ph = w.physics
    plain = Layout(tp=8, sequence_parallel=True, pp=1, dp=16, micro_batch=2, zero_stage=2, recompute="none")
    twins = [dataclasses.replace(plain, offload_layers=n) for n in (20, 40, 60)]
    assert set(twins) <= set(w.candidates)
    mem = [memory_acct.peak_gb(ph, lay, w.workload) for lay in [plain] + twins]
    assert mem == sorted(mem, reverse=True) and mem[0] - mem[-1] > 10.0       # 60 layers' activations, less buffers
    per_layer = memory_acct.saved_layer_bytes(ph, plain, w.workload)
    copy = 40 * per_layer / (ph["host_gbps"] * 1e9 * ph["host_eff"])
    f, b = step.offload_s(ph, twins[1], w.workload, 0.0, 0.0)
    assert f == pytest.approx(copy) and b == pytest.approx(copy)               # nothing to hide under: all shown
    assert step.offload_s(ph, twins[1], w.workload, 10 * copy, 10 * copy) == (0.0, 0.0)
    assert step.offload_s(ph, plain, w.workload, 0.0, 0.0) == (0.0, 0.0)
    times = [w.workload.global_batch / step.step_s(ph, lay, w.workload, 5) for lay in [plain] + twins]
    assert times == sorted(times, reverse=True)                                 # offloading never speeds a layout
    assert not any(lay.offload_layers and lay.pp > 1 for lay in w.candidates)  # Megatron-Core's rules
    offered = ext_search.study_candidates(w)
    assert {c for c in offered if not c.offload_layers} == {c for c in w.candidates if not c.offload_layers}
    assert 0 < sum(c.offload_layers > 0 for c in offered) < sum(c.offload_layers > 0 for c in w.candidates)
