"""A GPT with Megatron-style tensor parallelism, as a plain module (pp = 1) or a PipelineModule.

Tensor parallelism (Shoeybi et al., Megatron-LM): the QKV and first MLP projections are
column-parallel (output features, hence attention heads, split over the TP ranks), the attention
output and second MLP projections are row-parallel (input features split, partial sums all-reduced).
Two conjugate autograd ops carry the communication: `f` (identity forward, all-reduce backward) at a
column-parallel input and `g` (all-reduce forward, identity backward) at a row-parallel output.
The embedding, position embedding, layer norms and LM head are replicated on every TP rank (their
gradients are identical there because they see the all-reduced activations); the LM head is
therefore not vocab-parallel, which costs V*h extra FLOPs per TP rank and is not counted.

Every weight is drawn from a generator seeded by (seed, parameter name) at its FULL shape and then
sliced for this TP rank, so TP = 1 and TP = 2 start from the same model and train to the same
losses. No dropout: runs are deterministic.
"""

from __future__ import annotations

import math
import zlib

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint as torch_checkpoint

from tuner.runners.harness import topology
from tuner.specs import ModelSpec

INIT_STD = 0.02


class _CopyToTP(torch.autograd.Function):
    """Megatron's `f`: identity forward, all-reduce of the input gradient over the TP group."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class _ReduceFromTP(torch.autograd.Function):
    """Megatron's `g`: all-reduce of partial sums forward, identity backward."""

    @staticmethod
    def forward(ctx, x, group):
        out = x.contiguous().clone()
        dist.all_reduce(out, group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def _seeded(shape, name: str, seed: int, device, std: float) -> torch.Tensor:
    """A normal(0, std) tensor of the full `shape`, the same for every layout of the same seed."""
    gen = torch.Generator(device=device)
    gen.manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))
    return torch.randn(shape, generator=gen, device=device) * std


def _device() -> torch.device:
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


class ColumnParallelLinear(nn.Module):
    """y = x A^T + b with A's rows (outputs) split over TP; `blocks` equal output blocks (e.g. Q, K, V)
    are each split, so every rank holds the same heads of Q, K and V."""

    def __init__(self, d_in: int, d_out: int, name: str, seed: int, blocks: int = 1):
        super().__init__()
        par = topology.current()
        self.group, self.tp = par.tp_group, par.tp
        full = _seeded((d_out, d_in), name, seed, _device(), INIT_STD).view(blocks, d_out // blocks, d_in)
        per = d_out // blocks // par.tp
        shard = full[:, par.tp_rank * per:(par.tp_rank + 1) * per, :].reshape(blocks * per, d_in)
        self.weight = nn.Parameter(shard.contiguous())
        self.bias = nn.Parameter(torch.zeros(blocks * per, device=_device()))
        for p in (self.weight, self.bias):
            p.tensor_model_parallel = True

    def forward(self, x):
        if self.tp > 1:
            x = _CopyToTP.apply(x, self.group)
        return F.linear(x, self.weight, self.bias)


class RowParallelLinear(nn.Module):
    """y = x A^T + b with A's columns (inputs) split over TP; partial outputs all-reduced, bias after."""

    def __init__(self, d_in: int, d_out: int, name: str, seed: int, std: float):
        super().__init__()
        par = topology.current()
        self.group, self.tp = par.tp_group, par.tp
        per = d_in // par.tp
        full = _seeded((d_out, d_in), name, seed, _device(), std)
        self.weight = nn.Parameter(full[:, par.tp_rank * per:(par.tp_rank + 1) * per].contiguous())
        self.weight.tensor_model_parallel = True
        self.bias = nn.Parameter(torch.zeros(d_out, device=_device()))   # replicated

    def forward(self, x):
        y = F.linear(x, self.weight)
        if self.tp > 1:
            y = _ReduceFromTP.apply(y, self.group)
        return y + self.bias


class Embedding(nn.Module):
    """Token + learned position embeddings (replicated). Input: token ids [b, s]."""

    def __init__(self, spec: ModelSpec, seed: int):
        super().__init__()
        dev = _device()
        self.word = nn.Parameter(_seeded((spec.vocab_size, spec.hidden_size), "embed.word", seed, dev, INIT_STD))
        self.pos = nn.Parameter(_seeded((spec.seq_length, spec.hidden_size), "embed.pos", seed, dev, INIT_STD))

    def forward(self, tokens):
        return F.embedding(tokens, self.word) + self.pos[: tokens.shape[1]]


class Block(nn.Module):
    """Pre-LN transformer layer; attention heads and MLP columns split over TP."""

    def __init__(self, spec: ModelSpec, index: int, seed: int, checkpoint: bool = False):
        super().__init__()
        par = topology.current()
        h, f = spec.hidden_size, spec.ffn_hidden_size
        out_std = INIT_STD / math.sqrt(2 * spec.num_layers)
        self.heads = spec.num_attention_heads // par.tp
        self.head_dim = h // spec.num_attention_heads
        self.checkpoint = checkpoint
        dev = _device()
        self.ln1 = nn.LayerNorm(h, device=dev)
        self.qkv = ColumnParallelLinear(h, 3 * h, f"layer{index}.qkv", seed, blocks=3)
        self.proj = RowParallelLinear(h, h, f"layer{index}.proj", seed, out_std)
        self.ln2 = nn.LayerNorm(h, device=dev)
        self.fc1 = ColumnParallelLinear(h, f, f"layer{index}.fc1", seed)
        self.fc2 = RowParallelLinear(f, h, f"layer{index}.fc2", seed, out_std)

    def _forward(self, x):
        b, s, _ = x.shape
        q, k, v = self.qkv(self.ln1(x)).chunk(3, dim=-1)
        q, k, v = (t.view(b, s, self.heads, self.head_dim).transpose(1, 2) for t in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, s, self.heads * self.head_dim))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))

    def forward(self, x):
        if self.checkpoint and torch.is_grad_enabled():
            return torch_checkpoint(self._forward, x, use_reentrant=False)
        return self._forward(x)


class Head(nn.Module):
    """Final layer norm and the (replicated, untied) LM head: logits [b, s, V]."""

    def __init__(self, spec: ModelSpec, seed: int):
        super().__init__()
        self.ln = nn.LayerNorm(spec.hidden_size, device=_device())
        self.weight = nn.Parameter(_seeded((spec.vocab_size, spec.hidden_size), "head", seed, _device(), INIT_STD))

    def forward(self, x):
        return F.linear(self.ln(x), self.weight)


def lm_loss(logits, labels):
    """Mean next-token cross entropy over all tokens of the micro-batch (fp32 accumulation)."""
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), labels.reshape(-1))


class GPT(nn.Module):
    """The whole model on one pipeline stage (pp = 1): forward(tokens, labels) -> loss."""

    def __init__(self, spec: ModelSpec, seed: int, checkpoint: bool):
        super().__init__()
        self.embed = Embedding(spec, seed)
        self.blocks = nn.ModuleList(Block(spec, i, seed, checkpoint) for i in range(spec.num_layers))
        self.head = Head(spec, seed)

    def forward(self, tokens, labels):
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return lm_loss(self.head(x), labels)


def _non_reentrant(function, *args):
    return torch_checkpoint(function, *args, use_reentrant=False)


def pipeline_gpt(spec: ModelSpec, seed: int, checkpoint: bool):
    """The model as a DeepSpeed PipelineModule: stages hold equal numbers of transformer layers
    (partition 'type:Block'); the embedding joins the first stage, the head the last."""
    from deepspeed.pipe import LayerSpec, PipelineModule

    par = topology.current()
    layers = [LayerSpec(Embedding, spec, seed)]
    layers += [LayerSpec(Block, spec, i, seed) for i in range(spec.num_layers)]
    layers.append(LayerSpec(Head, spec, seed))
    return PipelineModule(layers=layers, loss_fn=lm_loss, topology=par.topology,
                          partition_method="type:Block",
                          activation_checkpoint_interval=1 if checkpoint else 0,
                          activation_checkpoint_func=_non_reentrant,
                          checkpointable_layers=["Block"])


def build_model(spec: ModelSpec, seed: int, checkpoint: bool):
    """The module for this rank: a PipelineModule when pp > 1, else a plain GPT."""
    par = topology.current()
    for what, n in (("attention heads", spec.num_attention_heads), ("hidden size", spec.hidden_size),
                    ("ffn hidden size", spec.ffn_hidden_size)):
        if n % par.tp:
            raise ValueError(f"{what} ({n}) is not divisible by tp={par.tp}")
    module = pipeline_gpt(spec, seed, checkpoint) if par.pp > 1 else GPT(spec, seed, checkpoint)
    # DeepSpeed's global gradient norm (clipping) counts a parameter when it is marked model-parallel
    # or when the rank is 0 in its pipe x tensor group, which would drop every later pipeline stage's
    # replicated parameters. Mark what each rank must count: its TP shards, and the replicated
    # parameters on TP rank 0 only.
    for p in module.parameters():
        p.model_parallel = bool(getattr(p, "tensor_model_parallel", False)) or par.tp_rank == 0
    return module
