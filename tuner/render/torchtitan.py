"""A torchtitan TOML job file from a layout. Pure: returns text, no I/O.

Section and key names are torchtitan's TOML job format, checked against pytorch/torchtitan at
238fa9953e4a (2026-02-23; torchtitan/config/job_config.py and torchtitan/models/llama3/train_configs/*.toml),
the last commit before torchtitan replaced TOML job files with Python configs (#2386, 9810191bbb03). Run it
with that torchtitan (or a release that reads TOML, e.g. v0.2.x):
`python -m torchtitan.train --job.config_file torchtitan.toml`. tests/test_launch_frameworks.py keeps the
keys (TORCHTITAN_KEYS, with the line of each) and fails on a key that is not in it.

Mapping: tp -> tensor_parallel_degree, cp -> context_parallel_degree, pp -> pipeline_parallel_degree, dp ->
data_parallel_shard_degree (FSDP2: parameters, gradients and optimizer states all sharded, i.e. ZeRO-3-like
whatever the layout's zero_stage; torchtitan's DDP, data_parallel_replicate_degree, refuses any other
parallelism: models/llama3/infra/parallelize.py line 151).
- sequence parallel: torchtitan's TP plan always shards the norms over the sequence (parallelize.py lines
  181, 219, 233: SequenceParallel()), so tp > 1 runs with it whatever the layout's sequence_parallel says
  (only less activation memory than without; the file says so in a comment);
- a named pipeline split (balanced, balanced-ends, light-last): parallelism.module_fqns_per_model_part, the
  modules of every stage (job_config.py line 367; torchtitan has no split points at 238fa9953e4a: that list
  replaced them), with the 1F1B or Interleaved1F1B schedule;
- virtual_pipeline > 1: pipeline_parallel_schedule "Interleaved1F1B" (Megatron's interleaved 1F1B) with
  pipeline_parallel_layers_per_stage = layers/(pp*vp) and the first/last stage "less layers" set to 0, so
  every virtual stage holds the same layers, as Megatron splits them (distributed/pipeline_parallel.py
  lines 66-76: embeddings and output otherwise count as one layer each, and 82 layers / 4 are not 20 stages);
- recompute: activation_checkpoint.mode none | selective | full; selective is torchtitan's per-op
  selective_ac_option "op" (it saves matmul and attention outputs and recomputes the rest): between none and
  full like Megatron's selective, but not Megatron's core-attention recompute; a layer period ("2") would be
  full recompute of every other layer instead;
- fp8: model.converters = ["quantize.linear.float8"] (the registered name, components/quantization/
  float8.py line 238; the toml comment's "float8" is not registered) and [quantize.linear.float8] as
  llama3_405b.toml sets it: tensorwise scaling, float8 FSDP all-gather with precomputed scales, the output
  layer left in bf16.
- fp8 also turns on torch.compile of the model and the loss ([compile] enable, components, job_config.py
  lines 722-725, as llama3_405b.toml does): float8 without compile is slower than bf16 (components/
  quantization/float8.py line 33 reads it);
- attention: the llama3 flavors' attn_type "sdpa" (model/args.py line 45; qwen3's too), PyTorch's
  scaled_dot_product_attention under sdpa_kernel([CUDNN_ATTENTION, FLASH_ATTENTION, MATH], set_priority=True)
  (models/attention.py ScaledDotProductAttentionWrapper): cuDNN's fused attention first; deepseek_v3's "671B" flex.
  Nothing is written for it (tuner.perfmodel.compute.attention_kernel charges that kernel);
- the launch's data: [training] dataset "c4" (torchtitan's streaming C4 loader, hf_datasets/text_datasets.py
  line 37: load_dataset(dataset_path, name="en", split="train")) with dataset_path, and [model] hf_assets_path
  the tokenizer directory (tokenizer_path is deprecated there); mock data is its test set "c4_test" (2K
  samples, line 42) and test tokenizer from the torchtitan checkout's tests/assets (the flavor keeps its
  128256 vocabulary, model/args.py line 33, whatever the tokenizer's);
- checkpoints: [checkpoint] enable, folder (under [job] dump_folder, components/checkpoint.py line 264),
  interval; torchtitan resumes from the folder's latest step.
- mixture of experts: parallelism.expert_parallel_degree and expert_tensor_parallel_degree (job_config.py
  lines 454, 464; torchtitan takes ep from dp_shard*cp*tp and runs etp 1 or tp, tuner.frameworks); with
  fp8 the experts' grouped GEMMs through the "quantize.grouped_mm.float8" converter (fqns ["experts"]) and
  the router gate left in bf16, as torchtitan/models/deepseek_v3/train_configs/deepseek_v3_671b.toml sets it.
torchtitan builds its model from a registered flavor, not from numbers in the file: only models whose
shape matches a flavor (and rope_theta, when the model sets it, the flavors' 500000) are rendered; any other
model is refused. fp16 is refused (torchtitan's
mixed_precision_param is bfloat16 or float32).
"""

from __future__ import annotations

from tuner.errors import UsageError
from tuner.layout import Layout, uneven_split
from tuner.pipeline_split import layout_chunks
from tuner.render.dsconfig import ADAM_PARAMS, GRADIENT_CLIPPING, check_batch
from tuner.specs import ModelSpec, Workload

# torchtitan/models/llama3/__init__.py at 238fa9953e4a: flavor -> (dim, n_layers, n_heads, n_kv_heads)
LLAMA3_FLAVORS = {"8B": (4096, 32, 32, 8), "70B": (8192, 80, 64, 8), "405B": (16384, 126, 128, 8)}
MIXED_PRECISION = {"bf16": "bfloat16"}
FLOAT8_CONVERTER = "quantize.linear.float8"
# MXFP8 (precision mxfp8): converters "quantize.linear.mx" and, for MoE experts, "quantize.grouped_mm.mx"
# (components/quantization/mx.py lines 171-172); MXLinear.recipe_name "mxfp8_cublas" (job_config.py line 777,
# its default: torch._scaled_mm's block-scaled GEMM), filter_fqns line 784; MXGroupedMM.fqns line 802.
MX_CONVERTER, GROUPED_MM_MX = "quantize.linear.mx", "quantize.grouped_mm.mx"
MX = {"recipe_name": "mxfp8_cublas", "filter_fqns": ["output"]}
FLOAT8 = {"enable_fsdp_float8_all_gather": True, "precompute_float8_dynamic_scale_for_fsdp": True,
          "filter_fqns": ["output"]}
SELECTIVE_AC_OPTION = "op"
ROPE_THETA = 500000            # every llama3 flavor's rope_theta
COMPILE = {"enable": True, "components": ["model", "loss"]}
DATASET, MOCK_DATASET = "c4", "c4_test"
SAVE_INTERVAL = 1000           # as tuner.render.megatron.SAVE_INTERVAL


# Mixture-of-experts flavors at 238fa9953e4a, by the ModelSpec values they fix: torchtitan/models/qwen3/
# __init__.py lines 145-167 ("30B-A3B": dim 2048, 48 layers, 32 heads, 4 kv heads, head_dim 128, qk_norm,
# moe_inter_dim 768, 128 experts, top_k 8, no shared expert, softmax, rope_theta 1e6) and torchtitan/models/
# deepseek_v3/__init__.py lines 130-157 ("671B": dim 7168, inter_dim 18432, moe_inter_dim 2048, 61 layers,
# 3 dense, 128 heads, 256 experts, 1 shared, top_k 8, 8 groups of which 4, sigmoid, route_scale 2.5, MLA
# q_lora 1536, kv_lora 512, qk 128 + rope 64, v 128). Its "235B-A22B" has rope_theta 5e6 (Qwen3-235B-A22B's
# own config: 1e6), so it is not Qwen3-235B-A22B; Mixtral has no torchtitan flavor.
MOE_FLAVORS = {
    ("qwen3", "30B-A3B"): {"hidden_size": 2048, "num_layers": 48, "num_attention_heads": 32, "num_query_groups": 4,
                           "head_dim": 128, "qk_layernorm": True, "moe_ffn_hidden_size": 768, "num_experts": 128,
                           "moe_top_k": 8, "num_shared_experts": 0, "moe_router_score_function": "softmax",
                           "rope_theta": 1000000.0},
    ("deepseek_v3", "671B"): {"hidden_size": 7168, "ffn_hidden_size": 18432, "moe_ffn_hidden_size": 2048,
                              "num_layers": 61, "moe_first_dense_layers": 3, "num_attention_heads": 128,
                              "num_experts": 256, "num_shared_experts": 1, "moe_top_k": 8, "moe_router_num_groups": 8,
                              "moe_router_group_topk": 4, "moe_router_score_function": "sigmoid",
                              "moe_router_topk_scaling_factor": 2.5, "multi_latent_attention": True,
                              "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_head_dim": 128,
                              "qk_pos_emb_head_dim": 64, "v_head_dim": 128},
}
GROUPED_MM_FLOAT8 = "quantize.grouped_mm.float8"     # components/quantization/float8.py line 239


def flavor(m: ModelSpec) -> tuple[str, str]:
    """(model name, flavor) of torchtitan's registered model with m's shape, or UsageError."""
    if m.is_moe:
        for key, fixed in MOE_FLAVORS.items():
            if all(getattr(m, k) == v for k, v in fixed.items()) and m.ffn_type == "swiglu":
                return key
    else:
        shape = (m.hidden_size, m.num_layers, m.num_attention_heads, m.num_query_groups)
        theta = getattr(m, "rope_theta", None)
        for name, s in LLAMA3_FLAVORS.items():
            if s == shape and m.ffn_type == "swiglu" and m.position_embedding == "rope" and theta in (None, ROPE_THETA):
                return "llama3", name
    known = ", ".join([f"llama3 {', '.join(LLAMA3_FLAVORS)}", *(" ".join(k) for k in MOE_FLAVORS)])
    raise UsageError(f"--framework torchtitan cannot describe model '{m.name}': torchtitan builds a registered "
                     f"model flavor and none ({known}) has its architecture; use --framework megatron-core"
                     + ("" if m.is_moe else " or megatron-deepspeed"))


def _toml(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return repr(value)


def parallelism(layout: Layout, m: ModelSpec) -> dict:
    """The [parallelism] table: degrees, and the pipeline's micro-batch and (interleaved) schedule."""
    table: dict = {"data_parallel_replicate_degree": 1, "data_parallel_shard_degree": layout.dp,
                   "tensor_parallel_degree": layout.tp, "pipeline_parallel_degree": layout.pp,
                   "context_parallel_degree": layout.context_parallel}
    if m.is_moe:     # Parallelism lines 454, 464: the experts over ep ranks (borrowed from dp*cp*tp), etp 1 or tp
        table.update({"expert_parallel_degree": layout.expert_parallel,
                      "expert_tensor_parallel_degree": layout.expert_tensor_parallel})
    if layout.pp > 1:
        table["pipeline_parallel_microbatch_size"] = layout.micro_batch
    if layout.pipeline_split != "auto":     # a named split: its stages' modules, as torchtitan names them
        table.update({"pipeline_parallel_schedule": "Interleaved1F1B" if layout.virtual_pipeline > 1 else "1F1B",
                      "module_fqns_per_model_part": module_fqns(layout_chunks(layout, m.num_layers))})
        return table
    uneven = uneven_split(layout, m.num_layers)
    if layout.virtual_pipeline > 1 or uneven:
        # the embedding- and loss-aware split: torchtitan counts the embedding and the output as one layer
        # each and takes them from the first and the last stage's share ("less layers" 1)
        table.update({"pipeline_parallel_schedule": "Interleaved1F1B" if layout.virtual_pipeline > 1 else "1F1B",
                      "pipeline_parallel_layers_per_stage": (m.num_layers + 2 * uneven)
                      // (layout.pp * layout.virtual_pipeline),
                      "pipeline_parallel_first_stage_less_layers": int(uneven),
                      "pipeline_parallel_last_stage_less_layers": int(uneven)})
    return table


def module_fqns(chunks: tuple[int, ...]) -> list[list[str]]:
    """parallelism.module_fqns_per_model_part (job_config.py line 367 at 238fa9953e4a) for the chunks' layers:
    the modules of each model part in stage order ("tok_embeddings" first, "norm" and "output" last, "layers.i"
    between: pipeline_parallel.py lines 311-333 name them so); pipeline_module_split gives rank r the parts
    r, r + pp, ... (the "loop" style, lines 448-461), Megatron's order."""
    parts, start = [], 0
    for c, k in enumerate(chunks):
        names = [f"layers.{i}" for i in range(start, start + k)]
        start += k
        parts.append((["tok_embeddings"] if c == 0 else []) + names + (["norm", "output"] if c == len(chunks) - 1 else []))
    return parts


def activation_checkpoint(layout: Layout) -> dict:
    if layout.recompute == "selective":
        return {"mode": "selective", "selective_ac_option": SELECTIVE_AC_OPTION}
    return {"mode": layout.recompute}


def data_keys(*, data_path: str | None, tokenizer: str | None, mock_data: bool = False,
              checkout: str | None = None) -> tuple[dict, dict]:
    """([training] keys, [model] keys) of the launch's data: a dataset in C4's format and its tokenizer's
    Hugging Face assets directory, or (mock data) torchtitan's c4_test and test tokenizer from its checkout
    (default ./torchtitan beside the files)."""
    tests = f"{(checkout or 'torchtitan').rstrip('/')}/tests/assets"
    if mock_data:
        return ({"dataset": MOCK_DATASET, "dataset_path": f"{tests}/c4_test"},
                {"hf_assets_path": tokenizer or f"{tests}/tokenizer"})
    if not tokenizer:
        raise UsageError("--framework torchtitan: --data-path needs --tokenizer DIR, the directory of the Hugging "
                         "Face tokenizer files (torchtitan's scripts/download_hf_assets.py writes one)")
    return {"dataset": DATASET, "dataset_path": str(data_path)}, {"hf_assets_path": tokenizer}


def job_sections(layout: Layout, workload: Workload, *, precision: str = "bf16", iterations: int = 10,
                 data: tuple[dict, dict] = ({}, {}), save_dir: str | None = None) -> dict[str, dict]:
    """{section: {key: value}} of the job file (a dotted section is a nested table). `data`: `data_keys`;
    `save_dir`: checkpoints on, in that folder. UsageError for fp16 or a model torchtitan has no flavor of."""
    if precision not in MIXED_PRECISION:
        raise UsageError(f"--framework torchtitan trains in bf16 only (mixed_precision_param bfloat16), got {precision}")
    check_batch(layout, workload)
    m, gb = workload.model, workload.global_batch
    name, flav = flavor(m)
    fp8, mx = workload.precision == "fp8", workload.precision == "mxfp8"
    # With PP, local_batch_size is the rank's batch per step, split into microbatches of the layout's size.
    local = gb // layout.dp if layout.pp > 1 else layout.micro_batch
    sections = {
        "job": {"dump_folder": "./outputs", "description": f"tuner launch: {m.name}, {layout.key()}"},
        "metrics": {"log_freq": 1},
        "model": {"name": name, "flavor": flav, **data[1],
                  **({"converters": [FLOAT8_CONVERTER, *([GROUPED_MM_FLOAT8] if m.is_moe else [])]} if fp8 else {}),
                  **({"converters": [MX_CONVERTER, *([GROUPED_MM_MX] if m.is_moe else [])]} if mx else {})},
        "optimizer": {"name": "AdamW", "lr": ADAM_PARAMS["lr"], "beta1": ADAM_PARAMS["betas"][0],
                      "beta2": ADAM_PARAMS["betas"][1], "eps": ADAM_PARAMS["eps"],
                      "weight_decay": ADAM_PARAMS["weight_decay"]},
        "training": {"local_batch_size": local, "global_batch_size": gb, "seq_len": m.seq_length,
                     "max_norm": GRADIENT_CLIPPING, "steps": iterations,
                     "mixed_precision_param": MIXED_PRECISION[precision], **data[0]},
        "parallelism": parallelism(layout, m),
        "activation_checkpoint": activation_checkpoint(layout),
    }
    if save_dir:
        sections["checkpoint"] = {"enable": True, "folder": save_dir, "interval": SAVE_INTERVAL}
    if mx:
        sections["compile"] = {**COMPILE, "components": list(COMPILE["components"])}
        sections[MX_CONVERTER] = {**MX, "filter_fqns": [*MX["filter_fqns"], *(["router.gate"] if m.is_moe else [])]}
        if m.is_moe:
            sections[GROUPED_MM_MX] = {"fqns": ["experts"]}
    if fp8:
        sections["compile"] = {**COMPILE, "components": list(COMPILE["components"])}
        sections["quantize.linear.float8"] = dict(FLOAT8)
        if m.is_moe:    # as deepseek_v3_671b.toml: the router stays bf16, the experts' grouped GEMMs run float8
            sections["quantize.linear.float8"]["filter_fqns"] = [*FLOAT8["filter_fqns"], "router.gate"]
            sections[GROUPED_MM_FLOAT8] = {"fqns": ["experts"]}
    return sections


def _comments(layout: Layout, workload: Workload, sections: dict[str, dict]) -> list[str]:
    """The header: what the file is and what torchtitan does differently from the layout."""
    lines = [f"# torchtitan job file written by `tuner launch --framework torchtitan` ({workload.nodes} x "
             f"{workload.cluster.name}, {workload.gpus} GPUs)",
             "# Format: torchtitan's TOML job config (job_config.py at 238fa9953e4a, before #2386).",
             "# dp is FSDP's data_parallel_shard_degree: parameters, gradients and optimizer states are all",
             "# sharded over it (ZeRO-3-like), whatever ZeRO stage the layout was measured with.",
             f"# global batch {workload.global_batch} = local batch x gradient accumulation x dp {layout.dp}"]
    if layout.tp > 1:
        was = "" if layout.sequence_parallel else "; the layout had it off"
        lines.append(f"# Sequence parallelism: on (torchtitan's TP always shards norms over the sequence{was}).")
    if layout.recompute == "selective":
        lines.append('# Selective recompute: torchtitan\'s per-op AC ("op"), not Megatron\'s core-attention recompute.')
    if layout.virtual_pipeline > 1:
        lines.append(f"# Interleaved pipeline: {layout.virtual_pipeline} stages per rank of equal layers, embedding "
                     "and output beside the first and last.")
    if "compile" in sections:
        lines.append("# float8 runs compiled (torch.compile of the model and the loss): without it, it is slower than bf16.")
    dataset = sections["training"].get("dataset")
    if dataset == MOCK_DATASET:
        lines.append("# Mock data: torchtitan's c4_test and test tokenizer, from its checkout's tests/assets.")
    elif dataset:
        lines.append('# Data: read as C4 (load_dataset(dataset_path, name="en", split="train", streaming=True), '
                     'its "text" field).')
    if "checkpoint" in sections:
        lines.append("# Checkpoints: in [job] dump_folder / [checkpoint] folder; a rerun resumes from the latest.")
    return lines


def render_job(layout: Layout, workload: Workload, *, precision: str = "bf16", iterations: int = 10,
               data: tuple[dict, dict] = ({}, {}), save_dir: str | None = None) -> str:
    """The TOML job file text (`data`, `save_dir`: see `job_sections`)."""
    sections = job_sections(layout, workload, precision=precision, iterations=iterations, data=data,
                            save_dir=save_dir)
    lines = _comments(layout, workload, sections)
    for section, keys in sections.items():
        lines += ["", f"[{section}]", *(f"{k} = {_toml(v)}" for k, v in keys.items())]
    return "\n".join(lines) + "\n"
