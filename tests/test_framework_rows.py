"""benchmarks/data/framework_published.toml: published, measured throughputs of FSDP (llm-foundry),
torchtitan and Megatron-Core runs. Checks the rows' shape only (keys, presets, values); no prediction."""

from __future__ import annotations

import functools
import tomllib
from pathlib import Path

import pytest

from tuner.specs import ModelSpec, load_cluster, load_model

DATA = Path(__file__).resolve().parents[1] / "benchmarks" / "data" / "framework_published.toml"
REQUIRED = ("framework", "source", "release", "model", "cluster", "gpus", "precision", "seq_length", "global_batch",
            "micro_batch", "tp", "pp", "cp", "vp", "sequence_parallel", "recompute", "distributed_optimizer",
            "tokens_per_s_per_gpu", "note")
OPTIONAL = ("zero_stage", "model_tflops_per_gpu", "peak_memory_gib", "oom", "grad_reduce", "optimizer",
            "pipeline_split", "num_layers", "hidden_size", "num_attention_heads", "machine", "added", "shape_name",
            "num_query_groups", "ffn_hidden_size", "vocab_size", "ffn_type", "position_embedding", "normalization",
            "head_dim",
            "add_bias_linear", "tie_embeddings",
            # what a run's recipe ran where the table leaves it unstated, read onto the row after its prediction
            # (its split key keeps the table's reading): benchmarks/reading.layout_of, ran_breakdown
            "ran_recompute", "ran_sequence_parallel", "optimizer_state", "read", "ran_norm", "ran_fp32_logits",
            "ran_loss_chunks")
FRAMEWORKS = ("torchtitan", "fsdp", "megatron-core", "megatron-deepspeed")
UNSTATED = "unstated"
MODEL_ROW_KEYS = ("num_layers", "hidden_size", "num_attention_heads", "num_query_groups", "ffn_hidden_size",
                  "vocab_size", "ffn_type", "position_embedding", "normalization", "add_bias_linear", "tie_embeddings",
                  "head_dim")


@functools.cache
def _rows() -> list[dict]:
    with open(DATA, "rb") as f:
        return tomllib.load(f)["row"]


@functools.cache
def _model(name):
    return load_model(name)


@functools.cache
def _cluster(name):
    return load_cluster(name)


def test_file_has_rows_of_every_stack():
    rows = _rows()
    assert 40 <= len(rows) <= 300
    assert {r["framework"] for r in rows} == {"torchtitan", "fsdp", "megatron-core", "megatron-deepspeed"}
    assert any("peak_memory_gib" in r for r in rows)


#: a run's speed as it ran where its launch ran otherwise than tuner's (benchmarks/speed_as_ran.py): a step's seconds
#: beyond tuner's (qk_norm_gather_s, attention_kernel_s) and the framework overlaps its config turned off (OVERLAP_KEYS)
SPEED_AS_RAN = ("ran_qk_norm", "ran_attention", "tp_comm_overlap", "overlap_grad_reduce", "ran_fp8_params")


@pytest.mark.parametrize("i", range(len(_rows())))
def test_row(i):
    r = _rows()[i]
    where = f"row {i + 1} ({r.get('model')}, {r.get('gpus')} GPUs)"
    missing = [k for k in REQUIRED if k not in r]
    assert not missing, f"{where} lacks {missing}"
    unknown = set(r) - set(REQUIRED) - set(OPTIONAL) - set(SPEED_AS_RAN)
    assert not unknown, f"{where} has unknown keys {unknown} (no 'apart': every row is in the headline)"
    assert r["framework"] in FRAMEWORKS, where
    assert r.get("ran_recompute", "none") in ("none", "selective", "full"), where
    assert r.get("optimizer_state", "bf16") == "bf16" and ("ran_recompute" not in r or "read" in r), where
    assert r["precision"] in ("bf16", "fp8"), where
    assert r["recompute"] in ("none", "selective", "full", UNSTATED), where
    for k in ("sequence_parallel", "distributed_optimizer"):
        assert r[k] in (True, False, UNSTATED), f"{where}: {k}"
    for k in ("source", "release", "note"):
        assert isinstance(r[k], str) and r[k].strip(), f"{where}: {k}"
    assert " @ " in r["source"], f"{where}: source names no commit"

    for k in ("gpus", "seq_length", "global_batch", "micro_batch", "tp", "pp", "cp", "vp"):
        assert isinstance(r[k], int) and r[k] >= 1, f"{where}: {k} = {r[k]!r}"
    for k in ("tokens_per_s_per_gpu", "model_tflops_per_gpu", "peak_memory_gib"):
        if k in r:
            assert isinstance(r[k], (int, float)) and r[k] > 0, f"{where}: {k} = {r[k]!r}"
    if "peak_memory_gib" in r:
        assert "GiB" in r["note"] or "GB" in r["note"], f"{where}: the note must say what the memory figure is"
    if "oom" in r:
        assert r["oom"] is True, where
    if "zero_stage" in r:
        assert r["zero_stage"] in (0, 1, 2, 3), where
    if r["framework"] in ("fsdp", "torchtitan"):
        assert r.get("zero_stage") in (2, 3), f"{where}: FSDP rows shard parameters or gradients"

    # the layout divides the GPUs and the batch
    model_par = r["tp"] * r["pp"] * r["cp"]
    assert r["gpus"] % model_par == 0, where
    dp = r["gpus"] // model_par
    assert r["global_batch"] % (r["micro_batch"] * dp) == 0, f"{where}: global batch not a whole number of micro-batches"
    if r["vp"] > 1:
        assert r["pp"] > 1, where

    if r["model"] == "custom":      # a model no preset holds: its shape in the row (ModelSpec checks it)
        assert "shape_name" in r and "num_layers" in r, f"{where}: a custom model states shape_name and its shape"
        model = ModelSpec.from_dict({"name": r["shape_name"], "seq_length": r["seq_length"],
                                    **{k: r[k] for k in MODEL_ROW_KEYS if k in r}}, where)
        assert model.num_layers % (r["pp"] * r["vp"]) == 0 or "pipeline_split" in r, f"{where}: layers over pp x vp"
    else:
        model = _model(r["model"])
        assert model.name == r["model"], where
    cluster = _cluster(r["cluster"])
    assert cluster.name == r["cluster"], where
    assert r["gpus"] % cluster.gpus_per_node == 0, f"{where}: not whole {cluster.name} nodes"
    if "machine" in r:        # the machine it ran on has the GPUs its cluster names
        m = _cluster(r["machine"])
        assert (m.peak_tflops, m.memory_gb, m.gpus_per_node) == (cluster.peak_tflops, cluster.memory_gb,
                                                                  cluster.gpus_per_node), where
    if r["precision"] == "fp8":
        assert cluster.peak_tflops_fp8, f"{where}: an FP8 row on a cluster without an FP8 peak"
    if "peak_memory_gib" in r:
        # a reading in GiB cannot exceed the GPU's memory (GB) by more than the GiB/GB ratio
        assert r["peak_memory_gib"] * 1.073741824 <= cluster.memory_gb * 1.001, f"{where}: memory above the GPU's"


def test_no_duplicate_rows():
    seen = set()
    for r in _rows():
        key = tuple(r[k] for k in REQUIRED if k != "note")
        assert key not in seen, f"duplicate row: {key[:8]}"
        seen.add(key)


def test_a_custom_rows_head_width_reaches_its_model():
    """Qwen3-32B's 64 heads are 128 wide over hidden 5,120 (torchtitan's '32B' flavor): the row's head_dim is read onto
    the ModelSpec the benchmarks predict it with, not hidden / heads (80)."""
    import sys
    sys.path.insert(0, str(DATA.parents[1]))
    import published_rows
    r = next(r for r in _rows() if r.get("shape_name") == "qwen3-32b")
    m = published_rows.custom_model(r)
    assert m.head_dim == 128 and m.num_attention_heads * m.head_dim == 8192 != m.hidden_size
