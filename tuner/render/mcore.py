"""Megatron-LM (Megatron-Core) `pretrain_gpt.py` arguments from a layout. Pure: no I/O, no torch.

No DeepSpeed config: Megatron-Core builds its own optimizer and data-parallel wrapper. ZeRO-1 maps to
Megatron-Core's distributed optimizer (`--use-distributed-optimizer`: optimizer states sharded over DP);
ZeRO-2 and ZeRO-3 to Megatron-FSDP (`--use-megatron-fsdp --data-parallel-sharding-strategy optim_grads` /
`optim_grads_params --ckpt-format fsdp_dtensor`, `fsdp_args`), without pipelining (tuner.frameworks), and
with CUDA_DEVICE_MAX_CONNECTIONS unset (`launch_env`), whatever the cluster's [slurm] env says.

The layout's dimensions:
- sequence_parallel: `--sequence-parallel`; context_parallel > 1: `--context-parallel-size N`;
- virtual_pipeline > 1: `--num-layers-per-virtual-pipeline-stage L/(pp*vp)` (arguments.py line 3114;
  `--virtual-pipeline-model-parallel-size` does not exist there: the field is excluded from the
  generated flags, arguments.py line 2308, and derived from this one at line 974);
- recompute full: `--recompute-granularity full --recompute-method uniform --recompute-num-layers 1`;
  selective: `--recompute-granularity selective` (Megatron's default module, core_attn: TC:560);
- precision fp8 (the workload's): `--fp8-format hybrid --fp8-amax-history-len 1024 --fp8-amax-compute-algo
  max` on top of --bf16/--fp16: Megatron-LM's published FP8 recipe, examples/llama/
  train_llama3_8b_h100_fp8.sh lines 108-110; the recipe is TE's default, delayed scaling (TC:594). With the
  distributed optimizer or Megatron-FSDP (zero_stage >= 1) also `--fp8-param-gather` (A:2016; A:1095-1097 refuse it
  without one of them), as that script (line 111) and NVIDIA's recipes run it (Megatron-Bridge's and NeMo 2's
  bf16_with_fp8_*_mixed set fp8_param_gather = True): the layers' weights are TE's FP8 / MXFP8 tensors alone, no bf16
  copy (tuner.frameworks Framework.quantized_params, which tuner.perfmodel.memory charges);
- the model's rope_theta (when set and not 10000): `--rotary-base` (arguments.py line 2418);
- the cluster's flash_attention: `--attention-backend flash` (TC:151, AttnBackend.flash, core/transformer/
  enums.py line 54): Transformer Engine's FlashAttention, the attention the model assumed; the default, auto,
  lets TE choose, and NVIDIA's Llama 3 recipe picks `fused` (cuDNN), as memory-lean;
- the launch's data (`data_args`): `--data-path` (line 3255) with `--split` (3266; line 668 warns without it)
  and `--tokenizer-type HuggingFaceTokenizer` (TR:698) `--tokenizer-model` (TR:714), or `--mock-data`
  (3302) with `--tokenizer-type NullTokenizer --vocab-size V` (TR:679; core/tokenizers NullTokenizer keeps V
  as its vocabulary), as examples/llama/train_llama3_8b_h100_fp8.sh lines 133-159 do; checkpoints as
  Megatron-DeepSpeed's (`--save` TR:395, `--save-interval` TR:398, `--load` TR:430).
Mixture of experts (`moe_args`, issue 20): `--num-experts` (A:3518), `--moe-router-topk` (TC:760),
`--moe-ffn-hidden-size` (TC:740), `--moe-shared-expert-intermediate-size` (TC:701, num_shared_experts x the
expert width), `--moe-layer-freq` (A:3520) as a list expression when some layers are dense ("([0]*3+[1]*58)"),
`--moe-expert-capacity-factor` (TC:917) for a capacity-bound router, the router's score function, groups,
scaling and expert bias (TC:808, 780, 796, 804, 816), its load balancing (A:3532, A:3536: "aux_loss" with
Megatron's recommended start 1e-2, or DeepSeek-V3's sequence-wise loss at its 1e-4 with the expert bias);
the token dispatcher the layout was predicted with, `--moe-token-dispatcher-type alltoall` or `flex` (TC:891;
the default is allgather) with `--moe-flex-dispatcher-backend deepep | hybridep` (TC:898) and
`--moe-router-dtype fp32` (TC:811), grouped expert GEMMs `--moe-grouped-gemm` (TC:850); the layout's `--expert-model-parallel-size`
(MPC:127) and `--expert-tensor-parallel-size` (MPC:130) always (tuner's etp defaults to 1, Megatron's to tp),
and `--overlap-moe-expert-parallel-comm` (MPC:343) with `--delay-wgrad-compute` (MPC:348; TC:3073-3077 asserts
the overlap with it; A:1903-1906: Transformer Engine, >= 2.8.0 with --overlap-grad-reduce) where the model
overlapped the all-to-all (tuner.frameworks ep_overlap; tuner.perfmodel.moe_exchange.exposed_alltoall: the schedule's
phases with the MLP's weight gradients run under the dispatch, as every NVIDIA config with the overlap sets them
together: Megatron-Bridge scripts/performance/utils/overrides.py lines 148-154 at v0.3.0). Attention beyond the shape: `--kv-channels` (TC:184) when head_dim is not
h / heads, `--qk-layernorm` (TC:259), and multi-latent attention `--multi-latent-attention` (TC:288) with
`--q-lora-rank` (A:3548), `--kv-lora-rank` (A:3550), `--qk-head-dim` (A:3552), `--qk-pos-emb-head-dim`
(A:3554), `--v-head-dim` (A:3556).
CPU activation offloading (offload_layers N > 0): `--cpu-offloading-num-layers N` alone (generated from
ModelParallelConfig.cpu_offloading_num_layers, model_parallel_config.py line 461; arguments.py line 1950 turns
cpu_offloading on for N > 0). `--cpu-offloading`, `--cpu-offloading-activations` and `--cpu-offloading-weights` do not
exist there (arguments.py lines 2320-2323 exclude those fields from the generated flags); their defaults offload the
activations and not the weights (model_parallel_config.py lines 471-474), what the model charges (tuner.offload).
`launch_env` then sets NVTE_CPU_OFFLOAD_V1=1: TransformerEngine 2.10 and later run a new offload schedule by default
and the one the model charges (AsyncDoubleBufferGroupOffloadHandler, tuner.perfmodel.offload) only with it
(transformer_engine/pytorch/cpu_offload.py lines 27 and 745 at v2.10); earlier releases have that one alone.
Tensor or context parallelism needs CUDA_DEVICE_MAX_CONNECTIONS=1 before Blackwell (arguments.py line
1477 asserts it): `launch_env` gives it to the sbatch script.

Every flag was checked against NVIDIA/Megatron-LM at d98e8a64ddf3 (2026-08-22): flags written literally in
megatron/training/arguments.py, or generated there by ArgumentGroupFactory (megatron/training/
argument_utils.py: `--` + field name with `_` -> `-`; a bool defaulting to True also gets `--disable-*`)
from a config dataclass field. tests/test_launch_frameworks.py keeps the list (MCORE_FLAGS, file:line of
each) and fails on a flag that is not in it.
"""

from __future__ import annotations

from tuner.errors import UsageError
from tuner.frameworks import of as framework_of
from tuner.layout import RECOMPUTE_MODULES, Layout, uneven_split
from tuner.pipeline_split import layout_chunks
from tuner.render import userbuffers
from tuner.render.megatron import PRECISIONS, SPLIT, rotary_base, run_args, shape_args
from tuner.specs import ModelSpec, Workload

# Full recompute of every layer (the old --checkpoint-activations).
RECOMPUTE_FULL = ("--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1")
# Selective: the attention core of every layer (--recompute-modules defaults to core_attn).
RECOMPUTE_SELECTIVE = ("--recompute-granularity", "selective")
# FP8 through Transformer Engine, as examples/llama/train_llama3_8b_h100_fp8.sh (and NeMo's
# bf16_with_fp8_mixed) run it: hybrid format (E4M3 forward, E5M2 gradients), delayed scaling over 1024 steps.
FP8 = ("--fp8-format", "hybrid", "--fp8-amax-history-len", "1024", "--fp8-amax-compute-algo", "max")
FLASH_ATTENTION = ("--attention-backend", "flash")
# Blackwell's block-scaled formats, as NVIDIA's Megatron-Bridge recipes set them (src/megatron/bridge/training/
# mixed_precision.py lines 255-266 bf16_with_mxfp8_mixed, 405-417 bf16_with_nvfp4_mixed @ 067f987df03b);
# TC:587 --fp8-format e4m3, TC:594 --fp8-recipe mxfp8, TC:674 --fp4-format e2m1, TC:679 --fp4-recipe nvfp4.
MXFP8 = ("--fp8-format", "e4m3", "--fp8-recipe", "mxfp8")
NVFP4 = ("--fp4-format", "e2m1", "--fp4-recipe", "nvfp4")
LOW_PRECISION = {"fp8": FP8, "mxfp8": MXFP8, "nvfp4": NVFP4}


#: Megatron-FSDP's sharding strategy per ZeRO stage (A:3190: no_shard | optim | optim_grads | optim_grads_params;
#: stage 1 stays the distributed optimizer, the same sharding of the optimizer states).
FSDP_SHARDING = {2: "optim_grads", 3: "optim_grads_params"}


def check_zero(layout: Layout) -> None:
    """UsageError (one line) for a ZeRO stage Megatron-Core cannot run as laid out: Megatron-FSDP (2, 3)
    only without pipelining (tuner.frameworks)."""
    if layout.zero_stage in FSDP_SHARDING and layout.pp > 1:
        raise UsageError(f"--framework megatron-core runs Megatron-FSDP (zero_stage {layout.zero_stage}) without "
                         f"pipelining only, got pp {layout.pp}; choose a layout with pp 1, or zero_stage 0 or 1")


def fsdp_args(layout: Layout) -> list[str]:
    """Megatron-FSDP for zero_stage 2 / 3: --use-megatron-fsdp (DistributedInitConfig.use_megatron_fsdp,
    config/common_config.py line 92, generated at A:3092) with its sharding strategy (A:3190) and the checkpoint
    format it asserts (A:1170; --ckpt-format, TR:486), as examples/megatron_fsdp/sbatch_mfsdp_deepseek_v3.sh
    lines 142-148 write them. --use-distributed-optimizer stays (Megatron-FSDP 1 needs it, A:1128)."""
    if layout.zero_stage not in FSDP_SHARDING:
        return []
    return ["--use-megatron-fsdp", "--data-parallel-sharding-strategy", FSDP_SHARDING[layout.zero_stage],
            "--ckpt-format", "fsdp_dtensor"]


def architecture_args(m: ModelSpec) -> list[str]:
    """The model's architecture beyond its shape: GQA, SwiGLU, RoPE, untied embeddings, RMSNorm, no biases."""
    args: list[str] = []
    if m.num_query_groups < m.num_attention_heads:
        args += ["--group-query-attention", "--num-query-groups", str(m.num_query_groups)]
    if m.ffn_type == "swiglu":
        args.append("--swiglu")
    if m.position_embedding == "rope":
        args += ["--position-embedding-type", "rope"]
    if not m.tie_embeddings:
        args.append("--untie-embeddings-and-output-weights")
    if m.normalization == "rmsnorm":
        args += ["--normalization", "RMSNorm"]
    if not m.add_bias_linear:
        args.append("--disable-bias-linear")
    if rotary_base(m):
        args += ["--rotary-base", str(rotary_base(m))]
    if m.head_dim != m.hidden_size // m.num_attention_heads and not m.multi_latent_attention:
        args += ["--kv-channels", str(m.head_dim)]
    if m.mtp_num_layers:                      # multi-token prediction on the last stage (TC:68)
        args += ["--mtp-num-layers", str(m.mtp_num_layers)]
    if m.qk_layernorm:
        args.append("--qk-layernorm")
    if m.multi_latent_attention:
        args += ["--multi-latent-attention", *(["--q-lora-rank", str(m.q_lora_rank)] if m.q_lora_rank else []),
                 "--kv-lora-rank", str(m.kv_lora_rank), "--qk-head-dim", str(m.qk_head_dim),
                 "--qk-pos-emb-head-dim", str(m.qk_pos_emb_head_dim), "--v-head-dim", str(m.v_head_dim)]
    return args


def moe_layer_freq(m: ModelSpec) -> str:
    """--moe-layer-freq: "1" (every layer) or the per-layer pattern as a list expression Megatron evaluates
    (moe_freq_type): "([0]*3+[1]*58)" for DeepSeek-V3, the explicit list otherwise."""
    pattern = [int(x) for x in m.moe_layer_pattern]
    if all(pattern):
        return "1"
    first = m.moe_first_dense_layers
    if m.moe_layer_freq == 1:
        return f"([0]*{first}+[1]*{m.num_layers - first})"
    return "[" + ",".join(map(str, pattern)) + "]"


#: Adam's two moments in bf16 (--optimizer-moments bf16): Megatron-LM arguments.py lines 3667, 3675, 3680 at
#: d98e8a64dd (the main parameters keep their fp32 default, line 3673), as Megatron-Bridge's DeepSeek-V3 H100
#: recipe sets them (src/megatron/bridge/recipes/deepseek/h100/deepseek_v3.py lines 221-225 @ 067f987df).
PRECISION_AWARE_BF16 = ("--use-precision-aware-optimizer", "--exp-avg-dtype", "bf16", "--exp-avg-sq-dtype", "bf16")


def dispatcher_args(layout: Layout, workload: Workload) -> list[str]:
    """The token dispatcher the layout was predicted with (tuner.perfmodel.moe_exchange dispatcher_for): alltoall, or
    flex with its backend (DeepEP; HybridEP across the trays of an NVL72 rack) and the fp32 router
    probabilities both backends take (token_dispatcher.py lines 1135-1139 and 1312-1316 at d98e8a64dd: "please
    set --moe-router-dtype=fp32")."""
    from tuner.perfmodel.compute import shape_of
    from tuner.perfmodel.moe_exchange import dispatcher_for, flex_backend
    sh = shape_of(layout, workload)
    if dispatcher_for(workload.model, workload.cluster, sh, workload.framework) != "flex":
        return ["--moe-token-dispatcher-type", "alltoall"]
    return ["--moe-token-dispatcher-type", "flex", "--moe-flex-dispatcher-backend", flex_backend(workload.cluster, sh),
            "--moe-router-dtype", "fp32"]


def moe_args(layout: Layout, workload: Workload) -> list[str]:
    """The MoE layers and the layout's expert parallelism (nothing for a dense model)."""
    m = workload.model
    if not m.is_moe:
        return []
    args = ["--num-experts", str(m.num_experts), "--moe-router-topk", str(m.moe_top_k),
            "--moe-ffn-hidden-size", str(m.moe_ffn_hidden_size), "--moe-layer-freq", moe_layer_freq(m),
            *dispatcher_args(layout, workload), "--moe-grouped-gemm",
            "--expert-model-parallel-size", str(layout.expert_parallel),
            "--expert-tensor-parallel-size", str(layout.expert_tensor_parallel)]
    if m.num_shared_experts:
        args += ["--moe-shared-expert-intermediate-size", str(m.shared_expert_width)]
    if m.moe_capacity_factor:
        args += ["--moe-expert-capacity-factor", f"{m.moe_capacity_factor:g}"]
    if m.moe_router_score_function != "softmax":
        args += ["--moe-router-score-function", m.moe_router_score_function]
    if m.moe_router_num_groups:
        args += ["--moe-router-num-groups", str(m.moe_router_num_groups),
                 "--moe-router-group-topk", str(m.moe_router_group_topk)]
    if m.moe_router_topk_scaling_factor:
        args += ["--moe-router-topk-scaling-factor", f"{m.moe_router_topk_scaling_factor:g}"]
    if m.moe_router_expert_bias:      # DeepSeek-V3: aux-loss-free balancing plus a small sequence-wise loss
        args += ["--moe-router-enable-expert-bias", "--moe-router-load-balancing-type", "seq_aux_loss",
                 "--moe-aux-loss-coeff", "1e-4"]
    else:
        args += ["--moe-router-load-balancing-type", "aux_loss", "--moe-aux-loss-coeff", "1e-2"]
    if framework_of(workload).ep_overlap(layout, workload.model):
        args += ["--overlap-moe-expert-parallel-comm", "--delay-wgrad-compute"]
    return args


def data_args(m: ModelSpec, *, data_path: str | None, tokenizer: str | None, mock_data: bool = False) -> list[str]:
    """The dataset and its Hugging Face tokenizer, or Megatron-LM's mock data (random tokens: a throughput
    run) with the null tokenizer of the model's vocabulary (or the tokenizer given)."""
    hf = ["--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", tokenizer] if tokenizer else []
    if mock_data:
        return ["--mock-data", *(hf or ["--tokenizer-type", "NullTokenizer", "--vocab-size", str(m.vocab_size)])]
    if not hf:
        raise UsageError("--framework megatron-core: --data-path needs --tokenizer NAME_OR_PATH, the Hugging Face "
                         "tokenizer the data was preprocessed with")
    return ["--data-path", str(data_path), "--split", SPLIT, *hf]


def pipeline_layout(chunks: tuple[int, ...], mtp: int = 0) -> str:
    """Megatron-Core's --pipeline-model-parallel-layout for the chunks' layers (chunk order: virtual stage
    major, pipeline rank minor, as TC:111 reads it): E before the first, L after the last, runs of equal
    middle chunks as "(t*4|)*14" (pipeline_parallel_layer_layout.py line 283, parse_str_to_list, unrolls
    "(...)*n" then "x*n"): 4 | 4 x 14 | 1 is "Et*4|(t*4|)*14tL", DeepSeek-V3's pp 8 x vp 4 "Et|(t*2|)*30L"; `mtp`
    multi-token prediction modules go before L on the last chunk, where the layout must place them (line 112:
    "Number of mtp layers in layout must match mtp_num_layers"): "Et|(t*2|)*30mL", Megatron-Bridge's."""
    def t(k: int) -> str:
        return "" if k == 0 else "t" if k == 1 else f"t*{k}"
    end = "m" * mtp + "L"
    if len(chunks) == 1:
        return f"E{t(chunks[0])}{end}"
    out, middle = [f"E{t(chunks[0])}|"], list(chunks[1:-1])
    while middle:
        k = next((i for i, c in enumerate(middle) if c != middle[0]), len(middle))
        out.append(f"({t(middle[0])}|)*{k}" if k > 1 else f"{t(middle[0])}|")
        middle = middle[k:]
    return "".join(out) + f"{t(chunks[-1])}{end}"


def split_args(layout: Layout, m: ModelSpec) -> list[str]:
    """How the layers are cut: equal stages need nothing (and --num-layers-per-virtual-pipeline-stage when
    interleaved); Megatron-Core's embedding- and loss-aware split its two --account-for flags; a named
    split without interleaving whose middle stages are equal --decoder-first-pipeline-num-layers and
    --decoder-last-pipeline-num-layers (A:3095, A:3099; TC:2296 checks the middle), any other its
    --pipeline-model-parallel-layout (A:3103; the virtual stages follow from it, A:944, so no per-stage flag:
    A:931 allows one of them)."""
    n, L = layout.pp * layout.virtual_pipeline, m.num_layers
    if layout.pipeline_split == "auto":
        uneven = uneven_split(layout, L)
        args = ["--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split"] if uneven else []
        if layout.virtual_pipeline > 1:
            args += ["--num-layers-per-virtual-pipeline-stage", str((L + 2 * uneven) // n)]
        return args
    chunks = layout_chunks(layout, L)
    if layout.virtual_pipeline == 1 and layout.pp > 2 and min(chunks[0], chunks[-1]) > 0 and len(set(chunks[1:-1])) == 1:
        return ["--decoder-first-pipeline-num-layers", str(chunks[0]),
                "--decoder-last-pipeline-num-layers", str(chunks[-1])]
    return ["--pipeline-model-parallel-layout", pipeline_layout(chunks, m.mtp_num_layers)]


def parallel_args(layout: Layout, m: ModelSpec) -> list[str]:
    """Sequence, context and interleaved (virtual) pipeline parallelism, each only when the layout uses it,
    and how the layers are cut into the stages (split_args)."""
    args: list[str] = []
    if layout.sequence_parallel:
        args.append("--sequence-parallel")
    if layout.context_parallel > 1:
        args += ["--context-parallel-size", str(layout.context_parallel)]
    return args + split_args(layout, m)


def overlap_args(layout: Layout, workload: Workload) -> list[str]:
    """The communication overlaps the model assumes for Megatron-Core (tuner.frameworks: its DP
    gradient reduce and parameter gather; TP collectives under the GEMMs with sequence parallelism; p2p
    overlap is Megatron-LM's default): the launch files run what was predicted."""
    if "dp" not in framework_of(workload).overlaps:
        return []
    args = ["--overlap-grad-reduce"]
    if workload.ddp_bucket_size:        # the bucket size the model charged (Megatron-LM @ d98e8a64dd arguments.py:3125)
        args += ["--ddp-bucket-size", str(workload.ddp_bucket_size)]
    if layout.zero_stage >= 1:
        args.append("--overlap-param-gather")
    if tp_comm_overlap(layout, workload):
        args.append("--tp-comm-overlap")
        if userbuffers.table_for(workload) is not None:     # the settings the model charged, not TE's defaults
            args += [userbuffers.FLAG, userbuffers.FILE]
    return args


def tp_comm_overlap(layout: Layout, workload: Workload) -> bool:
    """Whether the launch runs --tp-comm-overlap: Megatron-Core's overlaps, with sequence parallelism, on CUDA (off on
    ROCm, as tuner.perfmodel.stages charges it)."""
    return ("dp" in framework_of(workload).overlaps and layout.sequence_parallel
            and workload.cluster.software == "cuda")


def userbuffers_files(layout: Layout, workload: Workload) -> dict[str, str]:
    """{userbuffers.FILE: the TP-overlap settings the model charged} where the launch passes it (overlap_args), else
    {}: tuner.render.userbuffers."""
    return userbuffers.files(workload, userbuffers.table_for(workload) if tp_comm_overlap(layout, workload) else None)


def recompute_args(layout: Layout) -> list[str]:
    """Full and selective as before; a named module set as `--recompute-granularity selective --recompute-modules
    M ...` (TC:532, TC:560: a list flag, as Megatron-MoE-ModelZoo's DeepSeek-V3 guide writes `--recompute-modules
    moe_act mlp`; Megatron-Core's own names, tuner.layout.RECOMPUTE_MODULES)."""
    if layout.recompute in ("none", "full", "selective"):
        return list({"full": RECOMPUTE_FULL, "selective": RECOMPUTE_SELECTIVE}.get(layout.recompute, ()))
    return [*RECOMPUTE_SELECTIVE, "--recompute-modules", *RECOMPUTE_MODULES[layout.recompute]]


def launch_env(layout: Layout, workload: Workload | None = None) -> dict[str, str | None]:
    """Variables the sbatch script exports (None: it unsets them, tuner.render.sbatch): Megatron-LM asserts
    CUDA_DEVICE_MAX_CONNECTIONS=1 with tp or cp > 1 (before Blackwell; harmless after), except with Megatron-FSDP,
    which asserts the opposite at any tp and cp (A:1166-1167, inside `if args.use_megatron_fsdp`, A:1118: "FSDP
    requires CUDA_DEVICE_MAX_CONNECTIONS > 1 or unset"; with tp or cp it only warns, A:1456): unset, as Megatron-LM's
    own Megatron-FSDP scripts do (examples/megatron_fsdp/train_llama3_8b_fsdp_h100_fp8.sh line 113,
    sbatch_mfsdp_deepseek_v3.sh line 139), so neither a [slurm] env table that sets 1 (Frontier's, the
    Megatron-DeepSpeed study's setting) nor the submitting shell (sbatch passes its environment on) stops the run at
    start-up; and except with
    --overlap-moe-expert-parallel-comm, whose streams one connection would serialise: Megatron-LM then only
    warns (A:1466-1474 at d98e8a64dd: "set CUDA_DEVICE_MAX_CONNECTIONS to 1 or 32, which depends on which
    parallelization you want to prioritize"), and NVIDIA's performance scripts, whose runs tuner's MoE overlap
    is checked against, set 8 with the alltoall dispatcher tuner writes (Megatron-Bridge 067f987df,
    scripts/performance/utils/overrides.py lines 256-263: 1 only "(tp_size > 1 or cp_size > 1) and not
    moe_a2a_overlap")."""
    offload = {"NVTE_CPU_OFFLOAD_V1": "1"} if layout.offload_layers else {}     # the schedule the model charges
    if layout.zero_stage in FSDP_SHARDING:
        return {"CUDA_DEVICE_MAX_CONNECTIONS": None, **offload}
    if workload is not None and framework_of(workload).ep_overlap(layout, workload.model):
        return {"CUDA_DEVICE_MAX_CONNECTIONS": "8", **offload}
    return {**({"CUDA_DEVICE_MAX_CONNECTIONS": "1"} if layout.tp > 1 or layout.context_parallel > 1 else {}), **offload}


def pretrain_args(layout: Layout, workload: Workload, *, precision: str = "bf16", iterations: int = 10,
                  extra: tuple[str, ...] | list[str] = ()) -> list[str]:
    """The argv (after Megatron-LM's `pretrain_gpt.py`). `precision` is the training dtype (bf16/fp16);
    the workload's precision fp8 adds FP8 on top. `extra` (data paths, tokenizer) is appended.
    UsageError for zero_stage 2/3; ValueError for a precision other than fp16/bf16."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    check_zero(layout)
    args = [*shape_args(layout, workload), *parallel_args(layout, workload.model),
            *architecture_args(workload.model), *moe_args(layout, workload),
            *run_args(layout, workload, iterations, precision), *overlap_args(layout, workload)]
    if workload.cluster.flash_attention:
        args += list(FLASH_ATTENTION)     # the attention the model assumed (no score matrix kept)
    args += list(LOW_PRECISION.get(workload.precision, ()))
    if layout.zero_stage >= 1:
        args.append("--use-distributed-optimizer")
    if framework_of(workload).quantized_params(layout, workload):    # the weights as the memory model holds them
        args.append("--fp8-param-gather")
    args += fsdp_args(layout)
    if workload.gradient_dtype == "bf16" and workload.grad_reduce and precision == "bf16":   # 2-byte grads, as counted
        args.append("--grad-reduce-in-bf16")
    if workload.optimizer_moments == "bf16":      # Adam's moments in bf16, as counted (NVIDIA's DeepSeek-V3 recipe)
        args += list(PRECISION_AWARE_BF16)
    args += recompute_args(layout)
    if layout.offload_layers:       # activations only: cpu_offloading_activations defaults True, _weights False
        args += ["--cpu-offloading-num-layers", str(layout.offload_layers)]
    return args + [str(a) for a in extra]
