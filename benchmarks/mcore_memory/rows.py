"""A measured Megatron-Core result as a row of data/memory_measured_megatron-core*.toml, and the file written (pure:
no torch)."""

from __future__ import annotations

import tomllib
from pathlib import Path

from mcore_memory.configs import GiB, REPO, _rank_of

ARCH_KEYS = ("num_layers", "hidden_size", "num_attention_heads", "num_query_groups", "ffn_hidden_size",
             "vocab_size", "ffn_type", "position_embedding", "tie_embeddings", "normalization", "add_bias_linear",
             "num_experts", "moe_top_k", "moe_ffn_hidden_size")


def _presets():
    out = {}
    for f in sorted((REPO / "workloads" / "models").glob("*.toml")):
        d = tomllib.loads(f.read_text())
        d.setdefault("ffn_type", "gelu")
        d.setdefault("ffn_hidden_size", 4 * d["hidden_size"] if d["ffn_type"] == "gelu" else None)
        d.setdefault("num_query_groups", d["num_attention_heads"])
        d.setdefault("position_embedding", "learned")
        d.setdefault("tie_embeddings", True)
        d.setdefault("normalization", "layernorm")
        d.setdefault("add_bias_linear", True)
        d.setdefault("num_experts", 0)
        d.setdefault("moe_top_k", None)
        d.setdefault("moe_ffn_hidden_size", d["ffn_hidden_size"] if d["num_experts"] else None)
        d.setdefault("head_dim", None)
        d.setdefault("qk_layernorm", False)
        d.setdefault("multi_latent_attention", False)
        out[d["name"]] = d
    return out


def _model_name(c, presets):
    mine = dict(c, num_experts=c.get("num_experts", 0), moe_top_k=c.get("moe_router_topk"),
                moe_ffn_hidden_size=c.get("moe_ffn_hidden_size"))
    for name, p in presets.items():
        if p["head_dim"] not in (None, c["hidden_size"] // c["num_attention_heads"]) or p["qk_layernorm"] \
                or p["multi_latent_attention"] or p.get("num_shared_experts", 0) or p.get("moe_first_dense_layers", 0):
            continue
        if all(p[k] == mine[k] for k in ARCH_KEYS):
            return name
    return "custom"


def _toml_value(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return repr(round(v, 4))
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{k} = {_toml_value(x)}" for k, x in v.items()) + " }"
    return '"' + str(v).replace("\\", "\\\\").replace('"', '\\"') + '"'


def _attention_text(c):
    if c["attention"] == "local":
        return ("local: Megatron-Core DotProductAttention (unfused baddbmm + fp32 torch softmax + bmm), keeps the "
                "s x s scores")
    txt = ("flash-standin: FlashAttention-like core attention (saves q, k, v, out, fp32 lse), keeps no s x s "
           "scores")
    return txt + ("; cp > 1: ring-attention footprint" if c["cp"] > 1 else "")


def _row(c, r, version, presets):
    model = _model_name(c, presets)
    pk, fb, init = r["peak"], r["fb_peak"], r["after_init"]
    row = dict(framework="megatron-core",
               source=f"measured: megatron-core {version} GPTModel (local spec) under FakeTensorMode, torch 2.13.0 "
                      f"MemTracker, benchmarks/measure_memory_mcore.py",
               release=f"megatron-core {version}", model=model)
    for k in ("num_layers", "hidden_size", "num_attention_heads", "num_query_groups", "ffn_hidden_size",
              "vocab_size", "seq_length", "ffn_type"):
        row[k] = c[k]
    if c.get("num_experts"):
        row.update(num_experts=c["num_experts"], moe_router_topk=c["moe_router_topk"],
                   moe_ffn_hidden_size=c["moe_ffn_hidden_size"])
    if model == "custom":
        row.update(position_embedding=c["position_embedding"], tie_embeddings=c["tie_embeddings"],
                   normalization=c["normalization"], add_bias_linear=c["add_bias_linear"])
    gpus = c["tp"] * c["cp"] * c["pp"] * c["dp"]
    row.update(gpus=gpus, tp=c["tp"], pp=c["pp"], cp=c["cp"], vp=c.get("vp", 1), dp=c["dp"])
    if c.get("num_experts"):
        row.update(ep=c["ep"], etp=c["tp"])
    row.update(micro_batch=c["micro_batch"], global_batch=c["micro_batch"] * c["num_microbatches"] * c["dp"],
               sequence_parallel=c["sequence_parallel"], recompute=c["recompute"],
               distributed_optimizer=c["distributed_optimizer"], zero_stage=1 if c["distributed_optimizer"] else 0,
               precision="bf16", stage=c["stage"], attention=_attention_text(c),
               peak_allocated_gib=pk["total"] / GiB,
               breakdown_gib={k: pk[k] / GiB for k in ("parameters", "gradients", "optimizer", "activations", "temp",
                                                       "other")})
    where = "the optimizer step" if pk["total"] > fb["total"] else "forward/backward"
    note = (f"num_microbatches {c['num_microbatches']}; rank {_rank_of(c)} of {gpus} (tp/cp/dp rank 0, pipeline "
            f"stage {c['stage']}); {r['n_params']} parameters on this rank; schedule {r['schedule']} ran "
            f"{r['fwd']} forward and {r['bwd']} backward micro-batch steps, at most {r['max_in_flight']} in flight"
            + (f", {r['p2p_ops']} fake p2p ops" if c["pp"] > 1 else "") + f"; the peak is in {where}; "
            f"forward/backward peak {fb['total'] / GiB:.4f} GiB (activations {fb['activations'] / GiB:.4f}, temp "
            f"{fb['temp'] / GiB:.4f}); model states before the iteration {init['total'] / GiB:.4f} GiB (parameters "
            f"{init['parameters'] / GiB:.4f}, gradients {init['gradients'] / GiB:.4f}, optimizer "
            f"{init['optimizer'] / GiB:.4f}, other {init['other'] / GiB:.4f}); 'other' = tensors allocated at "
            f"construction or in the warm-up step that are not parameters, gradient buffers, fp32 main params or "
            f"Adam states; dropout {c['dropout']}")
    if c.get("num_experts"):
        note += (f"; MoE: ep {c['ep']}, alltoall dispatcher, SequentialMLP experts, capacity factor 1.0 with "
                 f"padding to capacity (drop-and-pad: static shapes under fake tensors), aux-loss router")
    if model == "custom":
        note += f"; shape of {c['shape']} with {c['num_layers']} layers"
    row["note"] = note
    return row


def write_toml(rows, path, version):
    head = [
        f"# MEASURED per-GPU peak memory of Megatron-Core {version}'s own GPT training step, one [[row]] per",
        "# configuration, written by benchmarks/measure_memory_mcore.py (see its docstring: GPTModel with the local",
        "# layer spec, Megatron-Core DDP with an fp32 gradient buffer, its optimizer (bf16 params, fp32 main params,",
        "# Adam, fused in-place), one steady-state iteration through get_forward_backward_func() and",
        "# optimizer.step(), under FakeTensorMode on a fake process group; MemTracker's peak of allocated bytes of",
        "# the one rank named by `stage` (tp/cp/dp rank 0)). GiB = 2^30 bytes. breakdown_gib is MemTracker's split",
        "# AT THE PEAK: parameters (bf16 weights / param buffer), gradients (the fp32 grad buffer), optimizer (fp32",
        "# main params + Adam moments), activations (allocated during the forward passes and not yet freed), temp",
        "# (allocated during backward: gradients of activations, per-param bf16 weight gradients before they are",
        "# added into the fp32 buffer), other (see note). No caching-allocator fragmentation, CUDA context or NCCL",
        "# buffers are included.",
        "",
    ]
    Path(path).write_text(toml_rows(head, rows))


def toml_rows(head: list[str], rows) -> str:
    """A data file's text: its comment lines, then one [[row]] table per row (measure_memory_mcore.py and
    measure_memory_mds.py write theirs with it)."""
    out = list(head)
    for r in rows:
        out.append("[[row]]")
        out += [f"{k} = {_toml_value(v)}" for k, v in r.items()]
        out.append("")
    return "\n".join(out)
