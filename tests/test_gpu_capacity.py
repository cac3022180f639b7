"""A GPU's capacity in the model's unit (issue 24): a preset states the bytes a process can allocate (memory_gib, as
cudaMemGetInfo / PyTorch's "total capacity" / rocm-smi give it, each with its source), read once into memory_gb in
GB of 1e9 bytes, the unit of every prediction; a user's memory_gb keeps meaning GB of 1e9."""

from __future__ import annotations

import dataclasses
import tomllib

import pytest

from tuner.errors import SpecError
from tuner.layout import Layout
from tuner.perfmodel import predict
from tuner.presets import find_spec_file, presets
from tuner.specs import ClusterSpec, load_cluster, make_workload

LOCAL = ("local", "local-slurm")


def test_h100_capacity_is_what_a_process_allocates_in_gb_of_1e9():
    # CUDA's total capacity of an H100 80GB is 79.11 GiB = 84.94 GB; the nameplate's 80 read as GB was 6 % short
    assert load_cluster("h100").memory_gb == pytest.approx(79.11 * 2 ** 30 / 1e9)
    assert load_cluster("h100").memory_gb > 84
    assert load_cluster("frontier").memory_gb == pytest.approx(68.70, abs=0.01)     # 63.98 GiB per MI250X GCD


def test_every_gpu_preset_states_memory_gib_below_its_binary_nameplate():
    for name in presets("clusters"):
        if name in LOCAL:
            continue
        raw = tomllib.loads(find_spec_file("clusters", name).read_text())
        assert "memory_gib" in raw and "memory_gb" not in raw, name
        c = load_cluster(name)
        assert c.memory_gb == pytest.approx(raw["memory_gib"] * 2 ** 30 / 1e9), name
        assert c.memory_reserved_gb < 0.1 * c.memory_gb, name      # the reserve is a share inside that total


def test_a_users_memory_gb_keeps_meaning_gb_and_memory_gib_is_converted_once():
    base = {k: v for k, v in load_cluster("h100").as_dict().items() if k != "memory_gb"}
    assert ClusterSpec.from_dict({**base, "memory_gb": 80.0}).memory_gb == 80.0
    stored = ClusterSpec.from_dict({**base, "memory_gib": 79.11})
    assert stored.as_dict()["memory_gb"] == pytest.approx(84.9437, abs=1e-4)
    assert "memory_gib" not in stored.as_dict()
    assert ClusterSpec.from_dict(stored.as_dict()).memory_gb == stored.memory_gb     # a stored study reads it back


@pytest.mark.parametrize("extra, says", [({"memory_gb": 80.0, "memory_gib": 79.11}, "not both"),
                                         ({"memory_gib": -1.0}, "must be > 0"),
                                         ({"memory_gib": "80"}, "must be float"),
                                         ({}, "missing cluster key(s) memory_gb")])
def test_bad_capacity_is_one_clear_line(extra, says):
    base = {k: v for k, v in load_cluster("h100").as_dict().items() if k != "memory_gb"}
    with pytest.raises(SpecError, match=r"(?s)^.*" + says.replace("(", r"\(").replace(")", r"\)")) as e:
        ClusterSpec.from_dict({**base, **extra}, "my.toml")
    assert "\n" not in str(e.value) and "memory_gib" in str(e.value)


def test_a_layout_between_the_nameplate_and_the_allocatable_bytes_is_likely_to_fit():
    # Llama 3 70B on 8 DGX H100 nodes, tp1 pp16 vp5 mb2 full recompute: ~81.8 GB, over "80" but under 84.9
    w = make_workload("llama3-70b", 8, "h100", global_batch=128, framework="megatron-core")
    lay = Layout(tp=1, pp=16, virtual_pipeline=5, dp=4, micro_batch=2, recompute="full")
    nameplate = dataclasses.replace(w, cluster=dataclasses.replace(w.cluster, memory_gb=80.0))
    p, old = predict(lay, w), predict(lay, nameplate)
    assert p.memory_gb == old.memory_gb and 80 < p.memory_gb < 84     # the prediction is the same bytes
    assert old.p_fit < 0.5 < p.p_fit
