"""The eager (torchtitan without compile) activation account by architecture (issue 24): only a RoPE model keeps
RoPE's fp32 q and k; a model with a learned position table (MPT's presets, as llm-foundry's FSDP rows ran them)
keeps its projections' q, k, v and nothing rotated."""

from __future__ import annotations

import dataclasses

import pytest
from tuner.perfmodel import memory
from tuner.specs import load_model


def test_rope_keeps_fp32_q_and_k_a_learned_table_does_not():
    llama = load_model("llama3-8b")                    # RoPE, GQA kv/h 1/4, SwiGLU f/h 3.5
    assert memory.eager_split_bytes(llama) == pytest.approx(10 + 8 * 0.25 + 8 * 3.5)
    learned = dataclasses.replace(llama, position_embedding="learned")
    assert memory.eager_split_bytes(llama) - memory.eager_split_bytes(learned) == pytest.approx(4 + 4 * 0.25)


def test_mpt_keeps_qkv_attention_output_and_gelu():
    mpt = load_model("mpt-7b")                         # learned positions, MHA (kv = h), GeLU f = 4h
    assert mpt.position_embedding == "learned" and mpt.ffn_type == "gelu"
    kv, f = mpt.kv_size / mpt.hidden_size, mpt.ffn_hidden_size / mpt.hidden_size
    assert memory.eager_split_bytes(mpt) == pytest.approx(2 + 4 * kv + 2 + 2 + 4 * f)
