"""`tuner calibrate`: the pure fitting and rendering, and one real 2-rank measurement (--quick)."""

from __future__ import annotations

import pytest

import os
from pathlib import Path

import tuner.calibrate as calibrate_module
from tuner.calibrate import calibrate, check_target, cluster_option, default_name, resolve_target
from tuner.calibrate_fit import (HEADER, cluster_from_measurements, fit_gemm, fit_overhead, overhead_points,
                                 render_toml, with_overhead)
from tuner.layout import Layout
from tuner.errors import UsageError
from tuner.presets import shipped_presets
from tuner.specs import CLUSTER_KEYS, ClusterSpec, load_cluster


def fake_measurements(gpus=2):
    ranks = [{"rank": i, "baseline_gb": 0.25, "matmul": [[128, 0.01], [256, 0.02], [512, 0.04], [1024, 0.05]],
              "attention_tflops": 0.02, "copy_gbps": 8.0 + i, "allreduce_big_s": 0.02,
              "allreduce_small_s": 1e-4} for i in range(gpus)]
    return {"ranks": ranks, "gpus": gpus, "device": "cpu", "dtype": "fp32", "backend": "gloo",
            "memory_gb": 11.5, "allreduce_big_bytes": 16 << 20, "host": "h", "torch": "2", "seconds": 3.0}


def test_fit_gemm_puts_the_points_on_the_curve():
    peak = 100.0
    eff, knee = 0.9, 2.0
    points = [(f, peak * eff * f / (f + knee)) for f in (0.5, 2.0, 8.0, 64.0)]
    e, k = fit_gemm(points, peak)
    assert e == pytest.approx(eff * 64 / 66, rel=1e-3)
    assert e * 0.5 / (0.5 + k) == pytest.approx(eff * 0.5 / 2.5, rel=1e-3)   # smallest size on the curve
    assert fit_gemm([(1.0, 50.0), (8.0, 40.0)], 50.0) == (0.8, 1e-4)            # noisy, non-monotone: sane
    assert fit_gemm([], 1.0) == (1.0, 1e-4)


def test_cluster_from_measurements_is_a_valid_cluster(tmp_path):
    m = fake_measurements()
    c = cluster_from_measurements(m, 2)
    assert set(c) <= set(CLUSTER_KEYS)
    assert c["name"] == "local" and c["gpus_per_node"] == 2 and c["peak_tflops"] == 0.05
    assert c["hbm_bandwidth_gbps"] == 8.0                       # slowest rank
    assert c["intra_node_bandwidth_gbps"] == pytest.approx(2 * 1 / 2 * (16 << 20) / 0.02 / 1e9, rel=1e-3)
    assert c["latency_us"] == pytest.approx(50.0)
    path = tmp_path / "local.toml"
    path.write_text(render_toml(c, m))
    spec = load_cluster(str(path))
    assert spec == ClusterSpec.from_dict(c)
    one = cluster_from_measurements({**fake_measurements(1)}, 1)
    assert ClusterSpec.from_dict(one).gpus_per_node == 1


def test_fit_overhead_recovers_the_constants_of_the_model():
    o, c, dl = 5.0, 12.0, 400.0                 # ms per micro-batch, ms per step, us per message
    pts = [(p0 + k * o * 1e-3 + c * 1e-3 + n * dl, p0, k, n)
           for p0, k, n in ((0.006, 1, 2e-6), (0.024, 4, 2e-6), (0.008, 1, 36e-6), (0.030, 4, 144e-6))]
    assert fit_overhead(pts) == pytest.approx((o, c, dl), rel=1e-3)
    # two runs differing only in m (formulas.md): per micro-batch and per step, no latency term
    assert fit_overhead([(0.020, 0.006, 1.0), (0.050, 0.024, 4.0)]) == pytest.approx((4, 10, 0), rel=1e-3)
    # never negative: a model that already over-predicts the growth in m puts it all on the step
    o2, c2, dl2 = fit_overhead([(0.020, 0.006, 1.0), (0.030, 0.024, 4.0)])
    assert o2 == 0 and c2 > 0 and dl2 == 0
    assert fit_overhead([(0.010, 0.012, 1.0, 0.0)]) == (0.0, 0.0, 0.0)   # nothing left to explain
    assert fit_overhead([]) == (0.0, 0.0, 0.0)


def test_overhead_from_harness_runs_makes_the_model_match_them(tmp_path):
    from tuner.perfmodel import predict
    from tuner.specs import Workload, load_model
    cluster = cluster_from_measurements(fake_measurements(), 2)
    lays = [Layout(tp=1, pp=1, dp=2, micro_batch=4, zero_stage=0, recompute="none"),
            Layout(tp=2, pp=1, dp=1, micro_batch=4, zero_stage=0, recompute="none")]
    truth = ClusterSpec.from_dict({**cluster, "microbatch_overhead_ms": 4.0, "step_overhead_ms": 9.0,
                                   "latency_us": cluster["latency_us"] + 500.0})
    tiny = load_model("tiny")
    runs = [{"layout": lay.as_dict(), "m": m, "global_batch": 4 * lay.dp * m,
             "step_s": predict(lay, Workload(tiny, truth, 1, 4 * lay.dp * m)).step_time_s}
            for lay in lays for m in (1, 4)]
    assert [round(p[2]) for p in overhead_points(runs, cluster, tiny)] == [1, 4, 1, 4]   # k = m + p - 1
    fitted = with_overhead(cluster, {"model": "tiny", "runs": runs})
    assert fitted["microbatch_overhead_ms"] == pytest.approx(4.0, rel=1e-3)
    assert fitted["step_overhead_ms"] == pytest.approx(9.0, rel=1e-3)
    assert fitted["latency_us"] == pytest.approx(truth.latency_us, rel=1e-3)
    assert with_overhead(cluster, {"model": "tiny", "runs": [], "error": "x"}) == cluster   # failed: defaults
    m = {**fake_measurements(), "overhead": {"model": "tiny", "runs": runs, "latency_tight_us": cluster["latency_us"]}}
    path = tmp_path / "local.toml"
    path.write_text(render_toml(fitted, m))
    assert load_cluster(str(path)) == ClusterSpec.from_dict(fitted)
    assert "tp2-pp1-dp1-mb4-z0-rcnone m=4" in path.read_text()


def test_refuses_to_overwrite_without_force(tmp_path):
    out = tmp_path / "local.toml"
    out.write_text("keep me")
    with pytest.raises(UsageError, match="--force"):
        calibrate(out, gpus=2)
    assert out.read_text() == "keep me"
    with pytest.raises(UsageError, match="--gpus"):
        calibrate(tmp_path / "x.toml", gpus=0)


@pytest.fixture
def no_measuring(monkeypatch):
    """calibrate must refuse before it measures anything: measuring fails the test."""
    def measured(*a, **k):
        raise AssertionError("measured before refusing")
    monkeypatch.setattr(calibrate_module, "measure", measured)
    monkeypatch.setattr(calibrate_module, "measure_overhead", measured)


def test_refuses_to_write_over_a_shipped_preset_before_measuring(tmp_path, monkeypatch, no_measuring, tuner):
    local = Path(str(shipped_presets("clusters")["local"]))
    before = local.read_bytes()
    link = tmp_path / "mine.toml"
    link.symlink_to(local)
    monkeypatch.chdir(tmp_path)
    for out in (local, link, Path(os.path.relpath(local, tmp_path))):    # as given, through a link, through '..'
        with pytest.raises(UsageError, match="shipped cluster preset 'local'.*--out"):
            calibrate(out, gpus=2, force=True)                   # --force does not get round it
    monkeypatch.chdir(local.parents[2])          # the repository root: ./workloads/clusters/local.toml IS the preset
    for args in (["--out", "workloads/clusters/local.toml", "--force"], ["--name", "local", "--force"],
                 ["--out", "./search_spaces/default.toml"]):
        code, out, err = tuner("calibrate", "--quick", *args)
        assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, (args, err)
        assert "shipped" in err and "--out" in err
    assert local.read_bytes() == before


def test_a_calibrated_file_in_the_presets_folder_is_the_users(tmp_path, monkeypatch):
    """In the repository root a file calibrate wrote into ./workloads/clusters/ lies beside the presets:
    --force refreshes it (it starts with calibrate's header); a preset never."""
    mine, preset = tmp_path / "box.toml", tmp_path / "frontier.toml"
    mine.write_text(f"{HEADER} on box\nname = 'box'\n")
    preset.write_text("name = 'frontier'\n")
    monkeypatch.setattr(calibrate_module, "shipped_preset_at", lambda p: "cluster preset 'x'")
    check_target(mine, force=True)
    with pytest.raises(UsageError, match="--force"):
        check_target(mine, force=False)
    with pytest.raises(UsageError, match="shipped"):
        check_target(preset, force=True)


def test_the_default_file_is_named_after_this_host(tmp_path, monkeypatch):
    assert default_name("Node-01.example.com") == "node-01"
    assert default_name("gpu box_2") == "gpu-box_2"
    assert default_name("local") == "local-measured" and default_name("Frontier.olcf") == "frontier-measured"
    assert default_name("...") == "this-host"
    monkeypatch.setattr(calibrate_module.socket, "gethostname", lambda: "Lab-PC7.uni.edu")
    monkeypatch.chdir(tmp_path)
    out, name = resolve_target(None, None)
    assert (out, name) == (Path("workloads/clusters/lab-pc7.toml"), "lab-pc7")
    assert cluster_option(out) == "lab-pc7"                     # what `--cluster` takes from here
    assert resolve_target(None, "rig") == (Path("workloads/clusters/rig.toml"), "rig")
    assert resolve_target("x/c.toml", None) == (Path("x/c.toml"), "lab-pc7")
    assert cluster_option(Path("x/c.toml")) == str(tmp_path / "x" / "c.toml")
    with pytest.raises(UsageError, match="--name"):
        resolve_target(None, "../up")


@pytest.mark.timeout(120)
def test_calibrate_two_ranks_writes_a_loadable_cluster(tmp_path):
    pytest.importorskip("torch")
    out = tmp_path / "workloads" / "clusters" / "local.toml"
    out.parent.mkdir(parents=True)
    out.write_text("old")
    r = calibrate(out, gpus=2, quick=True, force=True)            # --force overwrites
    spec = load_cluster(str(out))
    assert spec.name == default_name() and spec.gpus_per_node == 2        # named after this host
    assert r["cluster_option"] == str(out.resolve())
    assert spec.peak_tflops > 0 and spec.intra_node_bandwidth_gbps > 0 and spec.hbm_bandwidth_gbps > 0
    assert r["cluster"]["peak_tflops"] == spec.peak_tflops
    assert "measured" in out.read_text().lower()
    assert "fitted to harness runs" in out.read_text()         # --quick: the data-parallel pair only
    assert len(r["measurements"]["overhead"]["runs"]) == 2
    # a bound on the work done, not on the time it took: --quick times 3 steps per harness run
    assert all(len(run["step_times"]) == 3 for run in r["measurements"]["overhead"]["runs"])


def test_the_overhead_runs_take_the_trial_timeout_the_local_runners_hint_names(tmp_path, monkeypatch, tuner):
    """A fresh machine's first harness run builds DeepSpeed's CPU op; where that outlasts 90 s the runner says
    'raise --trial-timeout': calibrate takes it, hands it to every overhead run, and its warning names it."""
    from types import SimpleNamespace
    import tuner.runners.local as local
    from tuner.trial import Status
    seen = []

    class SlowBuild:
        def __init__(self, **kw):
            seen.append(kw["trial_timeout"])

        def run(self, spec):
            return SimpleNamespace(status=Status.TIMEOUT, message="an op build did not finish")
    monkeypatch.setattr(local, "LocalRunner", SlowBuild)
    cluster = cluster_from_measurements(fake_measurements(), 2)
    got = calibrate_module.measure_overhead(cluster, 2, "cpu", quick=True, trial_timeout=600.0)
    assert seen == [600.0] and got["runs"] == [] and ": timeout an op build" in got["error"]
    monkeypatch.setattr(calibrate_module, "measure", lambda gpus, device, quick: fake_measurements(gpus))
    code, out, err = tuner("calibrate", "--gpus", "2", "--quick", "--out", str(tmp_path / "c.toml"))
    assert code == 0 and seen[-1] == calibrate_module.OVERHEAD_TIMEOUT_S            # the default, 90 s
    assert "rerun with --force" in err and "add --trial-timeout 600" in err, err
    code, out, err = tuner("calibrate", "--gpus", "2", "--quick", "--force", "--out", str(tmp_path / "c.toml"),
                           "--trial-timeout", "900")
    assert code == 0 and seen[-1] == 900.0, err
