"""benchmarks/reading.py (issue 24): every accuracy benchmark reads a row one way -- the same workload, layout and
memory as it ran (`ran_*` keys included) -- and a recipe's activation offloading keeps TransformerEngine's count."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

from tuner.frameworks import FRAMEWORKS

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import framework_accuracy  # noqa: E402
import hardware_accuracy  # noqa: E402
import memory_accuracy  # noqa: E402
import published  # noqa: E402
import reading  # noqa: E402


def _te_resident(layers: int, offloaded: int) -> int:
    """TransformerEngine 2.7's AsyncDoubleBufferGroupOffloadHandler, step by step: group g (layer g < offloaded)
    is freed at the end of layer layer_window_map[g], one group after another; the most layers held at once."""
    window, constant = {}, 0
    for i in range(offloaded):
        window[i] = (layers // offloaded) * (i + 1) - 1
        if i < layers % offloaded:
            window[i] += i + 1
            constant = i + 1
        else:
            window[i] += constant
    held, freed, most = set(), 0, 0
    for layer in range(layers):
        held.add(layer)
        most = max(most, len(held))
        if freed < offloaded and window[freed] == layer:
            held.discard(freed)
            freed += 1
    return most


@pytest.mark.parametrize("layers,offloaded", [(80, 40), (80, 20), (80, 30), (126, 95), (126, 92), (10, 9), (7, 3)])
def test_offloading_keeps_transformer_engines_count(layers, offloaded):
    assert reading.offload_resident_layers(layers, offloaded) == _te_resident(layers, offloaded)
    assert reading.offload_resident_layers(layers, offloaded) == layers - offloaded + 1


def test_a_recipe_read_onto_a_row_enters_every_benchmarks_p_fit():
    """The Nemotron-340B row (NeMo 24.07's selective recompute, sequence parallelism and bf16 optimizer state):
    framework_accuracy and memory_accuracy predict it from one workload, layout and memory."""
    row = next(r for r in published.published() if r.get("optimizer_state") == "bf16")
    e = framework_accuracy.evaluate(row)
    m = memory_accuracy.evaluate(row, "published")
    assert e["layout"] == m["layout"] and e["layout"].recompute == row["ran_recompute"]
    assert e["memory_gb"] == pytest.approx(m["pred"] * math.exp(FRAMEWORKS[m["framework"]].memory_bias))
    lay, w = reading.layout_of(row), reading.workload_of(row)
    plain = reading.peak_as_ran({k: v for k, v in row.items() if k != "optimizer_state"}, lay, w)["total"]
    assert m["pred"] == pytest.approx(reading.peak_as_ran(row, lay, w)["total"]) and m["pred"] < plain - 5
    assert e["p_fit"] >= 0.5


def test_offloaded_rows_are_predicted_with_the_offload_in_the_hardware_benchmark():
    rows = [r for r in published.hardware() if r.get("ran_offload_layers")]
    assert rows
    for r in rows:
        lay, w = reading.layout_of(r), reading.workload_of(r)
        kept = reading.peak_as_ran(r, lay, w)
        plain = reading.peak_as_ran({k: v for k, v in r.items() if k != "ran_offload_layers"}, lay, w)
        layers, n = w.model.num_layers, r["ran_offload_layers"]
        assert kept["activations"] == pytest.approx(plain["activations"] * (layers - n + 1) / layers)
        assert hardware_accuracy.evaluate(r)["memory_gb"] == pytest.approx(reading.memory_as_ran(r, lay, w)[0])


def test_offloading_is_refused_where_megatron_core_refuses_it():
    row = next(r for r in published.hardware() if r.get("ran_offload_layers"))
    lay, w = reading.layout_of({**row, "ran_recompute": "full"}), reading.workload_of(row)
    with pytest.raises(ValueError, match="pp 1, no recompute"):
        reading.peak_as_ran(row, lay, w)


def test_llm_foundry_rows_are_predicted_as_composer_fsdp1_ran_mpt():
    """An MPT row's activations are its block's saved tensors (34 bytes per s*b*h element for MPT-7B: norms 8,
    unpadded q, k, v and flash's output 10, the GELU FFN 16) and, in the loss phase, flash-attn's fused loss keeps
    4 bytes per logit; the model states are FSDP's sharded 16 bytes per parameter, as tuner's torchtitan account."""
    row = next(r for r in published.published() if r["framework"] == "fsdp" and r["model"] == "mpt-7b"
               and r["recompute"] == "none")
    lay, w = reading.layout_of(row), reading.workload_of(row)
    assert reading.mpt_layer_bytes(w.model) == 34.0 and reading.mpt_layer_bytes(w.model, fp8=True) == 27.0
    mem = reading.peak_as_ran(row, lay, w)
    m = w.model
    sbh = lay.micro_batch * m.seq_length * m.hidden_size
    kept = m.num_layers * 34.0 * sbh
    loss_phase = kept + 4.0 * sbh + 4.0 * lay.micro_batch * m.seq_length * m.vocab_size
    assert (mem["activations"] + mem["logits"]) * 1e9 == pytest.approx(max(loss_phase, kept), rel=1e-9)
    plain = memory_accuracy.memory.peak_memory(lay, w, 10 ** 6)[1]
    assert all(mem[k] == plain[k] for k in ("weights", "gradients", "optimizer", "reserved"))
    assert mem["total"] == pytest.approx(sum(mem[k] for k in ("weights", "gradients", "optimizer", "activations",
                                                               "logits", "zero3_buffers", "reserved")))


def test_a_row_without_recipe_keys_is_stated_as_predict_states_it():
    """reading.memory_as_ran states what tuner.perfmodel.predict states when the recipe changes nothing (one p_fit)."""
    from tuner.perfmodel import predict
    rows = [r for r in published.published() + published.hardware()
            if r["framework"] != "fsdp" and not ({"optimizer_state", "ran_offload_layers"} & set(r))][::7]
    assert len(rows) > 20
    for r in rows:
        lay, w = reading.layout_of(r), reading.workload_of(r)
        if memory_accuracy.why_invalid(lay, w) or reading.quantized_weight_bytes(r, w) is not None:
            continue
        pr = predict(lay, w)
        assert reading.memory_as_ran(r, lay, w) == pytest.approx((pr.memory_gb, pr.p_fit), abs=1e-9)


def test_megatron_bridge_fp8_recipes_hold_the_layers_weights_quantized_only():
    """fp8_param_gather (Megatron-Bridge's FP8 / MXFP8 precision configs; NVFP4 from 26.06): the layers' weights are
    TransformerEngine's quantized tensors alone (Blackwell: FP8 1 byte, MXFP8 2 + 2/32, NVFP4 1 + 2/16), the word
    embedding and LM head stay bf16, and the worst stage is taken after it."""
    rows = [r for r in published.hardware() if r.get("release", "").startswith("Megatron-Bridge")]
    seen = set()
    for r in rows:
        lay, w = reading.layout_of(r), reading.workload_of(r)
        per = reading.quantized_weight_bytes(r, w)
        if memory_accuracy.why_invalid(lay, w):
            continue
        if w.precision == "bf16" or (w.precision == "nvfp4" and r["release"] < "Megatron-Bridge 26.06"):
            assert per is None
            continue
        assert per == reading.QUANTIZED_WEIGHT_BYTES[w.precision]
        seen.add(w.precision)
        got = reading.peak_as_ran(r, lay, w)
        m = memory_accuracy.micro_batches_per_pipeline(lay, w.global_batch)
        stage = 1 if lay.pp > 2 else 0          # a middle stage: every weight a layer's; stage 0: the embedding too
        plain = memory_accuracy.memory.stage_memory(lay, w, stage, m)
        q = reading.quantized_weights(plain, w, lay, stage, per)
        if stage:
            assert q["weights"] == pytest.approx(plain["weights"] * per / 2.0) and q["fp8_weights"] == 0.0
        assert q["weights"] + q["fp8_weights"] < plain["weights"] + plain["fp8_weights"]
        assert q["total"] == pytest.approx(plain["total"] - (plain["weights"] + plain["fp8_weights"])
                                           + q["weights"] + q["fp8_weights"])
        assert got["total"] >= reading.ran_breakdown(r, lay, w, q)["total"] - 1e-9    # the worst stage after it
    assert seen == {"fp8", "mxfp8", "nvfp4"}
    h100 = dict(rows[0], cluster="h100", precision="fp8")
    assert reading.quantized_weight_bytes(h100, reading.workload_of(h100)) is None     # Hopper: not read so


def test_a_recipes_layout_read_onto_a_row_is_the_layout_it_is_predicted_with():
    """ran_pp / ran_vp / ran_micro_batch (a table whose cells disagree with the recipe at the row's tag): the row is
    predicted with the recipe's layout, and its split key is still the table's."""
    rows = [r for r in published.hardware() if "ran_pp" in r]
    assert len(rows) >= 2
    for r in rows:
        lay = reading.layout_of(r)
        assert (lay.pp, lay.virtual_pipeline, lay.micro_batch) == (r["ran_pp"], r["ran_vp"], r["ran_micro_batch"])
        assert lay.dp == r["gpus"] // (lay.tp * lay.context_parallel * lay.pp)
        table = {k: v for k, v in r.items() if not k.startswith("ran_")}
        assert published.split_key(r) == published.split_key(table)
        assert reading.layout_of(table).pp == r["pp"]
