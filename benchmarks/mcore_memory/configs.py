"""Megatron-Core memory measurement's configurations (pure data): the grid shapes, C(...), CONFIGS and the held-out
batches FRESH .. FRESH5 and PIPELINE with the data file each is written to (benchmarks/measure_memory_mcore.py)."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DEFAULT_OUT = REPO / "benchmarks" / "data" / "memory_measured_megatron-core.toml"
GiB = float(2 ** 30)

# ----------------------------------------------------------------------------------- the configurations
# Architectures (Megatron-Core TransformerConfig / GPTModel arguments). Llama-3-style: GQA, SwiGLU, RMSNorm,
# RoPE (base 5e5), untied embeddings, no biases, no dropout. GPT-style: GeLU, LayerNorm, learned absolute
# positions, tied embeddings, biases, dropout 0.1 (Megatron-LM's default hidden / attention dropout).
LLAMA = dict(ffn_type="swiglu", normalization="rmsnorm", position_embedding="rope", tie_embeddings=False,
             add_bias_linear=False, rope_theta=500000.0, dropout=0.0)
GPT = dict(ffn_type="gelu", normalization="layernorm", position_embedding="learned", tie_embeddings=True,
           add_bias_linear=True, dropout=0.1)
MIXTRAL = dict(LLAMA, rope_theta=1000000.0)
SHAPES = {
    "llama3-8b": dict(LLAMA, num_layers=32, hidden_size=4096, num_attention_heads=32, num_query_groups=8,
                      ffn_hidden_size=14336, vocab_size=128256),
    "llama3-70b": dict(LLAMA, num_layers=80, hidden_size=8192, num_attention_heads=64, num_query_groups=8,
                       ffn_hidden_size=28672, vocab_size=128256),
    "gpt-22b": dict(GPT, num_layers=48, hidden_size=6144, num_attention_heads=48, num_query_groups=48,
                    ffn_hidden_size=4 * 6144, vocab_size=50688),
    "gpt-175b": dict(GPT, num_layers=96, hidden_size=12288, num_attention_heads=96, num_query_groups=96,
                     ffn_hidden_size=4 * 12288, vocab_size=50688),
    "mixtral-8x7b": dict(MIXTRAL, num_layers=32, hidden_size=4096, num_attention_heads=32, num_query_groups=8,
                         ffn_hidden_size=14336, vocab_size=32000, num_experts=8, moe_router_topk=2,
                         moe_ffn_hidden_size=14336),
}


def C(shape, *, layers=None, tp=1, pp=1, cp=1, dp=1, ep=1, mb=1, m=1, seq=4096, sp=None, recompute="none",
      dist_opt=True, attention="flash-standin", stage=0, vp=1):
    """One configuration: a SHAPES entry (optionally cut to `layers` layers) and a layout."""
    c = dict(SHAPES[shape])
    c["shape"] = shape
    if layers is not None:
        c["num_layers"] = layers
    c.update(tp=tp, pp=pp, cp=cp, dp=dp, ep=ep, micro_batch=mb, num_microbatches=m, seq_length=seq,
             sequence_parallel=(tp > 1) if sp is None else sp, recompute=recompute, distributed_optimizer=dist_opt,
             attention=attention, stage=stage if stage >= 0 else pp + stage, vp=vp)
    return c


CONFIGS = [
    # --- llama3-8b (full 32 layers), pp = 1
    C("llama3-8b", tp=1, dp=8, mb=1, m=4, seq=8192),
    C("llama3-8b", tp=1, dp=8, mb=1, m=4, seq=8192, dist_opt=False),
    C("llama3-8b", tp=2, dp=4, mb=1, m=4, seq=8192),
    C("llama3-8b", tp=2, dp=4, mb=1, m=4, seq=8192, sp=False),
    C("llama3-8b", tp=4, dp=16, mb=2, m=2, seq=4096),
    C("llama3-8b", tp=4, dp=16, mb=2, m=2, seq=4096, sp=False),
    C("llama3-8b", tp=8, dp=64, mb=4, m=1, seq=2048),
    C("llama3-8b", tp=1, dp=64, mb=2, m=1, seq=4096),
    C("llama3-8b", tp=1, dp=1, mb=1, m=2, seq=4096, dist_opt=False),
    C("llama3-8b", tp=1, dp=16, mb=1, m=1, seq=8192, recompute="full"),
    C("llama3-8b", tp=1, dp=16, mb=1, m=1, seq=8192, recompute="selective"),
    C("llama3-8b", tp=2, dp=16, mb=2, m=2, seq=4096, recompute="full"),
    # the distributed optimizer's 12/d: the same layout over dp 1 / 4 / 16 / 64
    C("llama3-8b", tp=2, dp=1, mb=1, m=2, seq=4096),
    C("llama3-8b", tp=2, dp=4, mb=1, m=2, seq=4096),
    C("llama3-8b", tp=2, dp=16, mb=1, m=2, seq=4096),
    C("llama3-8b", tp=2, dp=64, mb=1, m=2, seq=4096),
    C("llama3-8b", tp=1, cp=2, dp=4, mb=1, m=2, seq=8192),
    C("llama3-8b", tp=2, cp=2, dp=4, mb=1, m=2, seq=8192),
    # s x s scores kept (Megatron's local DotProductAttention): pairs with rows above
    C("llama3-8b", tp=2, dp=16, mb=1, m=2, seq=2048, attention="local"),
    C("llama3-8b", tp=2, dp=16, mb=1, m=2, seq=2048),
    C("llama3-8b", tp=2, dp=16, mb=1, m=2, seq=2048, attention="local", recompute="selective"),
    C("llama3-8b", tp=4, dp=4, mb=1, m=2, seq=4096, attention="local"),
    C("llama3-8b", tp=4, dp=4, mb=1, m=2, seq=4096),
    # --- llama3-8b, pp > 1 (1F1B), first and last stage
    C("llama3-8b", tp=1, pp=2, dp=4, mb=1, m=8, seq=8192, stage=0),
    C("llama3-8b", tp=1, pp=2, dp=4, mb=1, m=8, seq=8192, stage=-1),
    C("llama3-8b", tp=2, pp=4, dp=4, mb=1, m=8, seq=4096, stage=0),
    C("llama3-8b", tp=2, pp=4, dp=4, mb=1, m=8, seq=4096, stage=-1),
    C("llama3-8b", tp=2, pp=4, dp=4, mb=1, m=3, seq=4096, stage=0),
    C("llama3-8b", tp=2, pp=2, dp=16, mb=2, m=4, seq=4096, recompute="full", stage=0),
    C("llama3-8b", tp=2, pp=2, dp=16, mb=2, m=4, seq=4096, recompute="full", stage=-1),
    # --- llama3-70b shape, cut to 8 layers (custom), tp 8, pp = 1
    C("llama3-70b", layers=8, tp=8, dp=4, mb=1, m=2, seq=8192),
    C("llama3-70b", layers=8, tp=8, dp=4, mb=1, m=2, seq=8192, sp=False),
    C("llama3-70b", layers=8, tp=8, dp=4, mb=1, m=2, seq=8192, dist_opt=False),
    C("llama3-70b", layers=8, tp=8, dp=4, mb=1, m=2, seq=8192, recompute="full"),
    C("llama3-70b", layers=8, tp=4, dp=16, mb=1, m=2, seq=4096),
    C("llama3-70b", layers=8, tp=8, cp=2, dp=2, mb=1, m=2, seq=8192),
    C("llama3-70b", layers=8, tp=8, dp=4, mb=1, m=2, seq=4096, attention="local"),
    # --- llama3-70b (full 80 layers), tp 8 pp 4
    C("llama3-70b", tp=8, pp=4, dp=4, mb=1, m=8, seq=8192, stage=0),
    C("llama3-70b", tp=8, pp=4, dp=4, mb=1, m=8, seq=8192, stage=-1),
    C("llama3-70b", tp=8, pp=4, dp=4, mb=1, m=8, seq=8192, recompute="full", stage=0),
    C("llama3-70b", tp=8, pp=4, cp=2, dp=2, mb=1, m=8, seq=8192, stage=0),
    # --- gpt-22b (full 48 layers)
    C("gpt-22b", tp=8, dp=4, mb=1, m=4, seq=2048),
    C("gpt-22b", tp=8, dp=4, mb=1, m=4, seq=2048, attention="local"),
    C("gpt-22b", tp=8, dp=4, mb=1, m=4, seq=2048, sp=False),
    C("gpt-22b", tp=8, dp=4, mb=1, m=4, seq=2048, attention="local", recompute="selective"),
    C("gpt-22b", tp=8, dp=4, mb=1, m=4, seq=2048, recompute="full"),
    C("gpt-22b", tp=8, dp=4, mb=1, m=4, seq=2048, dist_opt=False),
    C("gpt-22b", tp=4, dp=16, mb=2, m=2, seq=2048),
    C("gpt-22b", tp=8, dp=16, mb=4, m=2, seq=2048),
    C("gpt-22b", tp=2, pp=2, dp=16, mb=1, m=8, seq=2048, stage=0),
    C("gpt-22b", tp=2, pp=2, dp=16, mb=1, m=8, seq=2048, stage=-1),
    C("gpt-22b", tp=8, pp=4, dp=1, mb=4, m=8, seq=2048, stage=0),
    C("gpt-22b", tp=8, pp=4, dp=1, mb=4, m=8, seq=2048, stage=-1),
    # --- gpt-175b (full 96 layers), tp 8 pp 8
    C("gpt-175b", tp=8, pp=8, dp=1, mb=1, m=8, seq=2048, stage=0),
    C("gpt-175b", tp=8, pp=8, dp=1, mb=1, m=8, seq=2048, stage=-1),
    # --- gpt-175b shape cut to 8 layers (custom)
    C("gpt-175b", layers=8, tp=8, dp=8, mb=1, m=2, seq=2048),
    C("gpt-175b", layers=8, tp=8, dp=8, mb=1, m=2, seq=2048, attention="local"),
    # --- Mixtral 8x7B shape cut to 4 layers (custom): Megatron-Core MoE, SequentialMLP experts
    C("mixtral-8x7b", layers=4, tp=1, ep=8, dp=8, mb=1, m=2, seq=4096),
    C("mixtral-8x7b", layers=4, tp=2, ep=4, dp=4, mb=1, m=2, seq=4096),
    C("mixtral-8x7b", tp=1, ep=8, dp=8, mb=1, m=2, seq=4096),
    C("mixtral-8x7b", tp=2, pp=2, ep=4, dp=4, mb=1, m=8, seq=4096, stage=0),
    C("mixtral-8x7b", tp=2, pp=2, ep=4, dp=4, mb=1, m=8, seq=4096, stage=-1),
]

#: --fresh (issue 24 round 4): 24 dense configurations no choice has seen, for the held-out reliability of the
#: allocated-bytes p_fit, drawn at run time by benchmarks/draw_memory_batch.py --mcore (its MCORE_GRID, less CONFIGS,
#: from the held-out third, 8 per recompute mode), seed 463727410 (os.urandom); committed before any is measured and
#: before Megatron-Core's allocated-bytes spread is chosen. Written to data/memory_measured_megatron-core_fresh.toml.
FRESH = [
    C("llama3-70b", layers=8, tp=8, pp=2, dp=16, mb=2, m=2, seq=8192, recompute="none", stage=-1),
    C("llama3-70b", layers=8, tp=1, pp=2, dp=16, mb=2, m=4, seq=4096, recompute="none", stage=-1),
    C("llama3-8b", tp=8, pp=2, dp=16, mb=2, m=4, seq=8192, recompute="none"),
    C("llama3-70b", layers=8, tp=2, pp=2, dp=4, mb=1, m=4, seq=2048, recompute="none"),
    C("llama3-8b", tp=4, pp=1, dp=16, mb=1, m=4, seq=8192, recompute="none"),
    C("llama3-70b", layers=8, tp=8, pp=1, dp=16, mb=1, m=2, seq=4096, recompute="none"),
    C("llama3-70b", layers=8, tp=1, pp=2, dp=16, mb=2, m=4, seq=8192, recompute="none", stage=-1),
    C("gpt-22b", layers=8, tp=4, pp=1, dp=4, mb=1, m=2, seq=8192, recompute="none"),
    C("llama3-70b", layers=8, tp=2, pp=1, dp=4, mb=2, m=4, seq=2048, recompute="selective"),
    C("llama3-8b", tp=2, pp=2, dp=16, mb=1, m=4, seq=2048, recompute="selective", stage=-1),
    C("gpt-22b", layers=8, tp=8, pp=2, dp=4, mb=1, m=2, seq=2048, recompute="selective", stage=-1),
    C("gpt-22b", layers=8, tp=4, pp=1, dp=16, mb=2, m=4, seq=8192, recompute="selective"),
    C("llama3-70b", layers=8, tp=2, pp=2, dp=4, mb=2, m=4, seq=8192, recompute="selective", stage=-1),
    C("llama3-70b", layers=8, tp=2, pp=2, dp=4, mb=2, m=2, seq=8192, recompute="selective", stage=-1),
    C("llama3-8b", tp=1, pp=2, dp=4, mb=2, m=4, seq=2048, recompute="selective"),
    C("llama3-70b", layers=8, tp=2, pp=2, dp=16, mb=2, m=2, seq=4096, recompute="selective"),
    C("gpt-22b", layers=8, tp=8, pp=2, dp=16, mb=1, m=2, seq=8192, recompute="full"),
    C("llama3-8b", tp=8, pp=1, dp=16, mb=2, m=2, seq=8192, recompute="full"),
    C("llama3-8b", tp=8, pp=1, dp=4, mb=1, m=2, seq=2048, recompute="full"),
    C("llama3-8b", tp=4, pp=2, dp=16, mb=1, m=2, seq=4096, recompute="full"),
    C("llama3-70b", layers=8, tp=2, pp=2, dp=4, mb=1, m=4, seq=4096, recompute="full"),
    C("gpt-22b", layers=8, tp=2, pp=1, dp=4, mb=2, m=2, seq=8192, recompute="full"),
    C("llama3-8b", tp=1, pp=2, dp=16, mb=2, m=4, seq=2048, recompute="full", stage=-1),
    C("gpt-22b", layers=8, tp=2, pp=2, dp=4, mb=1, m=4, seq=2048, recompute="full", stage=-1),
]
FRESH_OUT = REPO / "benchmarks" / "data" / "memory_measured_megatron-core_fresh.toml"

#: --fresh2 (issue 24 round 5): 24 dense configurations drawn by benchmarks/draw_memory_batch.py --mcore (its MCORE_GRID,
#: less CONFIGS, FRESH and PIPELINE, from the held-out third, 8 per recompute mode), seed 1350905612 (os.urandom), after
#: Megatron-Core's loss phase and SP gather buffer (5391df6) and its bias / sd chosen again on CONFIGS and FRESH; committed
#: before any is measured. Written to data/memory_measured_megatron-core_fresh2.toml.
FRESH2 = [
    C("gpt-22b", layers=8, tp=4, pp=2, dp=16, mb=2, m=2, seq=2048, recompute="none", stage=-1),
    C("llama3-8b", tp=2, pp=2, dp=4, mb=1, m=4, seq=8192, recompute="none", stage=-1),
    C("gpt-22b", layers=8, tp=2, pp=2, dp=4, mb=2, m=2, seq=8192, recompute="none"),
    C("gpt-22b", layers=8, tp=4, pp=2, dp=4, mb=1, m=4, seq=8192, recompute="none"),
    C("gpt-22b", layers=8, tp=1, pp=1, dp=4, mb=1, m=4, seq=8192, recompute="none"),
    C("gpt-22b", layers=8, tp=4, pp=2, dp=4, mb=1, m=2, seq=2048, recompute="none", stage=-1),
    C("gpt-22b", layers=8, tp=8, pp=2, dp=16, mb=1, m=4, seq=4096, recompute="none", stage=-1),
    C("llama3-8b", tp=1, pp=2, dp=4, mb=2, m=2, seq=2048, recompute="none"),
    C("gpt-22b", layers=8, tp=8, pp=2, dp=16, mb=2, m=4, seq=8192, recompute="selective", stage=-1),
    C("llama3-70b", layers=8, tp=2, pp=2, dp=4, mb=2, m=2, seq=8192, recompute="selective"),
    C("llama3-70b", layers=8, tp=8, pp=1, dp=16, mb=1, m=4, seq=2048, recompute="selective"),
    C("llama3-70b", layers=8, tp=2, pp=2, dp=4, mb=2, m=4, seq=2048, recompute="selective"),
    C("gpt-22b", layers=8, tp=4, pp=1, dp=16, mb=1, m=4, seq=8192, recompute="selective"),
    C("gpt-22b", layers=8, tp=2, pp=2, dp=16, mb=1, m=2, seq=2048, recompute="selective", stage=-1),
    C("llama3-8b", tp=1, pp=2, dp=4, mb=2, m=4, seq=8192, recompute="selective"),
    C("llama3-70b", layers=8, tp=2, pp=2, dp=4, mb=2, m=4, seq=4096, recompute="selective"),
    C("llama3-8b", tp=2, pp=2, dp=4, mb=1, m=2, seq=2048, recompute="full"),
    C("llama3-8b", tp=2, pp=2, dp=16, mb=1, m=4, seq=8192, recompute="full", stage=-1),
    C("gpt-22b", layers=8, tp=4, pp=2, dp=16, mb=2, m=4, seq=4096, recompute="full"),
    C("llama3-8b", tp=1, pp=1, dp=16, mb=1, m=4, seq=4096, recompute="full"),
    C("gpt-22b", layers=8, tp=1, pp=1, dp=16, mb=1, m=2, seq=8192, recompute="full"),
    C("llama3-8b", tp=8, pp=1, dp=16, mb=1, m=2, seq=4096, recompute="full"),
    C("gpt-22b", layers=8, tp=4, pp=1, dp=16, mb=2, m=4, seq=2048, recompute="full"),
    C("llama3-70b", layers=8, tp=4, pp=2, dp=16, mb=2, m=4, seq=4096, recompute="full", stage=-1),
]
FRESH2_OUT = REPO / "benchmarks" / "data" / "memory_measured_megatron-core_fresh2.toml"

#: --fresh3 (issue 24 round 8): 24 dense configurations drawn by benchmarks/draw_memory_batch.py --mcore (its MCORE_GRID,
#: outside every configuration of CONFIGS, FRESH, FRESH2 and PIPELINE and every one a memory choice has seen, from the
#: held-out third, 8 per recompute mode), seed 193059340 (os.urandom), after Megatron-Core's layer backward and its bias /
#: sd chosen again on CONFIGS, FRESH and FRESH2 (7427b75); committed before any is measured. Written to
#: data/memory_measured_megatron-core_fresh3.toml.
FRESH3 = [
    C("llama3-70b", layers=8, tp=1, pp=2, dp=4, mb=1, m=4, seq=8192, recompute="none", stage=-1),
    C("llama3-8b", tp=4, pp=1, dp=16, mb=1, m=2, seq=8192, recompute="none"),
    C("llama3-8b", tp=1, pp=2, dp=16, mb=1, m=4, seq=4096, recompute="none"),
    C("gpt-22b", layers=8, tp=8, pp=2, dp=16, mb=1, m=4, seq=2048, recompute="none", stage=-1),
    C("llama3-8b", tp=1, pp=2, dp=16, mb=1, m=2, seq=2048, recompute="none", stage=-1),
    C("llama3-70b", layers=8, tp=2, pp=1, dp=4, mb=2, m=4, seq=2048, recompute="none"),
    C("gpt-22b", layers=8, tp=2, pp=2, dp=16, mb=2, m=2, seq=8192, recompute="none", stage=-1),
    C("llama3-8b", tp=8, pp=2, dp=4, mb=2, m=4, seq=8192, recompute="none", stage=-1),
    C("gpt-22b", layers=8, tp=8, pp=1, dp=16, mb=2, m=2, seq=4096, recompute="selective"),
    C("gpt-22b", layers=8, tp=8, pp=1, dp=4, mb=2, m=2, seq=4096, recompute="selective"),
    C("llama3-8b", tp=4, pp=2, dp=16, mb=1, m=2, seq=4096, recompute="selective", stage=-1),
    C("llama3-70b", layers=8, tp=8, pp=2, dp=16, mb=1, m=4, seq=2048, recompute="selective", stage=-1),
    C("gpt-22b", layers=8, tp=1, pp=2, dp=4, mb=2, m=2, seq=4096, recompute="selective"),
    C("llama3-8b", tp=2, pp=1, dp=16, mb=2, m=4, seq=8192, recompute="selective"),
    C("llama3-8b", tp=4, pp=1, dp=4, mb=1, m=2, seq=4096, recompute="selective"),
    C("llama3-8b", tp=2, pp=2, dp=16, mb=1, m=2, seq=8192, recompute="selective", stage=-1),
    C("gpt-22b", layers=8, tp=2, pp=2, dp=16, mb=1, m=2, seq=4096, recompute="full"),
    C("llama3-70b", layers=8, tp=2, pp=2, dp=4, mb=1, m=2, seq=2048, recompute="full"),
    C("llama3-8b", tp=8, pp=2, dp=4, mb=1, m=4, seq=8192, recompute="full"),
    C("gpt-22b", layers=8, tp=4, pp=2, dp=16, mb=2, m=2, seq=8192, recompute="full", stage=-1),
    C("llama3-70b", layers=8, tp=4, pp=2, dp=16, mb=1, m=4, seq=8192, recompute="full"),
    C("llama3-70b", layers=8, tp=1, pp=1, dp=4, mb=1, m=2, seq=8192, recompute="full"),
    C("gpt-22b", layers=8, tp=4, pp=2, dp=4, mb=2, m=4, seq=2048, recompute="full", stage=-1),
    C("llama3-8b", tp=1, pp=2, dp=16, mb=1, m=2, seq=4096, recompute="full"),
]
FRESH3_OUT = REPO / "benchmarks" / "data" / "memory_measured_megatron-core_fresh3.toml"

#: --fresh4 (issue 24 round 8, second pass): 24 dense configurations drawn by benchmarks/draw_memory_batch.py --mcore
#: (FRESH3's rule, outside FRESH3 too), seed 998366673 (os.urandom), after full recompute's recomputed output, the
#: harness read as it ran and Megatron-Core's bias / sd chosen again on CONFIGS, FRESH, FRESH2 and FRESH3 (f2725a0);
#: committed before any is measured. Written to data/memory_measured_megatron-core_fresh4.toml.
FRESH4 = [
    C("llama3-8b", tp=8, pp=1, dp=16, mb=1, m=4, seq=4096, recompute="none"),
    C("llama3-8b", tp=2, pp=2, dp=4, mb=1, m=4, seq=4096, recompute="none"),
    C("gpt-22b", layers=8, tp=1, pp=1, dp=4, mb=1, m=4, seq=2048, recompute="none"),
    C("llama3-70b", layers=8, tp=2, pp=2, dp=16, mb=2, m=4, seq=2048, recompute="none", stage=-1),
    C("llama3-8b", tp=8, pp=2, dp=16, mb=1, m=4, seq=4096, recompute="none"),
    C("llama3-70b", layers=8, tp=4, pp=2, dp=16, mb=1, m=4, seq=8192, recompute="none", stage=-1),
    C("llama3-70b", layers=8, tp=1, pp=1, dp=16, mb=2, m=2, seq=2048, recompute="none"),
    C("llama3-70b", layers=8, tp=8, pp=1, dp=4, mb=1, m=4, seq=4096, recompute="none"),
    C("gpt-22b", layers=8, tp=4, pp=2, dp=16, mb=2, m=4, seq=2048, recompute="selective"),
    C("llama3-8b", tp=4, pp=1, dp=16, mb=2, m=2, seq=8192, recompute="selective"),
    C("llama3-70b", layers=8, tp=4, pp=1, dp=16, mb=1, m=2, seq=8192, recompute="selective"),
    C("llama3-8b", tp=8, pp=2, dp=16, mb=1, m=4, seq=2048, recompute="selective"),
    C("llama3-70b", layers=8, tp=4, pp=1, dp=4, mb=2, m=2, seq=4096, recompute="selective"),
    C("gpt-22b", layers=8, tp=1, pp=2, dp=16, mb=2, m=4, seq=2048, recompute="selective"),
    C("llama3-8b", tp=1, pp=2, dp=16, mb=2, m=2, seq=8192, recompute="selective", stage=-1),
    C("llama3-70b", layers=8, tp=4, pp=1, dp=4, mb=1, m=2, seq=2048, recompute="selective"),
    C("llama3-70b", layers=8, tp=1, pp=2, dp=16, mb=2, m=2, seq=4096, recompute="full", stage=-1),
    C("gpt-22b", layers=8, tp=8, pp=2, dp=4, mb=2, m=4, seq=4096, recompute="full"),
    C("gpt-22b", layers=8, tp=4, pp=1, dp=16, mb=2, m=4, seq=4096, recompute="full"),
    C("gpt-22b", layers=8, tp=8, pp=1, dp=4, mb=1, m=2, seq=8192, recompute="full"),
    C("gpt-22b", layers=8, tp=1, pp=2, dp=4, mb=1, m=4, seq=8192, recompute="full"),
    C("llama3-8b", tp=8, pp=1, dp=4, mb=1, m=4, seq=8192, recompute="full"),
    C("llama3-70b", layers=8, tp=1, pp=2, dp=4, mb=2, m=4, seq=4096, recompute="full"),
    C("llama3-8b", tp=1, pp=2, dp=16, mb=1, m=4, seq=4096, recompute="full", stage=-1),
]
FRESH4_OUT = REPO / "benchmarks" / "data" / "memory_measured_megatron-core_fresh4.toml"

#: --fresh5 (issue 24 round 9): 24 dense configurations drawn by benchmarks/draw_memory_batch.py --mcore (FRESH3's rule,
#: outside FRESH4 too and every configuration the empirical spread rule's choice saw: published.SEEN), seed 3982451815
#: (os.urandom); committed before any is measured. Written to data/memory_measured_megatron-core_fresh5.toml.
FRESH5 = [
    C("llama3-8b", tp=8, pp=2, dp=4, mb=2, m=2, seq=2048, recompute="none"),
    C("llama3-70b", layers=8, tp=2, pp=2, dp=16, mb=2, m=2, seq=4096, recompute="none", stage=-1),
    C("llama3-8b", tp=1, pp=2, dp=4, mb=2, m=4, seq=4096, recompute="none"),
    C("llama3-70b", layers=8, tp=4, pp=2, dp=16, mb=1, m=4, seq=4096, recompute="none", stage=-1),
    C("llama3-8b", tp=2, pp=2, dp=16, mb=1, m=2, seq=8192, recompute="none"),
    C("gpt-22b", layers=8, tp=1, pp=2, dp=16, mb=2, m=2, seq=4096, recompute="none"),
    C("llama3-8b", tp=4, pp=2, dp=4, mb=1, m=2, seq=8192, recompute="none", stage=-1),
    C("llama3-70b", layers=8, tp=1, pp=2, dp=4, mb=1, m=4, seq=4096, recompute="none", stage=-1),
    C("llama3-8b", tp=8, pp=2, dp=4, mb=2, m=4, seq=4096, recompute="selective"),
    C("gpt-22b", layers=8, tp=2, pp=2, dp=4, mb=2, m=2, seq=2048, recompute="selective"),
    C("llama3-70b", layers=8, tp=2, pp=1, dp=4, mb=1, m=4, seq=4096, recompute="selective"),
    C("gpt-22b", layers=8, tp=2, pp=1, dp=4, mb=1, m=2, seq=4096, recompute="selective"),
    C("llama3-70b", layers=8, tp=4, pp=2, dp=16, mb=2, m=2, seq=8192, recompute="selective", stage=-1),
    C("gpt-22b", layers=8, tp=4, pp=1, dp=16, mb=2, m=2, seq=2048, recompute="selective"),
    C("llama3-8b", tp=4, pp=2, dp=16, mb=1, m=4, seq=8192, recompute="selective"),
    C("gpt-22b", layers=8, tp=8, pp=1, dp=4, mb=2, m=4, seq=4096, recompute="selective"),
    C("llama3-70b", layers=8, tp=8, pp=1, dp=16, mb=1, m=2, seq=8192, recompute="full"),
    C("llama3-8b", tp=2, pp=2, dp=16, mb=1, m=2, seq=8192, recompute="full", stage=-1),
    C("gpt-22b", layers=8, tp=4, pp=2, dp=16, mb=2, m=4, seq=8192, recompute="full", stage=-1),
    C("llama3-8b", tp=1, pp=2, dp=4, mb=2, m=4, seq=8192, recompute="full", stage=-1),
    C("llama3-8b", tp=8, pp=2, dp=4, mb=2, m=4, seq=4096, recompute="full"),
    C("llama3-70b", layers=8, tp=4, pp=1, dp=16, mb=2, m=4, seq=8192, recompute="full"),
    C("llama3-70b", layers=8, tp=1, pp=2, dp=4, mb=1, m=2, seq=8192, recompute="full"),
    C("llama3-70b", layers=8, tp=2, pp=1, dp=4, mb=2, m=2, seq=4096, recompute="full"),
]
FRESH5_OUT = REPO / "benchmarks" / "data" / "memory_measured_megatron-core_fresh5.toml"

#: --pipeline (issue 24 round 5): what a pipelined stage keeps per pass in flight, with deallocate_pipeline_outputs on
#: as Megatron-LM sets it -- interleaved stages of one or two layers per virtual stage (vp 2 and 4, where a per-pass
#: term is a large share), first and last stage, SP, full recompute, a GPT (LayerNorm, dropout) and the same cut under
#: plain 1F1B. Listed (and committed) before any is measured, after tuner.perfmodel.memory stopped charging a boundary
#: tensor per pass for Megatron-Core (95daa1c). Written to data/memory_measured_megatron-core_pipeline.toml.
PIPELINE = [
    C("llama3-8b", layers=8, tp=1, pp=4, vp=2, dp=1, mb=1, m=8, seq=4096, stage=0),
    C("llama3-8b", layers=8, tp=1, pp=4, vp=2, dp=1, mb=1, m=8, seq=4096, stage=-1),
    C("llama3-8b", layers=16, tp=1, pp=4, vp=4, dp=1, mb=1, m=8, seq=4096, stage=0),
    C("llama3-8b", layers=8, tp=2, pp=2, vp=2, dp=2, mb=1, m=4, seq=8192, stage=0),
    C("llama3-8b", layers=8, tp=1, pp=4, vp=2, dp=1, mb=1, m=8, seq=4096, recompute="full", stage=0),
    C("llama3-70b", layers=8, tp=8, pp=4, vp=2, dp=1, mb=1, m=8, seq=8192, stage=0),
    C("gpt-22b", layers=8, tp=2, pp=4, vp=2, dp=1, mb=1, m=8, seq=2048, stage=0),
    C("llama3-8b", layers=8, tp=1, pp=4, dp=1, mb=1, m=8, seq=4096, stage=0),
]
PIPELINE_OUT = REPO / "benchmarks" / "data" / "memory_measured_megatron-core_pipeline.toml"


def _rank_of(c):
    """Global rank of tp-rank 0, cp-rank 0, dp-rank 0 on the measured pipeline stage (order tp-cp-ep-dp-pp)."""
    return c["stage"] * c["tp"] * c["cp"] * c["dp"]
