"""What the bundled harness can build, checked before a trial runs (pure: imports neither torch nor
deepspeed). tuner.study asks these before a study or a trial starts; train.py asks them again and
fails the trial with the same sentence, so an unbuildable layout never runs as something else."""

from __future__ import annotations

#: Model architecture values the harness builds (tuner.specs.MODEL_CHOICES; booleans: both).
SUPPORTED_MODEL = {"ffn_type": ("gelu", "swiglu"), "position_embedding": ("learned", "rope"),
                   "normalization": ("layernorm", "rmsnorm")}


def model_refusal(model) -> str | None:
    """Why the harness cannot build `model` (a ModelSpec) as specified, or None."""
    off = [f"{k} = {getattr(model, k)!r}" for k, ok in SUPPORTED_MODEL.items() if getattr(model, k) not in ok]
    heads, groups = model.num_attention_heads, model.num_query_groups
    if heads % groups:
        off.append(f"num_query_groups = {groups} does not divide num_attention_heads = {heads}")
    if model.position_embedding == "rope" and (model.hidden_size // heads) % 2:
        off.append(f"RoPE with an odd head size ({model.hidden_size // heads})")
    if off:
        return f"the bundled harness cannot build {model.name} ({'; '.join(off)})"
    return None


def layout_refusal(layout) -> str | None:
    """Why the harness cannot run `layout` (a tuner.layout.Layout, before or after it gained
    virtual_pipeline and context_parallel), or None."""
    vp, cp = getattr(layout, "virtual_pipeline", 1), getattr(layout, "context_parallel", 1)
    if vp > 1:
        return (f"the bundled harness cannot run virtual_pipeline = {vp}: DeepSpeed's pipeline engine has "
                "no interleaved schedule (use virtual_pipeline = 1, or a Megatron trainer through "
                "--runner command / --runner slurm --template megatron)")
    if cp > 1:
        return (f"the bundled harness cannot run context_parallel = {cp}: it has no context parallelism "
                "(use context_parallel = 1, or a Megatron trainer through --runner command / "
                "--runner slurm --template megatron)")
    return None
