"""A measured configuration as a row of benchmarks/data/memory_measured_torchtitan*.toml (to_row: the keys
benchmarks/published.py reads, the tracker's categories grouped, a note saying how it was measured) and the
file's writer (write_toml: header and [[row]] tables). Pure: no torch, no torchtitan."""

from __future__ import annotations

import json
from pathlib import Path

from torchtitan_memory.configs import GIB, PRESETS

ATTENTION_KERNEL = ("flex_attention (torchtitan 0.3.0's FlexAttention, block-causal BlockMask; its fake kernel "
                    "under FakeTensorMode, the fused kernel on a GPU)")


def _attention(steady: dict) -> str:
    if steady["s2_bytes"]:
        return (f"{ATTENTION_KERNEL}; keeps s^2 scores: largest s x s tensor "
                f"{steady['s2_bytes'] / GIB:.4f} GiB {steady['s2_shape']}")
    return f"{ATTENTION_KERNEL}; keeps no s^2 scores (no (..., s, s) tensor was allocated)"


def _note(r: dict, first: dict | None) -> str:
    """How the row was measured: the step, the tracker's categories at its peak, the held state, the set-up."""
    c, steady = r["config"], r["steps"][-1]
    preset = PRESETS[c["model"]]
    p = steady["peak"]
    cats = ", ".join(f"{k} {v:.4f}" for k, v in p.items() if k != "Total")
    loss = ("ChunkedLossWrapper(CrossEntropyLoss), 8 chunks (the torchtitan config's default)" if c["loss"] == "chunked"
            else "CrossEntropyLoss un-chunked (torchtitan's llama3_debugmodel_ce_loss option, NOT the 8B/70B "
                 "default): full fp32 logits")
    moe = ("; MoE: every layer is MoE (128 routed experts, top-8, torchtitan's standard token dispatcher), "
           "expert parallel 1, so the routed experts are sharded by FSDP like the rest; the router's "
           "torch.autocast(float32) is a no-op on the CPU (warning), so its gate scores are bf16 here, fp32 on a GPU"
           if "num_experts" in preset else "")
    how = ("the second of two tracked steps" if first else
           "one tracked step after torchtitan's init_optim_state (AdamW state present) with the sharded fp32 "
           "gradients allocated (zero_grad(set_to_none=False) keeps them between steps)")
    return (f"measured step: {how}; tracker categories (GiB) at its peak: {cats}; peak phase: {steady['phase']}; "
            + (f"first step (no AdamW state yet) peak {first['peak']['Total']:.4f} GiB in {first['phase']}; "
               if first else "") +
            f"AdamW state held {r['opt_state_gib']:.4f} GiB, sharded fp32 parameters {r['local_param_gib']:.4f} GiB "
            f"({r['n_params']:,} parameters in the {r['n_layers']}-layer model built); loss: {loss}; "
            f"spmd_backend partial_dtensor (DTensor TP + FSDP2), fully_shard per block + tok_embeddings + "
            f"[norm, lm_head] + root, reshard_after_forward default (blocks and embeddings yes, [norm, lm_head] "
            f"no), MixedPrecisionPolicy(param bf16, reduce fp32), fused AdamW, zero_grad(set_to_none=False); "
            f"eager (no CUDA graphs, no compile); allocated tensors only (no allocator reserve); "
            f"measured in {r['seconds']:.1f} s{moe}")


def to_row(r: dict) -> dict:
    """measure()'s result as the data file's row."""
    c, steady = r["config"], r["steps"][-1]
    first = r["steps"][0] if len(r["steps"]) == 2 else None
    preset = PRESETS[c["model"]]
    full = r["n_layers"] == preset["num_layers"]
    p = steady["peak"]
    g = lambda *keys: sum(p.get(k, 0.0) for k in keys)   # noqa: E731
    breakdown = {
        "parameters": g("Sharded Param", "Unsharded Param", "Buffer"),
        "gradients": g("Sharded Grad", "Unsharded Grad"),
        "optimizer": g("OptState"),
        "activations": g("Activation", "Inputs"),
        "temp": g("Temp", "All Gather", "Reduce Scatter"),
    }
    tt = r["torchtitan"]
    row = {
        "framework": "torchtitan",
        "source": (f"measured: torchtitan {tt} {preset.get('registry', 'llama3')} model + FSDP2 under FakeTensorMode, "
                   f"torch {r['torch'].split('+')[0]} "
                   "FSDPMemTracker, benchmarks/measure_memory_torchtitan.py"),
        "release": f"torchtitan {tt}",
        "model": c["model"] if full else "custom",
        "num_layers": r["n_layers"],
        "hidden_size": preset["hidden_size"],
        "num_attention_heads": preset["num_attention_heads"],
        "num_query_groups": preset["num_query_groups"],
        "ffn_hidden_size": preset["ffn_hidden_size"],
        "vocab_size": preset["vocab_size"],
        "seq_length": c["seq"],
        "ffn_type": "swiglu",
        **({"head_dim": preset["head_dim"], "num_experts": preset["num_experts"], "moe_top_k": preset["moe_top_k"],
            "moe_ffn_hidden_size": preset["moe_ffn_hidden_size"], "ep": c["ep"], "etp": 1}
           if "num_experts" in preset else {}),
        "gpus": c["dp"] * c["tp"],
        "tp": c["tp"],
        "pp": 1,
        "cp": 1,
        "vp": 1,
        "dp": c["dp"],
        "micro_batch": c["mb"],
        "global_batch": c["mb"] * c["dp"],
        "sequence_parallel": c["tp"] > 1,
        "recompute": c["recompute"],
        "zero_stage": 3,
        "distributed_optimizer": True,
        "precision": "bf16",
        "stage": 0,
        "attention": _attention(steady),
        "peak_allocated_gib": round(p["Total"], 4),
        "breakdown_gib": {k: round(v, 4) for k, v in breakdown.items()},
        "note": _note(r, first),
    }
    return row


def toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{k} = {toml_value(x)}" for k, x in v.items()) + " }"
    return json.dumps(str(v), ensure_ascii=False)      # a TOML basic string is JSON-compatible here


def write_toml(rows: list[dict], path: Path, failures: list[str], seconds: float) -> None:
    head = [
        "# MEASURED peak per-GPU memory of torchtitan's own training step (Llama 3; Qwen3 30B-A3B MoE), FSDP2,",
        "# optionally 2-D FSDP x TP with sequence parallelism, one [[row]] per configuration, written by",
        "# benchmarks/measure_memory_torchtitan.py (its docstring: set-up, method, patches). Fake tensors on a CPU:",
        "# fake process group at the layout's world size (rank 0), torchtitan's parallelize_llama, FSDPMemTracker",
        "# around one steady-state training step (AdamW state and sharded gradients present); peak_allocated_gib is",
        "# its peak of allocated tensors, GiB = 2^30 bytes; breakdown_gib groups the tracker's categories at that "
        "peak:",
        "# parameters = sharded fp32 + unsharded bf16 parameters (+ buffers), gradients = sharded fp32 + unsharded",
        "# gradients, optimizer = AdamW state, activations = activations + inputs, temp = temporaries + all-gather +",
        "# reduce-scatter buffers; the note lists every category. model = a tuner preset when all its layers were",
        "# built, else \"custom\" (fewer layers of the same shape). MoE rows add head_dim, num_experts, moe_top_k,",
        "# moe_ffn_hidden_size, ep and etp (as moe_published.toml). Not modelled: CUDA graphs, the allocator's",
        "# reserve and fragmentation. Nothing here is estimated or edited by hand.",
        f"# {len(rows)} rows; run time {seconds:.0f} s.",
    ]
    if failures:
        head.append("# configurations that failed (no row): " + "; ".join(failures))
    out = ["\n".join(head), ""]
    for row in rows:
        out.append("[[row]]")
        out += [f"{k} = {toml_value(v)}" for k, v in row.items()]
        out.append("")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(out))
