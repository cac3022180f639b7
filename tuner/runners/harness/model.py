"""The harness's decoder-only transformer (Megatron-Core's GPT model), as a plain module (pp = 1) or
a DeepSpeed PipelineModule, with tensor and sequence parallelism from layers.py.

Architecture, from the ModelSpec: multi-head or grouped-query attention (num_query_groups K/V heads;
each TP rank holds num_query_groups/tp whole K/V heads and the query heads that use them), a GeLU
(h -> f -> h) or SwiGLU (silu(gate) * up, gate and up column-parallel, down row-parallel) FFN, learned
position embeddings or RoPE on Q and K, LayerNorm or RMSNorm (pre-norm), linear biases or none, and an
LM head tied to the word embedding or its own V x h matrix. The embedding, norms and LM head are
replicated on every TP rank; the head is therefore not vocab-parallel (V*h extra FLOPs per TP rank,
not counted). With pp > 1 a tied LM head is DeepSpeed's TiedLayerSpec: the word embedding lives on
the first and the last stage, its gradients summed between them.

Mixture of experts (num_experts > 0): the layers of spec.moe_layer_pattern replace the FFN with
moe.MoELayer (router, E experts of width moe_ffn_hidden_size held E/ep per rank, shared experts),
split over the expert grid of topology.py (ep, etp); the other layers keep the dense FFN.

Recompute (Megatron's --recompute-granularity): "none" keeps every activation, "selective" re-runs the
attention core (softmax(QK^T)V) in the backward pass, "full" re-runs every transformer layer from its
input (torch.utils.checkpoint, non-reentrant; DeepSpeed's activation_checkpoint_interval = 1 under PP).

No dropout: runs are deterministic, and every layout of a seed trains to the same losses.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint as torch_checkpoint

from tuner.runners.harness import topology
from tuner.runners.harness.moe import MoELayer
from tuner.runners.harness.layers import (INIT_STD, ColumnParallelLinear, Norm, RowParallelLinear,
                                          apply_rotary, ffn_activation, gather_from_sequence, rotary_tables,
                                          scatter_to_sequence, seeded)
from tuner.specs import ModelSpec

RECOMPUTE = ("none", "selective", "full")


def recompute_mode(layout_or_value) -> str:
    """The recompute mode of a layout (or a mode / the old activation_checkpointing bool), read so
    that layouts from before and after `recompute` replaced `activation_checkpointing` both work."""
    value = layout_or_value
    if not isinstance(value, (str, bool, int)) and value is not None:
        value = getattr(value, "recompute", None)
        if value is None:
            value = bool(getattr(layout_or_value, "activation_checkpointing", False))
    if isinstance(value, str):
        if value not in RECOMPUTE:
            raise ValueError(f"recompute {value!r}: one of {', '.join(RECOMPUTE)}")
        return value
    return "full" if value else "none"


def sequence_parallel_of(layout) -> bool:
    return bool(getattr(layout, "sequence_parallel", False))


def _non_reentrant(function, *args):
    return torch_checkpoint(function, *args, use_reentrant=False)


class Embedding(nn.Module):
    """Word embedding (+ the learned position table); under SP the output is this rank's sequence
    slice. Input: token ids [b, s]. `head` computes the tied LM head's logits from the same weight
(the last pipeline stage's copy is built without the position table, which it would not use)."""

    def __init__(self, spec: ModelSpec, seed: int, positions: bool = True):
        super().__init__()
        self.word = nn.Parameter(seeded((spec.vocab_size, spec.hidden_size), "embed.word", seed, INIT_STD))
        self.pos = None
        if positions and spec.position_embedding == "learned":
            self.pos = nn.Parameter(seeded((spec.seq_length, spec.hidden_size), "embed.pos", seed, INIT_STD))

    def forward(self, tokens):
        x = F.embedding(tokens, self.word)
        if self.pos is not None:
            x = x + self.pos[: tokens.shape[1]]
        return scatter_to_sequence(x)

    def head(self, x):
        return F.linear(gather_from_sequence(x), self.word)


def tied_head(module: Embedding, x):
    """TiedLayerSpec's forward_fn on the last stage: the LM head with the embedding's weight."""
    return module.head(x)


class Block(nn.Module):
    """Pre-norm transformer layer; attention heads (and their K/V groups) and FFN columns split over TP."""

    def __init__(self, spec: ModelSpec, index: int, seed: int, recompute: str = "none"):
        super().__init__()
        par = topology.current()
        h, f, a, g = spec.hidden_size, spec.ffn_hidden_size, spec.num_attention_heads, spec.num_query_groups
        out_std = INIT_STD / math.sqrt(2 * spec.num_layers)
        bias = spec.add_bias_linear
        self.heads, self.groups, self.head_dim = a // par.tp, g // par.tp, h // a
        self.recompute, self.rope, self.swiglu = recompute, spec.position_embedding == "rope", spec.ffn_type == "swiglu"
        kv = g * self.head_dim
        self.runs = {"layer": 0, "attention_core": 0, "tokens": 0}   # forward passes, recomputes included
        self.norm1 = Norm(h, spec.normalization)
        self.qkv = ColumnParallelLinear(h, [h, kv, kv], f"layer{index}.qkv", seed, bias)
        self.proj = RowParallelLinear(h, h, f"layer{index}.proj", seed, out_std, bias)
        self.norm2 = Norm(h, spec.normalization)
        self.moe = None
        if spec.num_experts and spec.moe_layer_pattern[index]:
            self.moe = MoELayer(spec, index, seed, out_std)
        else:
            self.fc1 = ColumnParallelLinear(h, [f, f] if self.swiglu else [f], f"layer{index}.fc1", seed, bias)
            self.fc2 = RowParallelLinear(f, h, f"layer{index}.fc2", seed, out_std, bias)

    def core_attention(self, q, k, v):
        """softmax(QK^T / sqrt(d)) V, causal; query head j uses K/V group j // (heads / groups)."""
        self.runs["attention_core"] += 1
        if self.groups != self.heads:
            rep = self.heads // self.groups
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    def attention(self, x):
        qkv = self.qkv(self.norm1(x))                     # [b, s, (heads + 2 groups) d], full sequence
        b, s, _ = qkv.shape
        d = self.head_dim
        q, k, v = qkv.split([self.heads * d, self.groups * d, self.groups * d], dim=-1)
        q = q.view(b, s, self.heads, d).transpose(1, 2)
        k, v = (t.view(b, s, self.groups, d).transpose(1, 2) for t in (k, v))
        if self.rope:
            cos, sin = rotary_tables(s, d)
            q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        if self.recompute == "selective" and torch.is_grad_enabled():
            a = _non_reentrant(self.core_attention, q, k, v)
        else:
            a = self.core_attention(q, k, v)
        return self.proj(a.transpose(1, 2).reshape(b, s, self.heads * d))

    def mlp(self, x):
        if self.moe is not None:
            return self.moe(self.norm2(x))
        return self.fc2(ffn_activation(self.fc1(self.norm2(x)), self.swiglu))

    def _forward(self, x):
        self.runs["layer"] += 1
        self.runs["tokens"] = x.shape[1]            # sequence positions this rank holds between layers
        x = x + self.attention(x)
        return x + self.mlp(x)

    def forward(self, x):
        if self.recompute == "full" and torch.is_grad_enabled():
            return _non_reentrant(self._forward, x)
        return self._forward(x)


class FinalNorm(nn.Module):
    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.norm = Norm(spec.hidden_size, spec.normalization)

    def forward(self, x):
        return self.norm(x)


class Head(nn.Module):
    """The untied (replicated) LM head: logits [b, s, V] from the final norm's output."""

    def __init__(self, spec: ModelSpec, seed: int):
        super().__init__()
        self.weight = nn.Parameter(seeded((spec.vocab_size, spec.hidden_size), "head", seed, INIT_STD))

    def forward(self, x):
        return F.linear(gather_from_sequence(x), self.weight)


def lm_loss(logits, labels):
    """Mean next-token cross entropy over all tokens of the micro-batch (fp32 accumulation)."""
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), labels.reshape(-1))


class GPT(nn.Module):
    """The whole model on one pipeline stage (pp = 1): forward(tokens, labels) -> loss."""

    def __init__(self, spec: ModelSpec, seed: int, recompute: str):
        super().__init__()
        self.embed = Embedding(spec, seed)
        self.blocks = nn.ModuleList(Block(spec, i, seed, recompute) for i in range(spec.num_layers))
        self.final_norm = FinalNorm(spec)
        self.head = None if spec.tie_embeddings else Head(spec, seed)

    def forward(self, tokens, labels):
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        x = self.final_norm(x)
        return lm_loss(self.embed.head(x) if self.head is None else self.head(x), labels)


def pipeline_gpt(spec: ModelSpec, seed: int, recompute: str):
    """The model as a DeepSpeed PipelineModule: stages hold equal numbers of transformer layers
    (partition 'type:Block'); the embedding joins the first stage, the final norm and head the last."""
    from deepspeed.pipe import LayerSpec, PipelineModule, TiedLayerSpec

    par = topology.current()
    if spec.tie_embeddings:
        first = TiedLayerSpec("embed", Embedding, spec, seed, tied_weight_attr="word")
        last = TiedLayerSpec("embed", Embedding, spec, seed, False, forward_fn=tied_head, tied_weight_attr="word")
    else:
        first, last = LayerSpec(Embedding, spec, seed), LayerSpec(Head, spec, seed)
    inner = "none" if recompute == "full" else recompute     # full: DeepSpeed checkpoints each Block
    layers = [first, *(LayerSpec(Block, spec, i, seed, inner) for i in range(spec.num_layers)),
              LayerSpec(FinalNorm, spec), last]
    return PipelineModule(layers=layers, loss_fn=lm_loss, topology=par.topology,
                          partition_method="type:Block",
                          activation_checkpoint_interval=1 if recompute == "full" else 0,
                          activation_checkpoint_func=_non_reentrant,
                          checkpointable_layers=["Block"])


def activity(module) -> dict:
    """What this rank's layers really did: forward runs of the layers and of the attention core
    (recomputes included), the sequence positions of the residual stream, and the parameters held;
    with MoE layers also the experts held per layer, the (token, expert) rows its experts ran, the rows
    it sent to experts on other ranks, and the last micro-batch's load-balancing loss summed over layers."""
    blocks = [m for m in module.modules() if isinstance(m, Block)]
    out = {"layers": len(blocks), "layer_runs": sum(b.runs["layer"] for b in blocks),
           "attention_core_runs": sum(b.runs["attention_core"] for b in blocks),
           "residual_tokens": max((b.runs["tokens"] for b in blocks), default=0),
           "parameters": sum(p.numel() for p in module.parameters())}
    moe = [b.moe for b in blocks if b.moe is not None]
    if moe:
        out.update(moe_layers=len(moe), local_experts=moe[0].num_local_experts,
                   expert_rows=sum(m.runs["expert_rows"] for m in moe),
                   rows_sent_to_other_ranks=sum(m.runs["sent_to_other_ranks"] for m in moe),
                   aux_loss=sum(float(m.runs["aux_loss"]) for m in moe))
    return out


def check_buildable(spec: ModelSpec, tp: int) -> None:
    """Raise ValueError when the model cannot be split over `tp` ranks as the harness splits it."""
    for what, n in (("attention heads", spec.num_attention_heads), ("key/value heads", spec.num_query_groups),
                    ("hidden size", spec.hidden_size), ("ffn hidden size", spec.ffn_hidden_size)):
        if n % tp:
            raise ValueError(f"{what} ({n}) is not divisible by tp={tp}")
    if spec.num_attention_heads % spec.num_query_groups:
        raise ValueError(f"attention heads ({spec.num_attention_heads}) are not a multiple of the key/value "
                         f"heads ({spec.num_query_groups})")
    if spec.position_embedding == "rope" and (spec.hidden_size // spec.num_attention_heads) % 2:
        raise ValueError("RoPE needs an even head size")
    if spec.num_experts:
        par = topology.current()
        shared = spec.num_shared_experts * spec.moe_ffn_hidden_size
        for what, n, name, by in (("experts", spec.num_experts, "ep", par.ep),
                                  ("moe_ffn_hidden_size", spec.moe_ffn_hidden_size, "etp", par.etp),
                                  ("shared experts' width", shared, "tp", tp),
                                  ("sequence length (MoE layers split it over TP)", spec.seq_length, "tp", tp)):
            if n % by:
                raise ValueError(f"{what} ({n}) is not divisible by {name}={by}")


def build_model(spec: ModelSpec, seed: int, recompute="none"):
    """The module for this rank: a PipelineModule when pp > 1, else a plain GPT. `recompute` is a mode
    (none, selective, full) or the old activation-checkpointing bool (True = full)."""
    par = topology.current()
    mode = recompute_mode(recompute)
    check_buildable(spec, par.tp)
    if par.sequence_parallel and par.tp > 1 and spec.seq_length % par.tp:
        raise ValueError(f"sequence length ({spec.seq_length}) is not divisible by tp={par.tp} "
                         "(sequence parallelism splits it)")
    module = pipeline_gpt(spec, seed, mode) if par.pp > 1 else GPT(spec, seed, mode)
    # DeepSpeed's global gradient norm (clipping) counts a parameter when it is marked model-parallel
    # or when the rank is 0 in its pipe x tensor group, which would drop every later pipeline stage's
    # replicated parameters. Mark what each rank must count: its TP shards, and the replicated
    # parameters on TP rank 0 only; a tied embedding once, on its first stage (DeepSpeed marks the
    # last stage's copy ds_pipe_replicated, which clip_grad_norm_ would count again).
    # Expert weights count on every rank (DeepSpeed then averages the ranks' norms over DP: with ep > 1
    # its norm of an MoE model is not the global norm, see docs/moe.md).
    for p in module.parameters():
        counted = bool(getattr(p, "tensor_model_parallel", False)) or par.tp_rank == 0 or not getattr(
            p, "allreduce", True)
        p.model_parallel = counted and not getattr(p, "ds_pipe_replicated", False)
    return module
