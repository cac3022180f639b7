"""benchmarks/attention_curve.py (issue 25): fused attention's rate by sequence as a model variant -- anchored on
the cluster constant at the sequence it was set for, faster at long sequences and on context-parallel ranks, the
flat constant where no kernel curve was published, and the model put back as it was."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest

from tuner.perfmodel import compute, moe
from tuner.perfmodel.compute import FLASH_BACKWARD_FLOPS, Shape
from tuner.specs import load_cluster, load_model

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import attention_curve as ac  # noqa: E402


def _attention(model, cluster, seq, cp=1, recompute="none"):
    m = dataclasses.replace(model, seq_length=seq)
    return compute.layer_times(m, cluster, Shape(b=1, t=1, c=cp, recompute=recompute))["attention"]


def _ratio(model, cluster, seq, cp=1, recompute="none"):
    """The variant's attention seconds over the model's."""
    flat = _attention(model, cluster, seq, cp, recompute)
    with ac.Variant():
        curved = _attention(model, cluster, seq, cp, recompute)
    return curved / flat


def test_anchor_keeps_the_cluster_constant():
    assert _ratio(load_model("llama3-8b"), load_cluster("h100"), ac.ANCHOR_SEQUENCE) == pytest.approx(1.0, rel=1e-12)


def test_long_sequences_and_cp_ranks_run_faster_per_flop_on_hopper():
    h100, model = load_cluster("h100"), load_model("qwen3-235b-a22b")
    r = {s: _ratio(model, h100, s) for s in (1024, 4096, 16384, 65536)}
    assert r[1024] > 1.0 > r[4096] > r[16384]
    assert r[65536] == pytest.approx(r[16384])          # held beyond the measured 16k
    # cp 8 at 128k: 16k-long kernels, 7/8 of the work unmasked (cuDNN forward at 16k: 595 unmasked, 539 causal)
    assert _ratio(model, h100, 131072, cp=8) < r[16384] * 0.95


def test_backward_over_forward_follows_the_kernels_and_recompute_pays_the_forward_share():
    h100, model = load_cluster("h100"), load_model("llama3-8b")
    fwd, bwd = ac.attention_passes(h100, ac.ANCHOR_SEQUENCE, 1, FLASH_BACKWARD_FLOPS)
    assert fwd + bwd == pytest.approx(1.0 + FLASH_BACKWARD_FLOPS)
    assert bwd / fwd > FLASH_BACKWARD_FLOPS * 1.2     # cuDNN's backward runs at ~0.75 of its forward's rate at 2k
    with ac.Variant():
        extra = (_attention(model, h100, ac.ANCHOR_SEQUENCE, recompute="selective")
                 - _attention(model, h100, ac.ANCHOR_SEQUENCE))
        plain = _attention(model, h100, ac.ANCHOR_SEQUENCE)
    assert extra == pytest.approx(plain * fwd / (1.0 + FLASH_BACKWARD_FLOPS))


@pytest.mark.parametrize("name", ["a100", "b200", "gb200", "frontier", "mi300x"])
def test_clusters_without_a_published_curve_keep_the_flat_constant(name):
    cluster, model = load_cluster(name), load_model("llama3-8b")
    assert ac.rates_of(cluster) is None
    for seq, cp in ((2048, 1), (32768, 4)):
        assert _ratio(model, cluster, seq, cp) == pytest.approx(1.0, rel=1e-12)


def test_the_variant_puts_the_model_back():
    before = (compute._assemble, moe._assemble)
    with ac.Variant():
        assert compute._assemble is not before[0] and moe._assemble is compute._assemble
    assert (compute._assemble, moe._assemble) == before
