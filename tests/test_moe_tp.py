"""An MoE layer's tensor-parallel collectives (tuner/perfmodel/stages.attention_tp_only, issue 25): Megatron-Core's MoE
block routes the rank's own sequence-parallel tokens and moves them in its dispatcher (expert-TP group only), so a
model without shared experts pays the attention's TP collectives alone in its MoE layers, half a dense layer's; shared
experts gather and reduce-scatter as a dense FFN, and torchtitan's DTensor TP is charged as before."""

from __future__ import annotations

import pytest

from tuner.frameworks import FRAMEWORKS
from tuner.layout import Layout
from tuner.perfmodel import predict
from tuner.perfmodel.compute import shape_of
from tuner.perfmodel.moe_exchange import TokenExchange
from tuner.perfmodel.stages import layer_parts
from tuner.specs import make_workload

LAY = Layout(tp=2, sequence_parallel=True, pp=4, dp=4, expert_parallel=8, micro_batch=1, recompute="none")


def _parts(model, framework="megatron-core", overlap=True, lay=LAY):
    w = make_workload(model, 4, "h100", None, "bf16", framework)
    hide = FRAMEWORKS[framework].overlaps if overlap else FRAMEWORKS[framework].overlaps - {"tp"}
    return layer_parts(lay, w, shape_of(lay, w), TokenExchange(overlaps=hide), None)


def test_moe_layers_pay_the_attention_tp_collectives_alone():
    plain = _parts("qwen3-235b-a22b", overlap=False)
    assert plain.tp_comm > 0 and plain.tp_moe == pytest.approx(plain.tp_comm / 2.0)
    hidden = _parts("qwen3-235b-a22b")
    assert hidden.tp_moe < hidden.tp_comm
    shared = _parts("deepseek-v3", lay=Layout(tp=2, sequence_parallel=True, pp=8, dp=4, expert_parallel=8,
                                               micro_batch=1, recompute="none"), overlap=False)
    assert shared.tp_moe == shared.tp_comm              # the shared expert's FFN gathers as a dense one


def test_the_step_charges_it_and_torchtitan_is_unchanged():
    w = make_workload("qwen3-235b-a22b", 4, "h100", None, "bf16", "megatron-core")
    ex = TokenExchange(overlaps=FRAMEWORKS["megatron-core"].overlaps - {"tp"})
    tp = predict(LAY, w, ex).time_breakdown["tp_comm"]
    parts = _parts("qwen3-235b-a22b", overlap=False)
    dense = parts.m * parts.tp_comm * w.model.num_layers / LAY.pp          # were every layer charged as a dense one
    assert 0.45 < tp / dense < 0.6                                            # every layer is an MoE layer
    titan = _parts("qwen3-235b-a22b", framework="torchtitan")
    assert titan.tp_moe == titan.tp_comm
