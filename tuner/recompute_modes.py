"""Recompute modes of a layout and the Megatron-Core recompute modules of each (pure, no imports: tuner.layout,
tuner.frameworks and tuner.perfmodel.recompute read them)."""

from __future__ import annotations

#: Recompute modes: none keeps every activation, selective re-runs the attention core in the backward pass,
#: full re-runs every layer from its input; between them Megatron-Core's named module sets
#: (--recompute-granularity selective --recompute-modules ..., tuner.perfmodel.recompute) as NVIDIA's recipes
#: set them: moe_act (Qwen3 / DeepSeek-V3 on GB300), norm_act (layernorm, moe_act: Qwen3-235B on H100),
#: mla_up (DeepSeek-V3 / Kimi-K2 on Blackwell), mla_up_mlp (mla_up_proj, mlp: DeepSeek-V3 / Kimi-K2 on H100;
#: Megatron-Bridge perf_recipes/deepseek/h100/deepseek_v3.py line 43 at 067f987df03b), mla_up_mlp_moe (and moe, the
#: whole MoE layer: DeepSeek-V3 on H100 in NeMo 25.07, dgxc-benchmarking v25.08's launch.sh), norm_moe (layernorm, moe:
#: Qwen3-235B-A22B's long-context H100 runs, yanring/Megatron-MoE-ModelZoo best_practice/Qwen3/run_235b.sh at b0b92ff,
#: and Pai-Megatron-Patch's 'recompute=moe'), mlp (the dense layers' MLP alone: Megatron-Core checkpoints `mlp` only
#: where the layer is not an MoE layer, transformer_layer.py line 537 at d98e8a64ddf3, so an MoE model's MoE layers keep
#: everything; DeepSeek-V3 on GB200 in MLPerf Training v6.0's NVIDIA / Google configs). Not a chain: one mode
#: recomputes more than another when its modules include the other's (recomputes_at_least); full, everything.
RECOMPUTE = ("none", "moe_act", "norm_act", "selective", "mlp", "mla_up", "mla_up_mlp", "mla_up_mlp_moe", "norm_moe",
             "full")
RECOMPUTE_MODULES = {"none": (), "moe_act": ("moe_act",), "norm_act": ("layernorm", "moe_act"),
                     "selective": ("core_attn",), "mlp": ("mlp",), "mla_up": ("mla_up_proj",),
                     "mla_up_mlp": ("mla_up_proj", "mlp"),
                     "mla_up_mlp_moe": ("mla_up_proj", "mlp", "moe"), "norm_moe": ("layernorm", "moe"),
                     "full": ("core_attn", "layernorm", "moe_act", "mla_up_proj", "mlp", "moe")}


_MODULE_SETS = {mode: frozenset(mods) for mode, mods in RECOMPUTE_MODULES.items()}


def recompute_modules(mode: str) -> frozenset:
    """Megatron-Core's recompute modules of a mode (full: every one of them, and the rest of each layer)."""
    return _MODULE_SETS.get(mode, frozenset())


def recomputes_at_least(a: str, b: str) -> bool:
    """Whether mode `a` recomputes everything mode `b` does (full recomputes all; none nothing)."""
    return a == "full" or (b != "full" and recompute_modules(a) >= recompute_modules(b))
