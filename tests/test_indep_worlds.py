"""benchmarks/indep_worlds.py: worlds whose physics is written independently of tuner's model."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCH))

import indep_modern as im  # noqa: E402
import indep_worlds as iw  # noqa: E402

from tuner.layout import Layout  # noqa: E402
from tuner.perfmodel import predict  # noqa: E402
from tuner.specs import make_workload  # noqa: E402
from tuner.trial import Status, TrialSpec, oom_capacity_gb  # noqa: E402


def spec(layout, workload, number=0):
    return TrialSpec("s", number, layout, workload)


def test_world_module_imports_nothing_of_the_model():
    code = (f"import sys; sys.path.insert(0, {str(BENCH)!r}); import indep_worlds as iw; "
            "w = iw.draw_world('network-bound', '22b', 2, 1); lay, v = w.optimum(); "
            "from tuner.trial import TrialSpec; w.runner().run(TrialSpec('s', 0, lay, w.workload)); "
            "m = iw.draw_world('compute-bound', 'llama3-8b', 4, 1, 'h100', 'fp8'); "
            "[m.truth(c) for c in m.candidates[::50]]; assert 'indep_modern' in sys.modules; "
            "bad = sorted(m for m in sys.modules if m.startswith(('tuner.perfmodel', 'tuner.correction', "
            "'tuner.metrics', 'tuner.best')) or m == 'world'); print(bad)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_api_shape():
    assert iw.FAMILIES == ("compute-bound", "network-bound", "host-bound")
    assert all(isinstance(m, str) and isinstance(n, int) for m, n in iw.WORKLOADS) and len(iw.WORKLOADS) == 4
    w = iw.draw_world("host-bound", "22b", 2, 3)
    assert w.workload == make_workload("22b", 2) and "host-bound" in w.name
    r = w.runner(noise=0.02, seed=1)
    assert (r.name, r.measured, r.resources(None), r.cancel()) == ("world", True, {"CPU": 0.1}, None)
    with pytest.raises(ValueError, match="unknown family"):
        iw.draw_world("quantum-bound", "22b", 2, 0)


def test_parameters_differ_across_seeds_and_families():
    drawn = [iw.draw_physics("compute-bound", "gpt-22b", s).as_dict() for s in range(5)]
    for key in ("gemm_eta", "nic_gbps", "mb_ms", "frag", "dp_overlap"):
        assert len({d[key] for d in drawn}) == 5, key
    fams = [iw.draw_physics(f, "gpt-22b", 0) for f in iw.FAMILIES]
    assert fams[2].mb_ms > fams[0].mb_ms and fams[1].nic_gbps < fams[0].nic_gbps


def test_truth_is_deterministic():
    a, b = iw.draw_world("compute-bound", "22b", 8, 11), iw.draw_world("compute-bound", "22b", 8, 11)
    cands = a.candidates
    assert [a.truth(c) for c in cands] == [b.truth(c) for c in cands]
    assert sum(a.truth(c)[0] is not None for c in cands) > 10


def test_same_seed_same_physics_at_twice_the_nodes():
    for fam in iw.FAMILIES:
        n, n2 = iw.draw_world(fam, "175b", 16, 7), iw.draw_world(fam, "175b", 32, 7)
        assert n.physics == n2.physics
        assert n.physics != iw.draw_world(fam, "175b", 32, 8).physics
    # a runner of the N-node world measures the 2N-node workload with the same physics
    lay, v = n2.optimum()
    res = n.runner(noise=0.0).run(spec(lay, n2.workload))
    assert res.status == Status.OK and res.samples_per_second == pytest.approx(v)


def test_runner_noise_is_seeded_and_about_two_percent():
    w = iw.draw_world("network-bound", "22b", 8, 2)
    runs = [c for c in w.candidates if w.truth(c)[0] is not None]
    r1, r2, other = w.runner(0.02, seed=5), w.runner(0.02, seed=5), w.runner(0.02, seed=6)
    m1 = [r1.run(spec(c, w.workload)).samples_per_second for c in runs]
    assert m1 == [r2.run(spec(c, w.workload, 9)).samples_per_second for c in runs]
    assert m1 != [other.run(spec(c, w.workload)).samples_per_second for c in runs]
    logs = np.log(np.array(m1) / np.array([w.truth(c)[0] for c in runs]))
    assert len(runs) > 100
    assert 0.015 < logs.std() < 0.025 and abs(logs.mean()) < 0.006


def test_some_world_disagrees_with_the_models_memory_verdict():
    """In a small sample, some layout the model says fits is an OOM in the world, or one it prunes runs."""
    seen = []
    for fam in iw.FAMILIES:
        for seed in range(3):
            w = iw.draw_world(fam, "22b", 2, seed)
            for c in w.candidates:
                if predict(c, w.workload).fits != (w.truth(c)[0] is not None):
                    seen.append((w, c))
    assert seen
    w, c = next((w, c) for w, c in seen if w.truth(c)[0] is None)
    res = w.runner().run(spec(c, w.workload))
    assert res.status == Status.OOM and res.peak_memory_gb > w.physics.usable * 64.0
    # PyTorch's message, as a real run prints it: it says what the process had, the usable capacity
    usable = w.physics.usable * w.workload.cluster.memory_gb
    assert res.message.startswith("torch.OutOfMemoryError: HIP out of memory.")
    assert oom_capacity_gb(res.message, w.workload.cluster.memory_reserved_gb) == pytest.approx(usable, rel=0.006)


def test_optimum_is_a_runnable_layout_and_the_fastest():
    for fam in iw.FAMILIES:
        w = iw.draw_world(fam, "1t", 128, 4)
        lay, v = w.optimum()
        assert lay in w.candidates and w.truth(lay)[0] == v and math.isfinite(v) and v > 0
        assert all((w.truth(c)[0] or 0.0) <= v for c in w.candidates)
        res = w.runner(noise=0.02, seed=1).run(spec(lay, w.workload))
        assert res.status == Status.OK and res.samples_per_second == pytest.approx(v, rel=0.1)
        # a run reports its tensors' bytes (max_memory_allocated), below all the world's GPU needs (issue 24 round 6)
        assert res.peak_memory_gb == iw.mod.peak_memory_gb(w.physics, w.workload, lay, allocated=True)
        assert res.peak_memory_gb < w.truth(lay)[1] <= w.workload.cluster.memory_gb     # a GCD's 68.7 GB


# ------------------------------------------------------------------------------- today's dimensions
def modern(fam="compute-bound", model="llama3-8b", nodes=4, seed=0, precision="bf16"):
    return iw.draw_world(fam, model, nodes, seed, "h100", precision)


def lay(**kw):
    base = dict(tp=1, pp=1, dp=32, micro_batch=1, zero_stage=1, recompute="none")
    return Layout(**{**base, **kw})


def test_frontier_worlds_keep_their_figures():
    """GPT on Frontier without today's dimensions: the figures the Frontier-only worlds gave (the stop
    calibration was done on them), to the last bit."""
    w = iw.draw_world("compute-bound", "22b", 2, 0)
    assert w.space == "frontier-2023" and w.physics.n_cu == iw.draw_physics("compute-bound", "gpt-22b", 0).n_cu
    assert w.truth(Layout(tp=2, pp=2, dp=4, micro_batch=1, zero_stage=1, recompute="full")) == \
        (2.9031237155699694, 43.302324294619254)
    w = iw.draw_world("network-bound", "175b", 16, 5)
    assert w.truth(Layout(tp=4, pp=1, dp=32, micro_batch=1, zero_stage=3, recompute="full")) == \
        (0.08310777472314855, 32.327215374461694)


def test_modern_api_and_physics_ranges():
    assert all(len(e) == 4 and e[2] == "h100" and e[3] in ("bf16", "fp8") for e in iw.MODERN)
    assert {e[3] for e in iw.MODERN} == {"bf16", "fp8"} and len(iw.MODERN) >= 4
    w = modern(precision="fp8")
    assert w.space == "default" and w.workload.precision == "fp8" and "fp8" in w.name and "h100" in w.name
    drawn = [iw.draw_physics(f, "llama3-8b", s, "h100").as_dict() for f in iw.FAMILIES for s in range(4)]
    for key, (lo, hi) in iw.MODERN_RANGES.items():
        vals = [d[key] for d in drawn]
        assert len(set(vals)) == len(vals), key
    assert all(1.3 <= d["fp8_speedup"] <= 1.9 and d["n_cu"] == 132 and d["hbm_gbps"] >= 2900 and d["flash"]
               for d in drawn)
    # the modern constants come from their own stream: Frontier's draws are unchanged by them
    assert iw.draw_physics("host-bound", "gpt-22b", 3).mb_ms != iw.draw_physics("host-bound", "gpt-22b", 3, "h100").mb_ms
    with pytest.raises(ValueError, match="no hardware ranges"):
        iw.draw_physics("host-bound", "gpt-22b", 3, "a100")


@pytest.mark.parametrize("i", range(4))
def test_every_default_space_layout_evaluates(i):
    model, nodes, cluster, precision = iw.MODERN[i]
    w = iw.draw_world(iw.FAMILIES[i % 3], model, nodes, 100 + i, cluster, precision)
    kinds = {(c.sequence_parallel, c.context_parallel > 1, c.virtual_pipeline > 1, c.recompute) for c in w.candidates}
    assert len(kinds) >= 12      # every new dimension appears among the candidates
    out = [w.truth(c) for c in w.candidates]
    assert all(math.isfinite(m) and m > 0 and (v is None or (math.isfinite(v) and v > 0)) for v, m in out)
    runs = sum(v is not None for v, _ in out)
    assert 0.05 * len(out) < runs < len(out)
    opt, v = w.optimum()
    m = w.workload.model
    mfu = 6 * m.num_parameters * m.seq_length * v / (w.workload.gpus * w.workload.cluster.peak_tflops * 1e12)
    assert 0.1 < mfu < (1.0 if precision == "fp8" else 0.75)


def test_gpt_on_frontier_evaluates_the_default_space_too():
    w = iw.draw_world("network-bound", "22b", 2, 3, space="default")
    assert any(c.sequence_parallel for c in w.candidates)
    assert sum(w.truth(c)[0] is not None for c in w.candidates) > 10


def test_sequence_parallelism_lowers_memory_and_splits_the_replicated_work():
    w = modern("host-bound", seed=2)
    for kw in (dict(tp=2, dp=16), dict(tp=4, dp=8, recompute="full"), dict(tp=8, dp=2, pp=2)):
        a, b = lay(**kw), lay(**kw, sequence_parallel=True)
        assert w.truth(b)[1] < w.truth(a)[1]
        ph = w.physics
        la, lb = im.layer_s(ph, w.workload, a), im.layer_s(ph, w.workload, b)
        assert lb["fwd"] <= la["fwd"] * ph.sp_coll
    # on a stack that overlaps, SP's collectives are partly hidden
    wl = w.workload
    assert im.tp_comm_s(w.physics, wl, lay(tp=8, dp=4, sequence_parallel=True), 1e9, 2) < \
        im.tp_comm_s(w.physics, wl, lay(tp=8, dp=4), 1e9, 2) * w.physics.sp_coll


def test_interleaving_shrinks_the_bubble_and_costs_memory():
    assert im.pipeline_s([1.0] * 4, 8, 2) == pytest.approx(8 + 3 / 2)
    assert im.pipeline_s([1.0] * 4, 8, 1) == pytest.approx(8 + 3)
    w = modern("compute-bound", "llama3-70b", 16, 1)
    free = iw.Physics(**{**w.physics.as_dict(), "mb_ms": 0.0, "p2p_exposed": 0.0})   # no p2p, no dispatch cost
    base = lay(tp=8, sequence_parallel=True, pp=8, dp=2, micro_batch=1, recompute="full")
    t1 = im.step_s(free, w.workload, base)
    for v in (2, 5):
        tv = im.step_s(free, w.workload, Layout(**{**base.as_dict(), "virtual_pipeline": v}))
        assert tv < t1
        assert iw.evaluate(w.physics, w.workload, Layout(**{**base.as_dict(), "virtual_pipeline": v}))[1] > \
            iw.evaluate(w.physics, w.workload, base)[1]
    assert im.in_flight(Layout(**{**base.as_dict(), "virtual_pipeline": 2}), 256, 0) == 8 + 7 / 2


def test_context_parallelism_splits_activations_and_passes_kv():
    w = modern("network-bound", seed=4)
    a = lay(tp=4, sequence_parallel=True, dp=8, micro_batch=1)
    b = lay(tp=4, sequence_parallel=True, context_parallel=2, dp=4, micro_batch=1)
    assert im.tokens(w.workload, b) == 4096
    assert im.layer_activations(w.physics, w.workload, b)[0] == pytest.approx(
        im.layer_activations(w.physics, w.workload, a)[0] / 2)
    f, bw = im.cp_ring_s(iw.Physics(**{**w.physics.as_dict(), "cp_overlap": 0.0}), w.workload, b, 1.0, 2.0)
    assert 0 < f < bw
    assert im.cp_ring_s(iw.Physics(**{**w.physics.as_dict(), "cp_overlap": 1.0}), w.workload, b, 10.0, 20.0) == (0, 0)
    a_fwd = im.cp_attention_s(w.physics, w.workload, b)[0]
    assert a_fwd > im.cp_attention_s(w.physics, w.workload, a)[0] / 2     # the ring's blocks are less efficient


def test_selective_recompute_sits_between_none_and_full():
    w = modern("compute-bound", "llama3-70b", 16, 2)
    kw = dict(tp=8, sequence_parallel=True, pp=4, dp=4, micro_batch=1)
    none, sel, full = (im.step_s(w.physics, w.workload, lay(**kw, recompute=r)) for r in ("none", "selective", "full"))
    assert none < sel < full
    mems = [im.peak_memory_gb(w.physics, w.workload, lay(**kw, recompute=r)) for r in ("none", "selective", "full")]
    assert mems[0] >= mems[1] > mems[2]
    nf = iw.Physics(**{**w.physics.as_dict(), "flash": False})     # materialised scores: selective frees them
    m_nf = [im.peak_memory_gb(nf, w.workload, lay(**kw, recompute=r)) for r in ("none", "selective")]
    assert m_nf[1] < 0.9 * m_nf[0]


def test_fp8_speeds_up_gemms_and_costs_weight_memory():
    bf, f8 = modern("compute-bound", seed=3), modern("compute-bound", seed=3, precision="fp8")
    assert bf.physics == f8.physics
    big = lay(tp=2, sequence_parallel=True, dp=16, micro_batch=2)
    assert f8.truth(big)[0] > 1.1 * bf.truth(big)[0]
    assert f8.truth(big)[0] < 1.9 * bf.truth(big)[0]
    states = lay(tp=2, sequence_parallel=True, dp=16, micro_batch=1, recompute="full")
    ph = bf.physics
    extra = im.stage_params(f8.workload, states, 0) * ph.fp8_wbytes / iw.GB
    act = im.layer_activations(ph, bf.workload, states)[0] * (1 - ph.fp8_act) * ph.frag / iw.GB
    assert f8.truth(states)[1] - bf.truth(states)[1] == pytest.approx(extra - act, rel=1e-6)


def test_uneven_pipeline_split_holds_fewer_layers_on_the_ends():
    w = modern("host-bound", "llama3-70b", 16, 0)
    u = Layout(tp=4, sequence_parallel=True, pp=41, dp=1, micro_batch=1, recompute="full")
    assert [im.rank_layers(w.workload, u, r) for r in (0, 1, 40)] == [1, 2, 1]
    assert sum(im.rank_layers(w.workload, u, r) for r in range(41)) == 80
    v, mem = iw.evaluate(w.physics, w.workload, u)
    assert math.isfinite(mem) and (v is None or v > 0)
