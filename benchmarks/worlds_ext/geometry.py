"""What a layout cuts: the GEMMs, tensors and parameters of one transformer layer on one GPU.

Written from the architectures themselves (Megatron's ColumnParallel / RowParallel linears, Llama's
SwiGLU, Mixtral's top-k experts), reading only the model's sizes from tuner.specs. Pure.

A GEMM is (M, N, K): M rows (tokens), N output columns, K the reduced width. A layer's forward GEMMs for
T tokens on one TP rank: QKV (T, (q + 2 kv)/tp, h), the output projection (T, h, q/tp), the FFN's
(T, f_in/tp, h) and (T, h, f/tp) with f_in = 2f for SwiGLU (gate and up fused) and f for GELU. An MoE
layer's experts run per expert: (tokens of that expert, f/etp, h) ...
"""

from __future__ import annotations

from dataclasses import dataclass

from tuner.layout import Layout
from tuner.pipeline_split import chunk_sizes
from tuner.specs import Workload


@dataclass(frozen=True)
class Cut:
    """One GPU's share of a layer: the sizes every component of a world reads."""

    tokens: int            # T: tokens of one micro-batch on this GPU's sequence shard (b * s / cp)
    seq: int               # s / cp: the sequence shard
    batch: int             # b: the micro-batch
    heads: int             # attention heads on this TP rank
    kv_heads: int          # key/value heads on this TP rank (at least 1: replicated when tp > g)
    head_dim: int
    hidden: int
    ffn: int               # f / tp (dense FFN width on this rank)
    ffn_in: int            # 2 f / tp (SwiGLU) or f / tp
    tp: int
    sp: bool
    cp: int


def cut(layout: Layout, w: Workload) -> Cut:
    m, tp, cp = w.model, layout.tp, layout.context_parallel
    s = m.seq_length // cp
    f_in = (2 if m.ffn_type == "swiglu" else 1) * m.ffn_hidden_size
    return Cut(tokens=layout.micro_batch * s, seq=s, batch=layout.micro_batch, heads=m.num_attention_heads // tp,
               kv_heads=max(1, m.num_query_groups // tp), head_dim=m.head_size, hidden=m.hidden_size,
               ffn=m.ffn_hidden_size // tp, ffn_in=f_in // tp, tp=tp, sp=bool(layout.sequence_parallel), cp=cp)


def dense_gemms(c: Cut) -> list[tuple[int, int, int]]:
    """Forward GEMMs of one dense layer on one TP rank."""
    q, kv = c.heads * c.head_dim, c.kv_heads * c.head_dim
    return [(c.tokens, q + 2 * kv, c.hidden), (c.tokens, c.hidden, q),
            (c.tokens, c.ffn_in, c.hidden), (c.tokens, c.hidden, c.ffn)]


def attention_gemms(c: Cut) -> list[tuple[int, int, int]]:
    q, kv = c.heads * c.head_dim, c.kv_heads * c.head_dim
    return [(c.tokens, q + 2 * kv, c.hidden), (c.tokens, c.hidden, q)]


def lm_head_gemm(layout: Layout, w: Workload) -> tuple[int, int, int]:
    c = cut(layout, w)
    return (c.tokens, w.model.vocab_size // layout.tp, c.hidden)


def layer_params(w: Workload) -> tuple[float, float]:
    """(parameters of one layer split over TP, of one layer kept whole on every TP rank): the dense part;
    an MoE layer's experts are counted by expert_params."""
    m = w.model
    h, q, kv = m.hidden_size, m.num_attention_heads * m.head_size, m.num_query_groups * m.head_size
    attn = h * (q + 2 * kv) + q * h
    ffn = 0 if m.is_moe else (3 if m.ffn_type == "swiglu" else 2) * h * m.ffn_hidden_size
    router = h * m.num_experts if m.is_moe else 0
    norms = (4 if m.normalization == "layernorm" else 2) * h
    bias = (q + 2 * kv + m.ffn_hidden_size + 2 * h) if m.add_bias_linear else 0
    return attn + ffn + bias, norms + router


def expert_params(w: Workload) -> float:
    """Parameters of one MoE layer's experts (all of them)."""
    m = w.model
    if not m.is_moe:
        return 0.0
    return m.num_experts * (3 if m.ffn_type == "swiglu" else 2) * m.hidden_size * m.moe_ffn_hidden_size


def embedding_params(w: Workload) -> float:
    m = w.model
    pos = m.seq_length * m.hidden_size if m.position_embedding == "learned" else 0
    return m.vocab_size * m.hidden_size + pos


def stage_chunks(layout: Layout, w: Workload) -> list[list[int]]:
    """Layers of each virtual chunk of each pipeline rank: chunks[r][k] is model chunk r + k * pp. The cut is
    the layout's own (its pipeline_split, tuner.pipeline_split: what the framework is told to run)."""
    pp, vp = layout.pp, layout.virtual_pipeline
    sizes = chunk_sizes(w.model.num_layers, pp, vp, getattr(layout, "pipeline_split", "auto"))
    if sizes is None:
        raise ValueError(f"{layout.key()}: its pipeline_split cannot cut {w.model.num_layers} layers")
    return [[sizes[r + k * pp] for k in range(vp)] for r in range(pp)]


def stage_layers(layout: Layout, w: Workload) -> list[int]:
    """Transformer layers per pipeline rank (all its virtual chunks)."""
    return [sum(row) for row in stage_chunks(layout, w)]


def micro_batches(layout: Layout, w: Workload) -> int:
    return w.global_batch // (layout.micro_batch * layout.dp)


def moe_tokens_per_expert(layout: Layout, w: Workload, load: list[float]) -> list[float]:
    """Tokens each of this GPU's local experts processes per micro-batch: the ep group's routed tokens
    (top_k per token) shared by expert per `load` (fractions summing to 1 over all experts)."""
    m = w.model
    c = cut(layout, w)
    tokens_rank = c.tokens / (layout.tp if layout.sequence_parallel else 1)
    group_tokens = tokens_rank * layout.expert_parallel * layout.expert_tensor_parallel * m.moe_top_k
    local = m.num_experts // layout.expert_parallel
    return [group_tokens * load[e] for e in range(local)]
