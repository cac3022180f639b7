"""benchmarks/reading.py (issue 24): every accuracy benchmark reads a row one way -- the same workload, layout and
memory as it ran (`ran_*` keys included) -- and a recipe's activation offloading keeps TransformerEngine's count."""

from __future__ import annotations

import dataclasses
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
    from tuner.perfmodel.offload import resident_layers      # the model's count, which the readings use
    assert resident_layers(layers, offloaded) == _te_resident(layers, offloaded)
    assert resident_layers(layers, offloaded) == layers - offloaded + 1


def test_a_recipe_read_onto_a_row_enters_every_benchmarks_p_fit():
    """The Nemotron-340B row (NeMo 24.07's selective recompute, sequence parallelism and bf16 optimizer state):
    framework_accuracy and memory_accuracy predict it from one workload, layout and memory."""
    row = next(r for r in published.published() if r.get("optimizer_state") == "bf16")
    e = framework_accuracy.evaluate(row)
    m = memory_accuracy.evaluate(row, "published")
    assert e["layout"] == m["layout"] and e["layout"].recompute == row["ran_recompute"]
    lay, w = reading.layout_of(row), reading.workload_of(row)
    res = w.cluster.memory_reserved_gb          # the measured bias applies to the allocated part (tuner.perfmodel.fit)
    assert e["memory_gb"] == pytest.approx((m["pred"] - res) * math.exp(FRAMEWORKS[m["framework"]].memory_bias) + res)
    plain = reading.peak_as_ran({k: v for k, v in row.items() if k != "optimizer_state"}, lay, w)["total"]
    assert m["pred"] == pytest.approx(reading.peak_as_ran(row, lay, w)["total"]) and m["pred"] < plain - 5
    assert e["p_fit"] >= 0.5


def test_offloaded_rows_are_predicted_with_the_offload_in_the_hardware_benchmark():
    rows = [r for r in published.hardware() if r.get("ran_offload_layers")]
    assert rows
    for r in rows:
        lay, w = reading.layout_of(r), reading.workload_of(r)
        assert lay.offload_layers == r["ran_offload_layers"]          # the layout's dimension: memory and time
        plain = dataclasses.replace(lay, offload_layers=0)
        assert reading.peak_as_ran(r, lay, w)["activations"] < reading.peak_as_ran(r, plain, w)["activations"]
        assert hardware_accuracy.evaluate(r)["memory_gb"] == pytest.approx(reading.memory_as_ran(r, lay, w)[0])


def test_offloading_is_refused_where_megatron_core_refuses_it():
    from tuner.layout import why_invalid
    row = next(r for r in published.hardware() if r.get("ran_offload_layers"))
    lay, w = reading.layout_of({**row, "ran_recompute": "full"}), reading.workload_of(row)
    assert "refuses CPU offloading with recompute full" in why_invalid(lay, w)


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
            if r["framework"] != "fsdp" and not ({"optimizer_state", "ran_offload_layers", "ran_schedule",
                                                 "ran_recompute_also", "ran_loss_chunks"} & set(r))][::7]
    assert len(rows) > 20
    for r in rows:
        lay, w = reading.layout_of(r), reading.workload_of(r)
        if memory_accuracy.why_invalid(lay, w) or reading.ran_fp8_params(r, lay, w) is not None:
            continue
        pr = predict(lay, w)
        assert reading.memory_as_ran(r, lay, w) == pytest.approx((pr.memory_gb, pr.p_fit), abs=1e-9)


def test_published_fp8_weights_are_read_as_the_row_ran_them():
    """Megatron-Bridge's FP8 / MXFP8 recipes (fp8_param_gather; NVFP4's fp4_param_gather from 26.06) hold the layers'
    weights as TransformerEngine's quantized tensors alone; a row's ran_fp8_params says what it ran. Where that is what
    tuner's launch runs for the layout (--fp8-param-gather with a sharded optimizer), the model's own account stands
    (ran_fp8_params None); otherwise the stages are taken again with it, the word embedding and LM head bf16 either
    way, and the worst stage after it. Rows that state nothing are read as tuner's launch runs them."""
    from tuner.frameworks import of
    rows = [r for r in published.published() + published.hardware()
            if r["framework"] == "megatron-core" and r.get("precision") in ("fp8", "mxfp8", "nvfp4")]
    bridge = next(r for r in rows if r["release"].startswith("Megatron-Bridge") and r["precision"] == "fp8")
    rows += [dict(bridge, distributed_optimizer=False), dict(bridge, ran_fp8_params=False)]   # against the rule
    kinds = set()
    for r in rows:
        lay, w = reading.layout_of(r), reading.workload_of(r)
        if memory_accuracy.why_invalid(lay, w):
            continue
        alone, rule = reading.ran_fp8_params(r, lay, w), of(w).quantized_params(lay, w)
        release = r.get("release", "")
        ran = r.get("ran_fp8_params")
        if ran is None and release.startswith("Megatron-Bridge"):
            ran = w.precision != "nvfp4" or release >= "Megatron-Bridge 26.06"
        assert alone == (None if ran is None or ran == rule else ran)
        if alone is None:
            continue
        kinds.add((w.precision, alone))
        m = memory_accuracy.micro_batches_per_pipeline(lay, w.global_batch)
        stage = 1 if lay.pp > 2 else 0          # a middle stage: every weight a layer's; stage 0: the embedding too
        plain = memory_accuracy.memory.stage_memory(lay, w, stage, m)
        q = memory_accuracy.memory.stage_memory(lay, w, stage, m, fp8_params=alone)
        per = memory_accuracy.memory.quantized_weight_bytes(w.precision, w.cluster)
        layers = (q if alone else plain)["fp8_weights"] / per * 2.0           # the layers' bf16 weights, GB
        assert q["fp8_weights"] == pytest.approx(plain["fp8_weights"])          # the quantized bytes either way
        assert q["weights"] == pytest.approx(plain["weights"] + (-layers if alone else layers))
        if stage:
            assert min(q["weights"], plain["weights"]) == pytest.approx(0.0, abs=1e-9)
        assert q["total"] - plain["total"] == pytest.approx(q["weights"] - plain["weights"])
        got = reading.peak_as_ran(r, lay, w)
        assert got["total"] >= reading.ran_breakdown(r, lay, w, q)["total"] - 1e-9    # the worst stage after it
    assert {("nvfp4", True), ("fp8", True), ("fp8", False)} <= kinds, kinds


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


def test_torchtitan_613bfd0_rows_are_read_with_its_fused_norm_and_fp32_logits():
    """torchtitan @ 613bfd0cf: the LLaMa 2 13B no-AC row ran TritonFusedRMSNorm (2 bytes saved per element where the
    account's eager norm saves 8) and kept the fp32 logits through the loss's backward (4 bytes per logit): its
    layers' activations drop by 2 x 6 bytes per s*b*h element, the loss phase moves by -6 s*b*h + 4 s*b*V."""
    row = next(r for r in published.published() if r.get("ran_norm") == "fused_rmsnorm" and r["recompute"] == "none")
    lay, w = reading.layout_of(row), reading.workload_of(row)
    plain = reading.peak_as_ran({k: v for k, v in row.items() if not k.startswith("ran_")}, lay, w)
    ran = reading.peak_as_ran(row, lay, w)
    m = w.model
    sbh, logits = m.seq_length * lay.micro_batch * m.hidden_size, m.seq_length * lay.micro_batch * m.vocab_size
    assert plain["activations"] - ran["activations"] == pytest.approx(12 * sbh * m.num_layers / 1e9)
    assert ran["logits"] - plain["logits"] == pytest.approx((4 * logits - 6 * sbh) / 1e9)
    assert ran["total"] < plain["total"] - 15 and published.seen_by(row, "memory")
    assert memory_accuracy.evaluate(row, "published")["pred"] == pytest.approx(ran["total"])


def _h800_deepseek():
    return next(r for r in published.hardware() if r.get("cluster") == "h800" and r["model"] == "deepseek-v3")


def test_a_second_recompute_mode_frees_what_it_frees_alone():
    """ran_recompute_also (DeepSeek-V3's RMSNorm, MLA up-projection and SwiGLU recompute: mla_up with norm_act): each
    stage keeps the layout's activations less what the second mode frees on its own, and the model states as they are."""
    import dataclasses
    row = _h800_deepseek()
    lay, w = reading.layout_of(row), reading.workload_of(row)
    assert (lay.recompute, row["ran_recompute_also"]) == ("mla_up", "norm_act")
    m = reading.micro_batches_per_pipeline(lay, w.global_batch)
    alone = {rc: reading.memory.stage_memory(dataclasses.replace(lay, recompute=rc), w, 1, m)
             for rc in ("none", "mla_up", "norm_act")}
    both = reading.stage_as_ran(row, lay, w, 1, m, None)
    freed = 2 * alone["none"]["activations"] - alone["mla_up"]["activations"] - alone["norm_act"]["activations"]
    assert both["activations"] == pytest.approx(alone["none"]["activations"] - freed)
    assert freed > 0 and both["optimizer"] == alone["mla_up"]["optimizer"]
    with pytest.raises(ValueError, match="apart from"):
        reading.stage_as_ran({**row, "ran_recompute_also": "mla_up_mlp"}, lay, w, 1, m, None)


def test_dualpipe_holds_stage_r_and_its_mirror_on_one_device():
    """DeepSeek's DualPipe: rank r holds stage r and stage pp-1-r (1F1B's in-flight counts of both, pp + 1 in all):
    the two stages' breakdowns summed, one reserve; the H800 row's memory is its worst device's and fits."""
    stages = [{"weights": 1.0 * s, "activations": 10.0 * (4 - s), "reserved": 3.0, "total": 11.0 * s + 10.0 * (4 - s)
               + 3.0 - 1.0 * s} for s in range(4)]
    lay = reading.layout_of(_h800_deepseek())
    import dataclasses
    devices = reading.dualpipe_devices(dataclasses.replace(lay, pp=4), stages)
    assert [d["activations"] for d in devices] == [50.0, 50.0]       # (4 + 1) units of 10 on each device
    assert [d["weights"] for d in devices] == [3.0, 3.0] and devices[0]["reserved"] == 3.0
    assert devices[0]["total"] == pytest.approx(stages[0]["total"] + stages[3]["total"] - 3.0)
    with pytest.raises(ValueError, match="even number"):
        reading.dualpipe_devices(dataclasses.replace(lay, pp=3), stages[:3])
    row = _h800_deepseek()
    w = reading.workload_of(row)
    m = reading.micro_batches_per_pipeline(lay, w.global_batch)
    per_stage = [reading.stage_as_ran(row, lay, w, s, m, reading.ran_fp8_params(row, lay, w)) for s in range(lay.pp)]
    worst = max(per_stage[r]["total"] + per_stage[lay.pp - 1 - r]["total"] - 3.0 for r in range(lay.pp // 2))
    assert reading.peak_as_ran(row, lay, w)["total"] == pytest.approx(worst)
    assert w.optimizer_moments == "bf16" and w.model.mtp_num_layers == 1
    assert hardware_accuracy.evaluate(row)["p_fit"] >= 0.5


def test_the_mixtral_mi355x_row_is_read_as_primus_8_node_script():
    """The MI355X Mixtral 8x22B row ran Primus's 8-node script's micro batch 1 and global batch 512 (the table's Batch 2
    without recompute cannot have run); the split key stays the table's."""
    row = next(r for r in published.hardware() if r.get("cluster") == "mi355x" and r["model"] == "mixtral-8x22b")
    lay, w = reading.layout_of(row), reading.workload_of(row)
    assert (lay.micro_batch, w.global_batch, row["micro_batch"], row["global_batch"]) == (1, 512, 2, 128)
    table = {k: v for k, v in row.items() if not k.startswith("ran_")}
    assert published.split_key(row) == published.split_key(table)
    assert hardware_accuracy.evaluate(row)["p_fit"] >= 0.5 > hardware_accuracy.evaluate(table)["p_fit"]
