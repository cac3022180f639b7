"""Megatron-style tensor- and sequence-parallel building blocks of the harness's model.

Tensor parallelism (Shoeybi et al., Megatron-LM): column-parallel linears split their output features
over the TP ranks, row-parallel linears their input features. Without sequence parallelism two
conjugate ops carry the communication: `f` (_CopyToTP: identity forward, all-reduce backward) at a
column-parallel input and `g` (_ReduceFromTP: all-reduce forward, identity backward) at a
row-parallel output.

Sequence parallelism (Korthikanti et al., "Reducing Activation Recomputation in Large Transformer
Models"; Megatron's --sequence-parallel): between the linears (norms, residual adds, dropout) each TP
rank holds s/tp of the sequence. `f` becomes an all-gather along the sequence (backward: reduce-scatter)
and `g` a reduce-scatter (backward: all-gather). The embedding output is split along the sequence
(backward: all-gather) and the final norm's output gathered before the replicated LM head (backward:
this rank's slice, as every rank computes the same loss). The norm weights and the row-parallel
biases then see only this rank's tokens: their gradients are summed over TP, which
`sequence_parallel_param` does in the graph (identity forward, all-reduce backward) — Megatron's
all-reduce of `sequence_parallel` parameters' gradients.

Activations are [batch, sequence, hidden]; the sequence dimension is 1.

Every weight is drawn from a generator seeded by (seed, parameter name) at its FULL shape and then
sliced for this TP rank, so every layout starts from the same model and trains to the same losses.
"""

from __future__ import annotations

import zlib

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from tuner.runners.harness import topology

INIT_STD = 0.02
SEQ = 1                 # the sequence dimension of an activation [b, s, h]
NORM_EPS = 1e-5         # Megatron's --norm-epsilon default
ROPE_BASE = 10000.0     # Megatron's --rotary-base default


# ---- communication as autograd functions -------------------------------------------------------
def _all_reduce(x, group):
    out = x.contiguous().clone()
    dist.all_reduce(out, group=group)
    return out


def _all_gather(x, group, dim=SEQ):
    parts = [torch.empty_like(x.contiguous()) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, x.contiguous(), group=group)
    return torch.cat(parts, dim=dim)


def _split(x, group, dim=SEQ):
    n, r = dist.get_world_size(group), dist.get_rank(group)
    return x.chunk(n, dim=dim)[r].contiguous()


def _reduce_scatter(x, group, dim=SEQ):
    """Sum over the group, keep this rank's slice along `dim` (reduce_scatter_tensor needs dim 0)."""
    n = dist.get_world_size(group)
    x = x.movedim(dim, 0).contiguous()
    out = torch.empty((x.shape[0] // n, *x.shape[1:]), dtype=x.dtype, device=x.device)
    dist.reduce_scatter_tensor(out, x, group=group)
    return out.movedim(0, dim).contiguous()


def _identity(x, group):
    return x


def _collective(name: str, forward, backward, doc: str):
    """An autograd Function running `forward(x, group, *args)` over a group (the TP group, or the MoE
    layer's expert groups, whose collectives take split sizes as `args`) in the forward pass and
    `backward(grad, group, *args)` on the gradient (Megatron's mappings between parallel regions)."""
    def fwd(ctx, x, group, *args):
        ctx.group, ctx.args = group, args
        return forward(x, group, *args)

    def bwd(ctx, grad):
        return backward(grad.contiguous(), ctx.group, *ctx.args), None, *(None for _ in ctx.args)
    return type(name, (torch.autograd.Function,), {"__doc__": doc, "forward": staticmethod(fwd),
                                                    "backward": staticmethod(bwd)})


_CopyToTP = _collective("_CopyToTP", _identity, _all_reduce,
                        "Megatron's `f`: identity forward, all-reduce of the input gradient over the TP group.")
_ReduceFromTP = _collective("_ReduceFromTP", _all_reduce, _identity,
                            "Megatron's `g`: all-reduce of partial sums forward, identity backward.")
_GatherToTP = _collective("_GatherToTP", _all_gather, _reduce_scatter,
                          "SP's `f`: all-gather along the sequence forward, reduce-scatter of the gradient backward.")
_ReduceScatterFromTP = _collective("_ReduceScatterFromTP", _reduce_scatter, _all_gather,
                                   "SP's `g`: reduce-scatter of partial sums along the sequence forward, all-gather "
                                   "backward.")
_ScatterToSequence = _collective("_ScatterToSequence", _split, _all_gather,
                                 "Into the SP region from replicated values: this rank's slice forward, all-gather "
                                 "backward.")
_GatherFromSequence = _collective("_GatherFromSequence", _all_gather, _split,
                                  "Out of the SP region into replicated compute: all-gather forward, this rank's "
                                  "slice backward (every rank computes the same full gradient).")


def sequence_parallel() -> bool:
    """Whether this run splits the sequence over the TP ranks (SP with tp = 1 is a no-op)."""
    par = topology.current()
    return par.sequence_parallel and par.tp > 1


def scatter_to_sequence(x):
    return _ScatterToSequence.apply(x, topology.current().tp_group) if sequence_parallel() else x


def gather_from_sequence(x):
    return _GatherFromSequence.apply(x, topology.current().tp_group) if sequence_parallel() else x


def sequence_parallel_param(p):
    """A replicated parameter used on this rank's tokens only: its gradient is summed over TP."""
    return _CopyToTP.apply(p, topology.current().tp_group) if sequence_parallel() else p


# ---- parameters ----------------------------------------------------------------------------------
def seeded(shape, name: str, seed: int, std: float) -> torch.Tensor:
    """A normal(0, std) tensor of the full `shape`, the same for every layout of the same seed."""
    gen = torch.Generator(device=device())
    gen.manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))
    return torch.randn(shape, generator=gen, device=device()) * std


def column_shard(full: torch.Tensor, blocks: list[int], rank: int, n: int) -> torch.Tensor:
    """Rank `rank` of `n`'s rows of a column-parallel weight [sum(blocks), d_in]: the same slice of each
    output block (Q, K, V; gate and up), so every rank holds matching heads and columns."""
    shards, start = [], 0
    for width in blocks:
        per = width // n
        shards.append(full[start + rank * per:start + (rank + 1) * per])
        start += width
    return torch.cat(shards).contiguous()


def row_shard(full: torch.Tensor, rank: int, n: int) -> torch.Tensor:
    """Rank `rank` of `n`'s input columns of a row-parallel weight [d_out, d_in]."""
    per = full.shape[1] // n
    return full[:, rank * per:(rank + 1) * per].contiguous()


def ffn_activation(y, swiglu: bool):
    """The FFN's activation of fc1's output: SwiGLU silu(gate) * up (gate and up: y's two halves) or GeLU."""
    if swiglu:
        gate, up = y.chunk(2, dim=-1)
        return F.silu(gate) * up
    return F.gelu(y)


def device() -> torch.device:
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


class ColumnParallelLinear(nn.Module):
    """y = x A^T (+ b) with A's rows (outputs) split over TP. `blocks` lists the widths of the output
    blocks that are each split (Q, K, V; SwiGLU's gate and up), so every rank holds the same heads of
    Q, K and V and matching columns of gate and up. Input: replicated, or this rank's sequence slice
    under SP (all-gathered here)."""

    def __init__(self, d_in: int, blocks: list[int], name: str, seed: int, bias: bool = True):
        super().__init__()
        par = topology.current()
        self.group, self.tp = par.tp_group, par.tp
        full = seeded((sum(blocks), d_in), name, seed, INIT_STD)
        self.weight = nn.Parameter(column_shard(full, blocks, par.tp_rank, par.tp))
        self.weight.tensor_model_parallel = True
        self.bias = None
        if bias:
            self.bias = nn.Parameter(torch.zeros(self.weight.shape[0], device=device()))
            self.bias.tensor_model_parallel = True

    def forward(self, x):
        if sequence_parallel():
            x = _GatherToTP.apply(x, self.group)
        elif self.tp > 1:
            x = _CopyToTP.apply(x, self.group)
        return F.linear(x, self.weight, self.bias)


class RowParallelLinear(nn.Module):
    """y = x A^T (+ b) with A's columns (inputs) split over TP; partial outputs all-reduced (under SP
    reduce-scattered along the sequence), the replicated bias added after."""

    def __init__(self, d_in: int, d_out: int, name: str, seed: int, std: float, bias: bool = True):
        super().__init__()
        par = topology.current()
        self.group, self.tp = par.tp_group, par.tp
        full = seeded((d_out, d_in), name, seed, std)
        self.weight = nn.Parameter(row_shard(full, par.tp_rank, par.tp))
        self.weight.tensor_model_parallel = True
        self.bias = nn.Parameter(torch.zeros(d_out, device=device())) if bias else None   # replicated

    def forward(self, x):
        y = F.linear(x, self.weight)
        if sequence_parallel():
            y = _ReduceScatterFromTP.apply(y, self.group)
        elif self.tp > 1:
            y = _ReduceFromTP.apply(y, self.group)
        return y if self.bias is None else y + sequence_parallel_param(self.bias)


class Norm(nn.Module):
    """LayerNorm (weight and bias) or RMSNorm (weight only), replicated; under SP its gradients are
    summed over TP."""

    def __init__(self, hidden: int, kind: str):
        super().__init__()
        if kind not in ("layernorm", "rmsnorm"):
            raise ValueError(f"normalization {kind!r}: the harness builds layernorm and rmsnorm")
        self.kind = kind
        self.weight = nn.Parameter(torch.ones(hidden, device=device()))
        self.bias = nn.Parameter(torch.zeros(hidden, device=device())) if kind == "layernorm" else None

    def forward(self, x):
        w = sequence_parallel_param(self.weight)
        if self.kind == "rmsnorm":
            return F.rms_norm(x, (x.shape[-1],), w, eps=NORM_EPS)
        return F.layer_norm(x, (x.shape[-1],), w, sequence_parallel_param(self.bias), eps=NORM_EPS)


def rotary_tables(seq: int, head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin [seq, head_dim] of Megatron-Core's RotaryEmbedding (rotary_percent 1, base 10000,
    not interleaved: the two halves of a head are rotated together)."""
    inv_freq = 1.0 / ROPE_BASE ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=device()) / head_dim)
    freqs = torch.outer(torch.arange(seq, dtype=torch.float32, device=device()), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def apply_rotary(x, cos, sin):
    """x [b, heads, s, d] rotated by position: x cos + rotate_half(x) sin, computed in fp32 and returned
    in x's dtype (bf16 training keeps Q and K in bf16, like V)."""
    x1, x2 = x.float().chunk(2, dim=-1)
    return (x.float() * cos + torch.cat((-x2, x1), dim=-1) * sin).to(x.dtype)
