"""The parameters one GPU holds: a transformer layer's per TP rank, the word embedding's, a pipeline stage's (its
layers, the embedding and LM head where they sit, the multi-token prediction modules), the routed experts' share, the
largest layer's and the tied embedding's. Sizes are in parameters (tuner.perfmodel.memory turns them into bytes and
re-exports every name here)."""

from __future__ import annotations

from tuner.layout import Layout, stage_candidates, stage_layers, stage_moe_layers
from tuner.perfmodel.moe import moe_layer_params
from tuner.specs import ModelSpec

def layer_params(model: ModelSpec, tp: int) -> float:
    """Parameters of one transformer layer held by one TP rank.

    QKV, projection and FFN weights and the QKV and fc1 biases are split by t; the projection and fc2
    biases and the two normalizations are replicated. GPT: (4h^2 + 2hf + 3h + f)/t + 6h; Llama (GQA,
    SwiGLU, no biases, RMSNorm): (2h^2 + 2h*kv + 3hf)/t + 2h."""
    split = model.attention_weights + model.ffn_weights + model.layer_biases_split
    return split / tp + (model.layer_biases_replicated + 2 * model.norm_params)


def embedding_params(model: ModelSpec, tp: int) -> float:
    """The vocabulary-parallel word embedding (V*h/t) held by one TP rank."""
    return model.vocab_size * model.hidden_size / tp


def stage_params(model: ModelSpec, layout: Layout, stage: int) -> float:
    """Parameters one GPU holds on pipeline stage `stage`: its layers (tuner.layout.stage_layers), plus
    the word embedding and the learned position table (none with RoPE) on the first stage, and the final
    normalization and the LM head on the last: a copy of the word embedding when tied and pp > 1 (as
    DeepSpeed's TiedLayerSpec keeps it), nothing more when tied and pp = 1, its own V x h matrix when
    untied."""
    tp, pp = layout.tp, layout.pp
    moe = stage_moe_layers(layout, model, stage)
    n = (stage_layers(layout, model.num_layers, stage) - moe) * layer_params(model, tp)
    if moe:
        n += moe * sum(moe_layer_params(model, tp, layout.expert_parallel, layout.expert_tensor_parallel))
    if stage == 0:
        n += embedding_params(model, tp)
        if model.position_embedding == "learned":
            n += model.seq_length * model.hidden_size
    if stage == pp - 1:
        n += model.norm_params
        if pp > 1 or not model.tie_embeddings:
            n += embedding_params(model, tp)
        n += mtp_params(model, layout, pp)
    return n


def mtp_params(model: ModelSpec, layout: Layout, pp: int) -> float:
    """The last stage's multi-token prediction modules on one GPU (tuner.perfmodel.stages._add_mtp): each a layer of the
    last layer's kind, eh_proj (2h x h, split by tp) and two norms; and the word embedding the stage then builds
    (gpt_model.py line 173 at d98e8a64ddf3) where pp > 1 (with one stage it is the first stage's)."""
    n = model.mtp_num_layers
    if not n:
        return 0.0
    tp, h = layout.tp, model.hidden_size
    layer = (sum(moe_layer_params(model, tp, layout.expert_parallel, layout.expert_tensor_parallel)) if model.is_moe
             else layer_params(model, tp))
    return n * (layer + 2.0 * h * h / tp + 2.0 * h) + (embedding_params(model, tp) if pp > 1 else 0.0)


def stage_expert_params(model: ModelSpec, layout: Layout, stage: int) -> float:
    """The routed-expert parameters among stage_params: sharded over the expert-data-parallel group
    (tuner.layout.expert_data_parallel), not over dp*cp like the rest."""
    moe = stage_moe_layers(layout, model, stage)
    if model.is_moe and stage == layout.pp - 1:
        moe += model.mtp_num_layers        # the multi-token prediction modules' MoE layers
    return moe * moe_layer_params(model, layout.tp, layout.expert_parallel, layout.expert_tensor_parallel)[1] if moe else 0.0


def largest_stage_params(model: ModelSpec, layout: Layout) -> tuple[float, float]:
    """(stage_params, stage_expert_params) of the stage holding the most parameters (of those that may, the pipeline
    split's candidates): what the step's gradient sync and optimizer move per GPU."""
    return max((stage_params(model, layout, s), stage_expert_params(model, layout, s))
               for s in stage_candidates(layout, model))


def max_layer_params(model: ModelSpec, layout: Layout) -> float:
    """One GPU's share of the largest layer (an MoE layer with its local experts, or a dense one)."""
    dense = layer_params(model, layout.tp) if model.num_moe_layers < model.num_layers else 0.0
    if not model.is_moe:
        return dense
    return max(dense, sum(moe_layer_params(model, layout.tp, layout.expert_parallel, layout.expert_tensor_parallel)))


def tied_embedding_params(model: ModelSpec, tp: int, pp: int) -> float:
    """Parameters of the word embedding whose gradient the first and last stages all-reduce every step:
    the tied embedding when pp > 1; none when untied or on one stage."""
    return embedding_params(model, tp) if model.tie_embeddings and pp > 1 else 0.0
