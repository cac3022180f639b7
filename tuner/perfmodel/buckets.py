"""Megatron-Core's gradient buckets: the one whose reduction cannot hide under the backward pass.

With --overlap-grad-reduce Megatron-Core cuts a model chunk's gradient buffer into buckets and reduces a bucket
as soon as the backward pass has produced all of its gradients (megatron/core/distributed/param_and_grad_buffer.py
at d98e8a64dd: `_compute_default_per_buffer_param_layout` walks the parameters in reverse order, backprop order,
and closes a bucket at the first parameter boundary where it holds >= bucket_size elements; `register_grad_ready`
starts its reduction once the last of its gradients is in). The bucket that closes the walk holds the first
layers and the word embedding: its gradients are ready only when the backward pass ends, so its reduce-scatter
(all-reduce without the distributed optimizer) runs after all compute, whatever the other buckets hide. With
--overlap-param-gather the same bucket's parameters are the forward pass's first need: `finish_param_sync`
dispatches and waits for its all-gather before the first layer runs, and only the later buckets' gathers are
prefetched under compute.

Bucketing is on only for the first model chunk of pipeline rank 0 (megatron/training/training.py at d98e8a64dd,
lines 2504-2515: `per_chunk_bucket_sizes` is None for chunks after the first and for pp ranks > 0), the rank whose
backward ends last; bucket_size defaults to max(40,000,000, 1,000,000 x the data-parallel group's size) elements,
that group being the one the gradients reduce over, data and context parallel together (training.py
`resolve_ddp_bucket_size`: get_pg_size(dp_cp_group), line 2189 at d98e8a64dd), and `tuner launch` writes no
--ddp-bucket-size unless the workload states one (Workload.ddp_bucket_size: then both use it). The routed experts' gradients are a buffer of their own
(reduced over the expert-data-parallel group); they are not walked here.

DeepSpeed ZeRO-3's gathers and reduce-scatters are counted over the same list of weights (zero3_collectives).
"""

from __future__ import annotations

from tuner.layout import Layout, stage_layers, stage_moe_layers
from tuner.perfmodel.memory import embedding_params
from tuner.perfmodel.moe import moe_layer_params
from tuner.specs import ModelSpec


def default_bucket_size(dp: int) -> float:
    """Megatron-Core's bucket size in elements when none is given: max(40M, 1M x the size of the group the gradients
    reduce over, dp x cp)."""
    return max(40_000_000.0, 1_000_000.0 * dp)


def _first_chunk_params(model: ModelSpec, layout: Layout) -> list[float]:
    """One GPU's parameters of pipeline rank 0's first model chunk, in Megatron-Core's registration (forward)
    order: the word embedding (and learned positions), then per layer its attention projection, QKV, fc1 and fc2
    weights split by tp (an MoE layer: its weights outside the routed experts as one unit), and with one stage the
    untied output layer. Norms and biases are left out (under 0.1 % of a layer)."""
    t, v = layout.tp, max(1, layout.virtual_pipeline)
    layers = stage_layers(layout, model.num_layers, 0)
    chunk = max(1, layers // v)
    dense = layers - stage_moe_layers(layout, model, 0)     # dense layers come first (DeepSeek-V3's three)
    h, f = model.hidden_size, model.ffn_hidden_size
    out = [embedding_params(model, t) + (model.seq_length * h if model.position_embedding == "learned" else 0.0)]
    for i in range(chunk):
        if i < dense:
            out += [model.o_width * h / t, model.qkv_weights / t, (model.ffn_matrices - 1) * h * f / t, f * h / t]
        else:
            out.append(moe_layer_params(model, t, layout.expert_parallel, layout.expert_tensor_parallel)[0])
    if layout.pp == 1 and not model.tie_embeddings:
        out.append(embedding_params(model, t))      # the output layer, registered last: the first bucket's
    return out


def _reverse_walk(params: list[float], size: float) -> tuple[int, float]:
    """Megatron-Core's walk in backprop order: (the buckets it makes, the elements of the one that closes it -- the
    remainder after the full buckets, or the last full bucket where the walk ends on a boundary)."""
    count, acc, closed = 0, 0.0, 0.0
    for n in reversed(params):
        acc += n
        if acc >= size:
            count, closed, acc = count + 1, acc, 0.0
    return count + (acc > 0), acc or closed


def _size(layout: Layout, bucket_size: float | None) -> float:
    return default_bucket_size(layout.dp * layout.context_parallel) if bucket_size is None else bucket_size


def last_bucket_params(model: ModelSpec, layout: Layout, bucket_size: float | None = None) -> float:
    """Elements of the bucket that closes the reverse walk over rank 0's first chunk (the embedding's bucket):
    the remainder after the full buckets, or the last full bucket where the walk ends on a boundary."""
    params = _first_chunk_params(model, layout)
    if model.tie_embeddings and layout.pp > 1:      # a shared embedding is a bucket of its own (distrib_optimizer.py
        return params[0]                            # `_does_param_require_new_bucket`, line 530)
    return _reverse_walk(params, _size(layout, bucket_size))[1]


def bucket_count(model: ModelSpec, layout: Layout, bucket_size: float | None = None) -> int:
    """How many gradient buckets (each one reduce-scatter, or all-reduce, and one parameter all-gather) pipeline rank
    0 runs a step: the reverse walk over its first chunk (a shared embedding a bucket of its own) and one bucket for
    each of its other v - 1 chunks, which are not bucketed (module docstring)."""
    params = _first_chunk_params(model, layout)
    extra = max(1, layout.virtual_pipeline) - 1
    if model.tie_embeddings and layout.pp > 1:
        params, extra = params[1:], extra + 1
    return _reverse_walk(params, _size(layout, bucket_size))[0] + extra


#: DeepSpeed ZeRO-3's defaults, which `tuner launch` keeps (its ds_config.json sets only the stage): parameters are
#: prefetched in groups of >= 5e7 elements and gradients reduced in buckets of <= 5e8 (deepspeed/runtime/zero/config.py
#: @ 38327e07f, prefetch_bucket_size and reduce_bucket_size; the same defaults in v0.3.14's zero/constants.py).
DS_PREFETCH_BUCKET, DS_REDUCE_BUCKET = 5e7, 5e8


def zero3_collectives(model: ModelSpec, layout: Layout) -> tuple[int, int]:
    """DeepSpeed ZeRO-3's collectives over the data-parallel group for one GPU's weights (its first stage's, tp-split):
    (all-gathers a pass -- forward, recompute, backward --, reduce-scatters a micro-batch). Today's DeepSpeed gathers the
    module it needs and prefetches the next parameters until they hold >= the prefetch bucket, each set as one coalesced
    all-gather (runtime/zero/partitioned_param_coordinator.py @ 38327e07f, fetch_sub_module / __all_gather_params_), and
    reduce-scatters a bucket before a gradient would overflow it (stage3.py, reduce_independent_p_g_buckets_and_remove_grads);
    v0.3.14 (2021) ran one all-gather and one reduce-scatter per parameter (partition_parameters.py _allgather_param,
    _reduce_scatter_gradient): the same counts wherever every weight holds >= 5e7 elements. Norms and biases are
    persistent (stage3_param_persistence_threshold 1e5) and left out, as _first_chunk_params does."""
    params = _first_chunk_params(model, layout)
    gathers = _reverse_walk(params[::-1], DS_PREFETCH_BUCKET)[0]     # forward order: a group closes at >= the bucket
    reduces, acc = 0, 0.0
    for n in reversed(params):
        if acc and acc + n > DS_REDUCE_BUCKET:
            reduces, acc = reduces + 1, 0.0
        acc += n
    return gathers, reduces + (acc > 0)
