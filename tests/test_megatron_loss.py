"""Megatron-Core's last stage at its unfused loss and the sequence-parallel gather buffer (issue 24 round 5,
tuner/perfmodel/memory_loss.megatron_loss_bytes, memory.megatron_phases, memory.sp_gather_bytes), against the
fake-tensor peaks of benchmarks/data/memory_measured_megatron-core*.toml (every row seen by this choice)."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest

from tuner.layout import micro_batches_per_pipeline
from tuner.perfmodel import memory
from tuner.perfmodel.compute import shape_of
from tuner.perfmodel.layer_backward import megatron_backward_bytes
from tuner.perfmodel.memory_loss import megatron_loss_bytes

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import memory_accuracy  # noqa: E402
from published import clean, measured  # noqa: E402


def _rows(pred) -> list[dict]:
    """The dense Megatron-Core measured rows this choice saw: never a held-out row no memory choice has seen (FRESH3's,
    published.clean), which a test would otherwise pin the account to."""
    out = []
    for r in measured():
        if r["framework"] != "megatron-core" or r.get("num_experts") or str(r.get("attention", "")).startswith("local"):
            continue
        if clean(r, "memory"):
            continue
        e = memory_accuracy.evaluate(r, "measured")
        if e and pred(r, e["layout"]):
            out.append(e)
    return out


LAST = _rows(lambda r, lay: r.get("stage", 0) == lay.pp - 1 and lay.pp > 1 and lay.virtual_pipeline == 1)


@pytest.mark.parametrize("e", LAST, ids=lambda e: e["layout"].key() + f"-s{e['workload'].model.seq_length}")
def test_last_stage_rows_within_three_percent(e):
    """Every dense last-stage row of 1F1B (flash stand-in; tracker_retained_gb is derived without interleaving): the loss
    phase, the gather buffer and the tracker's retained
    pipeline tensors bring it within 0.03 in log (before: up to +0.128, the bf16 logits and the retained tensors)."""
    assert abs(e["exact"]) < 0.03


def test_there_are_last_stage_rows():
    assert len(LAST) >= 10


def test_loss_phase_does_not_stack_on_the_recomputed_layer():
    """Full recompute: the loss's tensors are freed before any layer recomputes, so the stage holds the larger of
    (checkpoints + loss) and (checkpoints + the working layer + its backward, tuner/perfmodel/layer_backward.py), not
    their sum."""
    e = next(e for e in LAST if e["layout"].recompute == "full")
    lay, w = e["layout"], dataclasses.replace(e["workload"], framework="megatron-core")
    sh, m = shape_of(lay, w), micro_batches_per_pipeline(lay, w.global_batch)
    mem = memory.stage_memory(lay, w, lay.pp - 1, m, sh)
    loss = megatron_loss_bytes(w.model, lay.tp, sh.sp, sh.tokens) / 1e9
    act = memory.stage_activation_bytes(w.model, lay, lay.pp - 1, m, sh, w.cluster.flash_attention, None, True)
    act = (act + (memory.sp_gather_bytes(w.model, sh) if sh.sp else 0.0)) / 1e9
    bwd = megatron_backward_bytes(w.model, lay.tp, sh.sp, sh.tokens, lay.pp) / 1e9
    assert mem["activations"] + mem["logits"] == pytest.approx(max(act + bwd, act - _working(w, sh) + loss), rel=1e-9)
    assert mem["activations"] + mem["logits"] < act + loss


def _working(w, sh) -> float:
    full, _, ckpt = memory.layer_activation_bytes(w.model, sh, w.cluster.flash_attention)
    return (full - ckpt) / 1e9


def test_unfused_loss_holds_six_bytes_per_logit_where_the_forward_peaks():
    """A long sequence at a small hidden size: the loss's forward (bf16 logits and their fp32 copy) is the larger
    moment; a short one at a large hidden size: the output layer's backward (its bf16 weight gradient)."""
    e = LAST[0]
    model = e["workload"].model
    long = dataclasses.replace(model, seq_length=8192, hidden_size=4096, vocab_size=128256)
    s, h, v = 8192, 4096, 128256
    assert megatron_loss_bytes(long, 1, False, 1.0) == pytest.approx(4 * s * h + 6 * s * v)
    short = dataclasses.replace(model, seq_length=1024, hidden_size=8192, vocab_size=128256)
    s, h = 1024, 8192
    assert megatron_loss_bytes(short, 1, False, 1.0) == pytest.approx(4 * s * h + 2 * s * v + 2 * v * h + 2 * s * h)


def test_gather_buffer_only_with_sequence_parallelism():
    e = next(e for e in LAST if e["layout"].tp > 1 and e["layout"].sequence_parallel)
    lay, w = e["layout"], dataclasses.replace(e["workload"], framework="megatron-core")
    m = micro_batches_per_pipeline(lay, w.global_batch)
    on = memory.stage_parts(lay, w, 0, m, shape_of(lay, w))[2]
    off_lay = dataclasses.replace(lay, sequence_parallel=False)
    off = memory.stage_parts(off_lay, w, 0, m, shape_of(off_lay, w))[2]
    no_buf = memory.stage_activation_bytes(w.model, off_lay, 0, m, shape_of(off_lay, w), w.cluster.flash_attention,
                                           None, True)
    assert off == pytest.approx(no_buf)
    sh = shape_of(lay, w)
    assert on - memory.stage_activation_bytes(w.model, lay, 0, m, sh, w.cluster.flash_attention, None, True) == \
        pytest.approx(2 * w.model.seq_length * sh.tokens * w.model.hidden_size)
