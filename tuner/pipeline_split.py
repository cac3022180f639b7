"""How a layout cuts the transformer layers into pipeline stages (the layout's `pipeline_split`). Pure.

A pipeline of pp ranks with vp virtual stages each has n = pp*vp chunks, in Megatron's order: chunk c
runs on pipeline rank c % pp (its virtual stage c // pp), the embedding sits before chunk 0 and the LM
head and loss after chunk n - 1. A split names a rule that gives every chunk its layers:

- "auto": n equal chunks when n divides the layers; otherwise Megatron-Core's embedding- and loss-aware
  split when n divides layers + 2 ((layers + 2)/n per chunk, one fewer in the first and in the last:
  --account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split). The split of every
  layout stored before splits had names.
- "balanced": the layers alone balanced, the first layers % n chunks one layer more: DeepSpeed's
  PipelineModule (deepspeed/runtime/pipe/module.py line 412: partition_method "type:transformer", which
  Megatron-DeepSpeed's GPTModelPipe sets, megatron/model/gpt_model.py line 463, and ds_utils.
  partition_balanced; the same counts for every layers <= 96 and pp <= 16, checked against DeepSpeed at
  edaa72212672 and kept in tests/test_pipeline_layouts.py): BLOOM-176B's 70 layers on pp 12 as 6 x 10 + 5 x 2.
- "balanced-ends": the embedding and the loss counted as one layer each and layers + 2 balanced, the earlier
  chunks one more: torchtitan's own split (generate_llm_fqn_per_model_part with first/last stage "less
  layers" 1, torchtitan/distributed/pipeline_parallel.py line 236 at 238fa9953e4a) and DeepSeek-V3's 61
  layers on 32 chunks as NVIDIA runs them ("Et|(tt|)*30L": the embedding and one layer, 30 chunks of two,
  the loss alone; yanring/Megatron-MoE-ModelZoo best_practice/DeepSeekV3 on pp 8 x vp 4, and with the MTP
  layer "Et|(tt|)*30mL" in Megatron-Bridge perf_recipes/deepseek/h100/deepseek_v3.py line 48 at 067f987df03b).
- "light-last": the LM head and loss counted as three layers, the embedding as none (the earlier chunks
  take the surplus): NVIDIA's DeepSeek-V3 and Kimi-K2 recipes' layouts (Megatron-Bridge at 067f987df03b,
  src/megatron/bridge/recipes/deepseek/h100/deepseek_v3.py line 53, _get_deepseek_v3_pipeline_layout: pp 16
  as 4 | 4 x 14 | 1, pp 8 as 8 | 8 x 6 | 5, pp 4 as 16 | 16 | 16 | 13, the same lists over pp x vp).
A named split that gives the same chunks as an earlier one (balanced where n divides the layers) is not
a layout of its own: it is refused, naming the one to use, so a layout has one name.
"""

from __future__ import annotations

from functools import lru_cache

#: The named splits, in the order a layout takes the first that gives its chunks.
PIPELINE_SPLITS = ("auto", "balanced", "balanced-ends", "light-last")
#: How the layout key writes each (a key stays short: tp4-pp16-pslast-...).
SPLIT_KEYS = {"auto": "auto", "balanced": "bal", "balanced-ends": "ends", "light-last": "last"}
#: (embedding, loss) weights in layers of the balanced rules.
_WEIGHTS = {"balanced": (0, 0), "balanced-ends": (1, 1), "light-last": (0, 3)}


def _spread(layers: int, n: int, head: int, tail: int) -> tuple[int, ...] | None:
    """layers + head + tail units over n chunks, the first (units % n) one unit more, then the head's units
    taken from the first chunk and the tail's from the last; None when a middle chunk would be empty or an
    end negative."""
    if n == 1:
        return (layers,)
    u, r = divmod(layers + head + tail, n)
    sizes = [u + (c < r) for c in range(n)]
    sizes[0] -= head
    sizes[-1] -= tail
    if min(sizes) < 0 or (n > 2 and min(sizes[1:-1]) < 1):
        return None
    return tuple(sizes)


@lru_cache(maxsize=16384)
def chunk_sizes(num_layers: int, pp: int, vp: int, split: str) -> tuple[int, ...] | None:
    """The layers of each of the pp*vp chunks under `split`, or None when the rule cannot cut them."""
    n = pp * vp
    if split == "auto":
        if num_layers % n == 0:
            return (num_layers // n,) * n
        if pp > 1 and (num_layers + 2) % n == 0:
            size = (num_layers + 2) // n
            return tuple(size - (c == 0) - (c == n - 1) for c in range(n))
        return None
    if split not in _WEIGHTS:
        return None
    return _spread(num_layers, n, *_WEIGHTS[split])


@lru_cache(maxsize=16384)
def why_invalid_split(num_layers: int, pp: int, vp: int, split: str) -> str | None:
    """Why `split` cannot cut `num_layers` over pp x vp chunks, or names another split when it gives the
    same chunks (one name per layout); None when it is the layout's split."""
    n = pp * vp
    cut = f"pp={pp}" if vp == 1 else f"pp*vp = {pp}*{vp}"
    if split not in PIPELINE_SPLITS:
        return f"pipeline_split must be one of {', '.join(PIPELINE_SPLITS)} (got {split!r})"
    sizes = chunk_sizes(num_layers, pp, vp, split)
    if sizes is None:
        if split == "auto":
            return (f"layers ({num_layers}) are not divisible by {cut}, nor are layers + 2 (stages hold equal layers, "
                    "or Megatron-Core's split that counts the embedding and the loss as one layer each); "
                    "name an uneven split: --pipeline-split balanced, balanced-ends or light-last")
        return (f"pipeline_split {split} cannot cut {num_layers} layers into {n} chunks ({cut}): a middle chunk "
                "would be empty or an end would hold fewer than no layers; use fewer stages")
    for other in PIPELINE_SPLITS[:PIPELINE_SPLITS.index(split)]:
        if chunk_sizes(num_layers, pp, vp, other) == sizes:
            return (f"pipeline_split {split} cuts {num_layers} layers over {cut} as {other} does "
                    f"({describe(sizes)}); use --pipeline-split {other}")
    return None


def describe(sizes: tuple[int, ...]) -> str:
    """Chunk sizes as runs: 4,4,4,1 -> '4 x 3, 1'."""
    runs: list[list[int]] = []
    for s in sizes:
        if runs and runs[-1][0] == s:
            runs[-1][1] += 1
        else:
            runs.append([s, 1])
    return ", ".join(f"{s} x {k}" if k > 1 else str(s) for s, k in runs)


def layout_chunks(layout, num_layers: int) -> tuple[int, ...]:
    """The chunk sizes of a valid layout (its split must cut the layers)."""
    sizes = chunk_sizes(num_layers, layout.pp, layout.virtual_pipeline, layout.pipeline_split)
    if sizes is None:
        raise ValueError(f"pipeline_split {layout.pipeline_split} cannot cut {num_layers} layers over "
                         f"pp {layout.pp} x vp {layout.virtual_pipeline}")
    return sizes


def accounting_split(layout, num_layers: int) -> bool:
    """Whether the stages use Megatron-Core's embedding- and loss-aware split (split auto, pp*vp divides
    layers + 2 and not the layers: --account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split)."""
    return layout.pipeline_split == "auto" and num_layers % (layout.pp * layout.virtual_pipeline) != 0


def even_split(layout, num_layers: int) -> bool:
    """Whether every chunk holds the same layers (split auto and pp*vp dividing them)."""
    return layout.pipeline_split == "auto" and num_layers % (layout.pp * layout.virtual_pipeline) == 0


def stage_layers(layout, num_layers: int, stage: int) -> int:
    """Transformer layers on pipeline rank `stage`: the sum of its chunks (stage, stage + pp, ...)."""
    n = _stage_layers(num_layers, layout.pp, layout.virtual_pipeline, layout.pipeline_split, stage)
    if n is None:
        layout_chunks(layout, num_layers)      # raises, naming the split
    return n


@lru_cache(maxsize=16384)
def _stage_layers(num_layers: int, pp: int, vp: int, split: str, stage: int) -> int | None:
    sizes = chunk_sizes(num_layers, pp, vp, split)
    return None if sizes is None else sum(sizes[stage::pp])


def stage_layer_indices(layout, num_layers: int, stage: int) -> list[int]:
    """The transformer layers on pipeline rank `stage`, in order: those of its chunks stage, stage + pp, ..."""
    return list(_indices(num_layers, layout.pp, layout.virtual_pipeline, layout.pipeline_split, stage))


@lru_cache(maxsize=16384)
def _indices(num_layers: int, pp: int, vp: int, split: str, stage: int) -> tuple[int, ...]:
    sizes = chunk_sizes(num_layers, pp, vp, split)
    starts = [sum(sizes[:c]) for c in range(len(sizes))]
    return tuple(i for c in range(stage, len(sizes), pp) for i in range(starts[c], starts[c] + sizes[c]))


def stage_moe_layers(layout, model, stage: int) -> int:
    """How many of pipeline rank `stage`'s layers are MoE layers (model.moe_layer_pattern); 0 for a dense model."""
    if not model.is_moe:
        return 0
    return _moe_layers_on(model.num_layers, model.moe_first_dense_layers, model.moe_layer_freq, layout.pp,
                          layout.virtual_pipeline, layout.pipeline_split, stage)


@lru_cache(maxsize=16384)
def _moe_layers_on(num_layers: int, first_dense: int, freq: int, pp: int, vp: int, split: str, stage: int) -> int:
    return sum(i >= first_dense and (i - first_dense) % freq == 0 for i in _indices(num_layers, pp, vp, split, stage))


def bubble_share(layout, num_layers: int) -> float:
    """The share of the slowest stage's time a pipeline bubble step takes: 1 without interleaving; with it,
    the largest chunk over the most layers a rank holds (1/vp for equal chunks, Narayanan et al.'s
    (p - 1)/v): the interleaved schedule's warm-up and cool-down wait on whole chunks, so uneven chunks
    leave the bubble of the largest (DeepSeek-V3's 2-layer chunks, not its 61/32 average)."""
    if layout.virtual_pipeline == 1:
        return 1.0
    chunks = layout_chunks(layout, num_layers)
    return max(chunks) / max(sum(chunks[s::layout.pp]) for s in range(layout.pp))


def stage_candidates(layout, model) -> tuple[int, ...]:
    """The pipeline ranks whose memory or time can be the worst: the first (the embedding, the most
    micro-batches in flight), the last (the LM head, the loss, the logits), and of the ranks between, the
    first with each distinct (layers, MoE layers): a later rank with the same layers holds no more
    micro-batches in flight and runs as long."""
    moe = (model.moe_first_dense_layers, model.moe_layer_freq) if model.is_moe else None
    return _candidates(model.num_layers, moe, layout.pp, layout.virtual_pipeline, layout.pipeline_split)


@lru_cache(maxsize=16384)
def _candidates(num_layers: int, moe, pp: int, vp: int, split: str) -> tuple[int, ...]:
    def key(s: int) -> tuple[int, int]:
        return (sum(chunk_sizes(num_layers, pp, vp, split)[s::pp]),
                _moe_layers_on(num_layers, *moe, pp, vp, split, s) if moe else 0)
    seen, out = {key(0)}, [0]       # a middle rank like the first holds no more and runs no longer
    for s in range(1, pp - 1):
        if key(s) not in seen:
            seen.add(key(s))
            out.append(s)
    if pp > 1:
        out.append(pp - 1)
    return tuple(out)
