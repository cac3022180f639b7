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

import indep_worlds as iw  # noqa: E402

from tuner.perfmodel import predict  # noqa: E402
from tuner.specs import make_workload  # noqa: E402
from tuner.trial import Status, TrialSpec  # noqa: E402


def spec(layout, workload, number=0):
    return TrialSpec("s", number, layout, workload)


def test_world_module_imports_nothing_of_the_model():
    code = (f"import sys; sys.path.insert(0, {str(BENCH)!r}); import indep_worlds as iw; "
            "w = iw.draw_world('network-bound', '22b', 2, 1); lay, v = w.optimum(); "
            "from tuner.trial import TrialSpec; w.runner().run(TrialSpec('s', 0, lay, w.workload)); "
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
    assert res.status == Status.OOM and res.peak_memory_gb > w.physics.usable * 64.0 and "OOM" in res.message


def test_optimum_is_a_runnable_layout_and_the_fastest():
    for fam in iw.FAMILIES:
        w = iw.draw_world(fam, "1t", 128, 4)
        lay, v = w.optimum()
        assert lay in w.candidates and w.truth(lay)[0] == v and math.isfinite(v) and v > 0
        assert all((w.truth(c)[0] or 0.0) <= v for c in w.candidates)
        res = w.runner(noise=0.02, seed=1).run(spec(lay, w.workload))
        assert res.status == Status.OK and res.samples_per_second == pytest.approx(v, rel=0.1)
        assert res.peak_memory_gb == w.truth(lay)[1] <= 64.0
