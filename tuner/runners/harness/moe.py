"""The harness's mixture-of-experts FFN: Megatron-Core's MoELayer (TopKRouter, the alltoall token
dispatcher, experts, shared experts) with expert parallelism (ep) and expert tensor parallelism (etp).

Tokens. Inside the layer every rank of a pipeline stage owns distinct tokens: its data-parallel
replica's micro-batch, and of it the TP rank's sequence slice when tp > 1 (the slice sequence
parallelism already holds; without SP the layer takes it on entry and all-gathers the output on exit,
as Megatron-Core, which requires SP with MoE and TP, always has it).

Routing (TopKRouter, dropless): logits = x W_r^T (fp32, W_r [E, h] replicated); softmax scores: the
top-k logits softmaxed (Megatron-Core's default, moe_router_pre_softmax off); sigmoid scores: the top-k
sigmoids normalised to sum 1; times moe_router_topk_scaling_factor. The load-balancing loss is
Megatron-Core's "aux_loss" (Switch Transformer): coeff * E/(k T^2) * sum_e (sum_t p_te) * n_e, with
p the full softmax, n_e the tokens routed to expert e and T the tokens of the whole sequence (counts
summed over the TP slices), per micro-batch. It is attached to the routing probabilities as
MoEAuxLossAutoScaler does: the forward value is untouched (the reported loss is the LM loss), its
gradient is added with the scale the harness sets (1 / gradient-accumulation steps, as DeepSpeed
scales the LM loss). Every layout routes the same tokens the same way, so the aux loss is the same.

Dispatch (Megatron-Core's moe_token_dispatcher_type "alltoall"; torch.distributed.all_to_all_single
with uneven splits, which gloo runs on CPU as NCCL does on GPUs): each rank sorts its (token, choice)
pairs by expert, exchanges the per-expert counts, an all-to-all over the EP group sends each expert's
tokens to the rank holding it (experts [ep_rank * E/ep, (ep_rank + 1) * E/ep)), with etp > 1 an all-gather over the ETP
group gives each expert shard every token of its expert, the experts run (SwiGLU or GeLU, fc1 split by
columns and fc2 by rows over etp), a reduce-scatter over ETP sums the shards' partial outputs, the
reverse all-to-all brings them home, and each token sums its k outputs weighted by its probabilities.
Shared experts (one FFN of width num_shared_experts * moe_ffn_hidden_size, split over TP like the
dense FFN) see every token and are added.

Gradients. Expert weights exist once per expert-dp group: they carry DeepSpeed's MoE marks
(allreduce = False, group_name), so the engine (and ZeRO-1/2) reduces them over the expert-dp group
and divides by the full DP size (Megatron-Core's expert_gradient_scaling_factor); the layer is a
deepspeed.moe.layer.MoE, which is how DeepSpeed's engine finds MoE models (has_moe_layers). Every
expert is drawn from (seed, layer, expert) at full shape and sliced, so every layout starts alike.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from deepspeed.moe.layer import MoE as DeepSpeedMoE
from torch import nn

from tuner.runners.harness import topology
from tuner.runners.harness.layers import (INIT_STD, ColumnParallelLinear, RowParallelLinear, _all_gather,
                                          _collective, _CopyToTP, _GatherFromSequence, _reduce_scatter,
                                          _ScatterToSequence, column_shard, ffn_activation, row_shard, seeded,
                                          sequence_parallel)

AUX_LOSS_COEFF = 1e-2   # TUNER_MOE_AUX_LOSS_COEFF: Megatron-Core's --moe-aux-loss-coeff of NVIDIA's MoE recipes


def aux_loss_coeff() -> float:
    return float(os.environ.get("TUNER_MOE_AUX_LOSS_COEFF", AUX_LOSS_COEFF))


# ---- autograd-aware collectives of the dispatcher --------------------------------------------------
def _all_to_all(x, group, send: list[int], recv: list[int]):
    """Rows of x [n, h] sent in chunks of `send[i]` rows to rank i of the group; `recv[i]` rows come back
    from rank i."""
    out = x.new_empty((sum(recv), x.shape[1]))
    dist.all_to_all_single(out, x.contiguous(), recv, send, group=group)
    return out


def _gather_rows(x, group, sizes: list[int]):
    """All ranks' rows [sum(sizes), h], rank i's `sizes[i]` of them (padded to the largest: gloo gathers
    equal shapes)."""
    pad = max(sizes)
    parts = _all_gather(F.pad(x, (0, 0, 0, pad - x.shape[0])), group, 0).split(pad)
    return torch.cat([p[:n] for p, n in zip(parts, sizes)])


def _reduce_scatter_rows(x, group, sizes: list[int]):
    """Sum x [sum(sizes), h] over the group and keep this rank's `sizes[rank]` rows."""
    pad = max(sizes)
    padded = torch.cat([F.pad(p, (0, 0, 0, pad - p.shape[0])) for p in x.split(sizes)])
    return _reduce_scatter(padded, group, 0)[:sizes[dist.get_rank(group)]]


_AllToAll = _collective("_AllToAll", _all_to_all, lambda g, group, send, recv: _all_to_all(g, group, recv, send),
                        "The token all-to-all over the EP group; the gradient goes back the same way.")
_GatherRows = _collective("_GatherRows", _gather_rows, _reduce_scatter_rows,
                          "Expert TP's entry: every shard gets every token of its experts; the backward sums "
                          "the shards' input gradients and keeps this rank's rows.")
_ReduceScatterRows = _collective("_ReduceScatterRows", _reduce_scatter_rows, _gather_rows,
                                 "Expert TP's exit: the shards' partial outputs summed, this rank's rows kept; "
                                 "the backward gathers.")


class AuxLossAutoScaler(torch.autograd.Function):
    """Megatron-Core's MoEAuxLossAutoScaler: returns `probs` unchanged and gives `aux` the gradient
    `scale` in the backward pass (set per step: 1 / gradient-accumulation steps)."""

    scale = 1.0

    @staticmethod
    def forward(ctx, probs, aux):
        ctx.save_for_backward(aux)
        return probs

    @staticmethod
    def backward(ctx, grad):
        (aux,) = ctx.saved_tensors
        return grad, torch.full_like(aux, AuxLossAutoScaler.scale)


# ---- routing and dispatch math (pure tensor functions; tests run them without process groups) ---------
def route(logits, top_k: int, score: str = "softmax", scale: float | None = None):
    """(probs [T, k], experts [T, k], scores for the aux loss [T, E]) of fp32 router logits [T, E]."""
    if score == "sigmoid":
        scores = torch.sigmoid(logits)
        top, experts = scores.topk(top_k, dim=-1)
        probs = top / (top.sum(-1, keepdim=True) + 1e-20) if top_k > 1 else top
        full = scores / (scores.sum(-1, keepdim=True) + 1e-20)
    else:
        top, experts = logits.topk(top_k, dim=-1)
        probs, full = top.softmax(-1), logits.softmax(-1)
    return (probs * scale if scale else probs), experts, full


def load_balancing_loss(scores, counts, total_tokens: int, top_k: int, coeff: float):
    """Megatron-Core's switch_load_balancing_loss_func: coeff * E/(k T^2) * sum_e (sum_t scores_te) n_e,
    over this rank's tokens' scores and the counts n_e of the whole sequence."""
    num_experts = scores.shape[-1]
    return (scores.sum(0) * counts).sum() * (num_experts * coeff / (top_k * total_tokens * total_tokens))


def regroup(counts: torch.Tensor) -> tuple[torch.Tensor, list[int]]:
    """Rows arrive in chunks ordered by counts' index (source..., local expert) with counts[..., e] rows
    each; return the row permutation that orders them by local expert (then source, keeping each
    chunk's order), and the rows per local expert."""
    flat = counts.reshape(-1, counts.shape[-1]).cpu()      # a few dozen numbers: index on the host
    starts = torch.cumsum(flat.flatten(), 0) - flat.flatten()
    starts = starts.view_as(flat)
    index = [torch.arange(int(starts[s, e]), int(starts[s, e] + flat[s, e]))
             for e in range(flat.shape[1]) for s in range(flat.shape[0])]
    perm = torch.cat(index) if index else torch.zeros(0, dtype=torch.long)
    return perm.to(counts.device), flat.sum(0).tolist()


# ---- the layer -------------------------------------------------------------------------------------------
class Experts(nn.Module):
    """This rank's E/ep experts, each's fc1 [gate; up] split by columns and fc2 by rows over etp."""

    def __init__(self, spec, index: int, seed: int, out_std: float):
        super().__init__()
        par = topology.current()
        per = spec.num_experts // par.ep
        f, h, self.swiglu = spec.moe_ffn_hidden_size, spec.hidden_size, spec.ffn_type == "swiglu"
        blocks = [f, f] if self.swiglu else [f]
        mine = range(par.ep_rank * per, (par.ep_rank + 1) * per)
        fc1 = [column_shard(seeded((sum(blocks), h), f"layer{index}.expert{e}.fc1", seed, INIT_STD), blocks,
                            par.etp_rank, par.etp) for e in mine]
        fc2 = [row_shard(seeded((h, f), f"layer{index}.expert{e}.fc2", seed, out_std), par.etp_rank, par.etp)
               for e in mine]
        self.fc1, self.fc2 = nn.Parameter(torch.stack(fc1)), nn.Parameter(torch.stack(fc2))
        for p in (self.fc1, self.fc2):
            p.allreduce, p.group_name = False, par.expert_group_name      # DeepSpeed's expert-param marks
            p.tensor_model_parallel = par.etp > 1

    def forward(self, x, counts: list[int]):
        outs = []
        for e, rows in enumerate(x.split(counts)):
            outs.append(F.linear(ffn_activation(F.linear(rows, self.fc1[e]), self.swiglu), self.fc2[e]))
        return torch.cat(outs)


class MoELayer(DeepSpeedMoE):
    """The MoE FFN of one transformer layer: input and output [b, s_local, h] like the dense FFN's."""

    def __init__(self, spec, index: int, seed: int, out_std: float, coeff: float | None = None):
        nn.Module.__init__(self)   # DeepSpeed's own gate and experts are not built: these are Megatron-Core's
        par = topology.current()
        self.num_experts, self.ep_size, self.num_local_experts = spec.num_experts, par.ep, spec.num_experts // par.ep
        self.expert_group_name = par.expert_group_name
        self.top_k, self.score, self.scale = spec.moe_top_k, spec.moe_router_score_function, \
            spec.moe_router_topk_scaling_factor
        self.coeff = aux_loss_coeff() if coeff is None else coeff
        self.router = nn.Parameter(seeded((spec.num_experts, spec.hidden_size), f"layer{index}.router", seed,
                                          INIT_STD))
        self.experts = Experts(spec, index, seed, out_std)
        self.shared = None
        self.swiglu = spec.ffn_type == "swiglu"
        if spec.num_shared_experts:
            width = spec.num_shared_experts * spec.moe_ffn_hidden_size
            self.shared = nn.ModuleDict({
                "fc1": ColumnParallelLinear(spec.hidden_size, [width, width] if self.swiglu else [width],
                                            f"layer{index}.shared.fc1", seed, bias=False),
                "fc2": RowParallelLinear(width, spec.hidden_size, f"layer{index}.shared.fc2", seed, out_std,
                                         bias=False)})
        self.runs = {"expert_rows": 0, "sent_to_other_ranks": 0, "aux_loss": 0.0}

    def set_deepspeed_parallelism(self, *args, **kwargs):
        """DeepSpeed calls this to create its expert groups: topology.build registered them already."""

    def forward(self, x):
        par = topology.current()
        split = par.tp > 1 and not sequence_parallel()     # take this TP rank's sequence slice
        tokens = _ScatterToSequence.apply(x, par.tp_group) if split else x
        b, s, h = tokens.shape
        routed = self.routed(tokens.reshape(b * s, h), par).view(b, s, h)
        out = _GatherFromSequence.apply(routed, par.tp_group) if split else routed
        if self.shared is not None:
            out = out + self.shared["fc2"](ffn_activation(self.shared["fc1"](x), self.swiglu))
        return out

    def router_probs(self, tokens, par):
        """probs [T, k] (with the aux loss's gradient attached) and experts [T, k] of this rank's tokens."""
        weight = self.router
        if par.tp > 1:    # the router sees this TP rank's tokens only: its gradient is summed over TP
            weight = _CopyToTP.apply(weight, par.tp_group)
        logits = F.linear(tokens.float(), weight.float())
        probs, experts, scores = route(logits, self.top_k, self.score, self.scale)
        if self.coeff > 0 and torch.is_grad_enabled():
            counts = torch.bincount(experts.flatten(), minlength=self.num_experts).to(scores.dtype)
            if par.tp > 1:
                dist.all_reduce(counts, group=par.tp_group)
            aux = load_balancing_loss(scores, counts, tokens.shape[0] * par.tp, self.top_k, self.coeff)
            self.runs["aux_loss"] = aux.detach()
            probs = AuxLossAutoScaler.apply(probs, aux)
        return probs, experts

    def routed(self, tokens, par):
        """Route, dispatch, run the experts, combine: [T, h] -> [T, h]."""
        probs, experts = self.router_probs(tokens, par)
        k, per = self.top_k, self.num_local_experts
        flat = experts.flatten()
        order = torch.argsort(flat, stable=True)
        rows = tokens.index_select(0, order // k)                   # (token, choice) pairs by expert
        counts = torch.bincount(flat, minlength=self.num_experts).view(par.ep, per)   # [destination, expert]
        send, recv = counts, counts
        if par.ep > 1:
            recv = torch.empty_like(counts)
            dist.all_to_all_single(recv, counts, group=par.ep_group)             # [source, local expert]
            rows = _AllToAll.apply(rows, par.ep_group, counts.sum(1).tolist(), recv.sum(1).tolist())
        sources = recv[None]
        if par.etp > 1:
            sources = _all_gather(recv[None], par.etp_group, dim=0)              # [etp peer, source, expert]
            peer_rows = sources.sum((1, 2)).tolist()
            rows = _GatherRows.apply(rows, par.etp_group, peer_rows)
        perm, per_expert = regroup(sources)
        out = self.experts(rows.index_select(0, perm), per_expert).index_select(0, torch.argsort(perm))
        if par.etp > 1:
            out = _ReduceScatterRows.apply(out, par.etp_group, peer_rows)
        if par.ep > 1:
            out = _AllToAll.apply(out, par.ep_group, recv.sum(1).tolist(), send.sum(1).tolist())
        out = out.index_select(0, torch.argsort(order)).view(-1, k, tokens.shape[1])
        self.runs["expert_rows"] += sum(per_expert)
        self.runs["sent_to_other_ranks"] += int(send.sum() - send[par.ep_rank].sum())
        return (out * probs.unsqueeze(-1).to(out.dtype)).sum(1)
