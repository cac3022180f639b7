"""What the bundled harness can build, checked before a trial runs (pure: imports neither torch nor
deepspeed). tuner.study asks these before a study or a trial starts; train.py asks them again and
fails the trial with the same sentence, so an unbuildable layout never runs as something else."""

from __future__ import annotations

#: Model architecture values the harness builds (tuner.specs.MODEL_CHOICES; booleans: both).
SUPPORTED_MODEL = {"ffn_type": ("gelu", "swiglu"), "position_embedding": ("learned", "rope"),
                   "normalization": ("layernorm", "rmsnorm")}


#: Architecture keys the harness does not build, with the value it does build (MLA, QK-norm, MoE routing
#: beyond top-k softmax/sigmoid with dropless dispatch: capacity drops, group-limited routing, the
#: aux-loss-free expert bias).
UNSUPPORTED_AT = {"multi_latent_attention": False, "qk_layernorm": False, "moe_capacity_factor": None,
                  "moe_router_num_groups": None, "moe_router_group_topk": None, "moe_router_expert_bias": False}


def model_refusal(model) -> str | None:
    """Why the harness cannot build `model` (a ModelSpec) as specified, or None."""
    off = [f"{k} = {getattr(model, k)!r}" for k, ok in SUPPORTED_MODEL.items() if getattr(model, k) not in ok]
    off += [f"{k} = {getattr(model, k)!r}" for k, built in UNSUPPORTED_AT.items()
            if getattr(model, k, built) != built]
    if getattr(model, "head_dim", 0) not in (0, model.hidden_size // model.num_attention_heads):
        off.append(f"head_dim = {model.head_dim} (its heads are hidden_size / num_attention_heads wide)")
    if getattr(model, "num_experts", 0) and model.add_bias_linear:
        off.append("add_bias_linear = True with experts (its experts have no biases)")
    heads, groups = model.num_attention_heads, model.num_query_groups
    if heads % groups:
        off.append(f"num_query_groups = {groups} does not divide num_attention_heads = {heads}")
    if model.position_embedding == "rope" and (model.hidden_size // heads) % 2:
        off.append(f"RoPE with an odd head size ({model.hidden_size // heads})")
    if off:
        return f"the bundled harness cannot build {model.name} ({'; '.join(off)})"
    return None


def layout_refusal(layout, num_layers: int | None = None, precision: str = "bf16", model=None) -> str | None:
    """Why the harness cannot run `layout` (a tuner.layout.Layout) of a model with `num_layers` layers in
    the study's `precision`, or None: virtual stages, context parallelism, an uneven pipeline split
    (DeepSpeed's PipelineModule would split otherwise than the layout says), FP8, and (given the
    ModelSpec `model`) ZeRO-3 with a mixture of experts."""
    if precision != "bf16":
        return (f"the bundled harness trains in bf16 (fp32 on CPU), not {precision}: use --precision bf16, or "
                "--runner command with a trainer that runs FP8 (Transformer Engine)")
    vp, cp = layout.virtual_pipeline, layout.context_parallel
    if num_layers is not None and num_layers % (layout.pp * vp):
        return (f"the bundled harness splits layers evenly over pipeline stages: pp*vp = {layout.pp * vp} must "
                f"divide {num_layers} layers")
    if vp > 1:
        return (f"the bundled harness cannot run virtual_pipeline = {vp}: DeepSpeed's pipeline engine has "
                "no interleaved schedule (use virtual_pipeline = 1, or a Megatron trainer through "
                "--runner command / --runner slurm --template megatron)")
    if cp > 1:
        return (f"the bundled harness cannot run context_parallel = {cp}: it has no context parallelism "
                "(use context_parallel = 1, or a Megatron trainer through --runner command / "
                "--runner slurm --template megatron)")
    if getattr(model, "num_experts", 0) and layout.zero_stage == 3:
        return ("the bundled harness cannot run zero_stage = 3 with a mixture-of-experts model: DeepSpeed's "
                "ZeRO-3 does not partition its MoE layers (use zero_stage 0, 1 or 2)")
    return None
