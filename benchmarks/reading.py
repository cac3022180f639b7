"""How every accuracy benchmark reads a row: the model, the machine, the workload and the layout it ran, and what its
recipe ran where the table leaves it unstated (issue 24: one reading, so that two benchmarks never predict one row
two ways).

Read by framework_accuracy, hardware_accuracy and memory_accuracy (and, through them, scaling_accuracy and
moe_accuracy's model_of). A row is predicted as it ran:
- its framework (llm-foundry's "fsdp" predicted as torchtitan, the FSDP stack tuner has);
- its model: a preset at the row's sequence (with the shape keys a row overrides: BigScience's heads and
  widths, a layer count), a `shape_name` row's own ModelSpec (published.custom_model), or a `model = "custom"`
  row's shape on a preset of its kind (the Grok-1 and MoE rows); a stated `moe_capacity_factor`;
- its machine (`machine` where the row states the one it ran on), with a measurement's attention kernel and a
  measured rank of fewer GPUs than a node;
- its layout, with the `ran_*` keys where a recipe read from source says what ran and the table did not
  (`ran_recompute`, `ran_sequence_parallel`), its pipeline split and experts, and Megatron-Core's CPU activation
  offloading (`ran_offload_layers`: the layout's offload_layers, which the model charges in memory and time);
- its memory as it ran (`peak_as_ran`, `memory_as_ran`): the predicted peak with what the recipe changes that tuner
  does not choose -- llm-foundry's MPT under Composer's FSDP1, apex's bf16 optimizer state (`optimizer_state =
  "bf16"`) and FP8 weights held otherwise than tuner's
  launch holds them (`ran_fp8_params`), torchtitan @ 613bfd0cf's fused RMSNorm and fp32 logits (`ran_norm`,
  `ran_fp32_logits`) -- and the p_fit tuner states for
  it (the framework's bias and spread, as tuner.perfmodel.memory_fit states them);
- its speed as it ran (benchmarks/speed_as_ran.py, whose names this module hands on): the framework overlaps its config
  turned off (`tp_comm_overlap`, `overlap_grad_reduce` false) and the bytes its parameter all-gather moved
  (`ran_fp8_params`), both `exchange_as_ran`, and a step's seconds beyond tuner's
  where the run's launch did more than tuner's would (`qk_norm_gather_s`: torchtitan's Qwen3 TP plan before its fix
  gathered q and k per layer, `ran_qk_norm`; `attention_kernel_s`: FlashAttention-2 where tuner runs the fused
  attention, `ran_attention`).
The split key (benchmarks/published.split_key) reads the table's keys only: a `ran_*` key never moves a row.
"""

from __future__ import annotations

import dataclasses

import published
from tuner.layout import Layout, micro_batches_per_pipeline, recompute_modules, stage_candidates
from tuner.perfmodel import breakdown_fit, memory
from tuner.specs import load_cluster, load_model, make_workload
from speed_as_ran import (ATTENTION_READINGS, QK_NORM_READINGS, attention_kernel_s, exchange_as_ran,  # noqa: F401
                          overlaps_off, qk_norm_gather_s, tps_as_ran)

PREDICTED_AS = {"fsdp": "torchtitan"}
#: a model = "custom" row's shape keys (ModelSpec's names but moe_router_topk)
SHAPE = ("num_layers", "hidden_size", "num_attention_heads", "num_query_groups", "ffn_hidden_size", "vocab_size",
         "num_experts", "moe_ffn_hidden_size", "num_shared_experts", "moe_layer_freq")
RENAMED = {"moe_router_topk": "moe_top_k"}
#: a preset row's shape keys that override its preset (BigScience's layout search of BLOOM-176B varied the heads;
#: a measurement of fewer layers)
SHAPE_OVERRIDES = ("num_layers", "hidden_size", "num_attention_heads")


def framework_of(row: dict) -> str:
    return PREDICTED_AS.get(row["framework"], row["framework"])


def model_of(row: dict):
    """The row's model at its sequence (see the module's docstring)."""
    if "shape_name" in row:
        m = published.custom_model(row)
    elif row.get("model", "custom") == "custom":
        m = load_model("llama3-8b" if row.get("ffn_type", "swiglu") == "swiglu" else "gpt-22b")
        m = dataclasses.replace(m, name="custom", **{k: row[k] for k in SHAPE if k in row},
                                **{RENAMED[k]: row[k] for k in RENAMED if k in row})
    else:
        m = load_model(row["model"])
        shape = {k: row[k] for k in SHAPE_OVERRIDES if k in row and row[k] != getattr(m, k)}
        if set(shape) - {"num_layers"}:   # heads of hidden / heads width (Megatron's default --kv-channels)
            heads = shape.get("num_attention_heads", m.num_attention_heads)
            shape.update(num_query_groups=shape.get("num_attention_heads", m.num_query_groups),
                         head_dim=shape.get("hidden_size", m.hidden_size) // heads)
        m = dataclasses.replace(m, **shape) if shape else m
    if m.seq_length != row["seq_length"]:
        m = dataclasses.replace(m, seq_length=row["seq_length"])
    if row.get("moe_capacity_factor"):      # a row that states its token dropping
        m = dataclasses.replace(m, moe_capacity_factor=row["moe_capacity_factor"])
    if row.get("mtp_num_layers"):           # a run that trained multi-token prediction (DeepSeek-V3's recipes)
        m = dataclasses.replace(m, mtp_num_layers=row["mtp_num_layers"])
    return m


def cluster_of(row: dict):
    """The machine it ran on: `machine` where stated, else `cluster`; a measurement's attention kernel (Megatron's
    local one keeps the scores); a measured rank of fewer GPUs than a node runs on a node of that many."""
    cluster = load_cluster(row.get("machine", row.get("cluster", "h100")))
    if "attention" in row:
        cluster = dataclasses.replace(cluster, flash_attention=not row["attention"].startswith("local"))
    if row["gpus"] % cluster.gpus_per_node:
        cluster = dataclasses.replace(cluster, gpus_per_node=row["gpus"])
    return cluster


def workload_of(row: dict):
    """The workload as it ran (make_workload's UsageError where the machine refuses its precision): `ran_global_batch`
    where the table leaves the batch unstated and the recipe that ran states it; `optimizer_moments` where a run kept
    Adam's moments otherwise than in fp32; `ran_bucket_size` where a Megatron-Core run's config set its gradient
    buckets' size (BUCKET_SIZE -> --ddp-bucket-size, elements), not Megatron-Core's default that tuner launch leaves."""
    fw, cluster = framework_of(row), cluster_of(row)
    return make_workload(model_of(row), row["gpus"] // cluster.gpus_per_node, cluster,
                         row.get("ran_global_batch", row["global_batch"]),
                         precision=row.get("precision", "bf16"), framework=fw,
                         grad_reduce=published.grad_reduce(row) if fw == "megatron-core" else None,
                         optimizer_moments=row.get("optimizer_moments"), ddp_bucket_size=row.get("ran_bucket_size", 0))


def layout_of(row: dict, framework: str | None = None) -> Layout:
    """The layout it ran: sequence parallelism unstated (or torchtitan's, whose TP always shards the sequence) is
    tp > 1; recompute unstated is none; torchtitan shards everything (ZeRO 3); `ran_*` keys say what a recipe ran
    (`ran_pp`, `ran_vp`, `ran_micro_batch`: where a table's cells disagree with the recipe at the row's tag and the
    recipe is what ran)."""
    fw = framework or framework_of(row)
    tp, cp, pp = row["tp"], row["cp"], row.get("ran_pp", row["pp"])
    sp = row.get("ran_sequence_parallel", row.get("sequence_parallel", "unstated"))
    sp = tp > 1 if sp == "unstated" or fw == "torchtitan" else sp
    rc = row.get("ran_recompute", "none" if row.get("recompute", "unstated") == "unstated" else row["recompute"])
    ep = row.get("ep", 1)
    etp = row.get("etp", tp if fw == "torchtitan" and ep == 1 and row.get("num_experts") else 1)
    mb = row.get("ran_micro_batch", row["micro_batch"])
    return Layout(tp=tp, pp=pp, dp=row["gpus"] // (tp * cp * pp), micro_batch=mb,
                  zero_stage=3 if fw == "torchtitan" else published.zero_stage(row), recompute=rc,
                  sequence_parallel=sp, context_parallel=cp, virtual_pipeline=row.get("ran_vp", row.get("vp", 1)),
                  expert_parallel=ep, expert_tensor_parallel=etp or 1,
                  pipeline_split=row.get("pipeline_split", "auto"), offload_layers=row.get("ran_offload_layers", 0))


# ------------------------------------------------------------------------------------------ memory as it ran
#: What llm-foundry's MPT block keeps for backward per s*b*h element (bf16 under Composer's FSDP "PURE" mixed precision
#: and amp_bf16, eager; mosaicml/llm-foundry @ 5e85bd62d4, the commit of the benchmark tables, with
#: scripts/train/benchmarking/submit_benchmarks.py's norm_type low_precision_layernorm and attn_impl flash): each
#: LPLayerNorm's bf16 input (F.layer_norm with autocast off, llmfoundry/models/layers/norm.py) and its output kept
#: by the next linear (2 x (2 + 2)); flash_attn_fn's unpadded copies of q, k, v (bert_padding.unpad_input's
#: index_select: 2 + 4kv/h) kept by flash_attn_varlen_func with its output (2), and pad_input's output kept by
#: out_proj (2); MPTMLP's up_proj output kept by GELU (2f/h) and GELU's output kept by down_proj (2f/h). No dropout
#: (p = 0 returns its input), no RoPE. The fp32 log-sum-exp and the norms' statistics are per token: left out. FP8 rows
#: ran TransformerEngine's Linear (submit_benchmarks.py @ 8c8dd48f72: fc_type 'te' for fp8 on H100), which saves its
#: input cast to FP8: the four linears' inputs (both norms' outputs, out_proj's, down_proj's) at 1 byte, not 2.
def mpt_layer_bytes(model, fp8: bool = False) -> float:
    f, kv = model.ffn_hidden_size / model.hidden_size, model.kv_size / model.hidden_size
    linear_inputs = (1.0 if fp8 else 2.0) * (3.0 + f)
    return 4.0 + 2.0 + 4.0 * kv + 2.0 + 2.0 * f + linear_inputs


def llm_foundry_breakdown(lay: Layout, w, mem: dict) -> dict:
    """MPT under Composer's FSDP1 (FULL_SHARD, mixed precision PURE: bf16 parameters gathered, bf16 gradients
    reduced, composer/trainer/mosaic_fsdp.py get_mixed_precision) as llm-foundry's benchmark tables ran it. The
    model states are FSDP2's (sharded fp32 parameters, fp32 gradients cast back to the parameter's dtype, Adam:
    16/d). The peak is the larger of two phases over every layer's kept activations (mpt_layer_bytes, or the block
    input under activation checkpointing):
    - the loss: flash-attn's fused cross entropy (llm-foundry's default loss_fn 'fused_crossentropy',
      flash_attn/ops/triton/cross_entropy.py) keeps the bf16 logits and its backward allocates bf16 dlogits
      (inplace_backward False): 4 bytes per s*b*V element; the final LPLayerNorm's input and output (4 per s*b*h);
    - a block's backward: its recomputed activations less its input, and FSDP1's unit buffers (the unit's and
      the prefetched unit's gathered bf16 parameters, the unit's unsharded bf16 gradient: 6 bytes per parameter).
    Both hold the root unit's gathered bf16 parameters (the tied embedding and the position table: FSDP1 does not
    reshard the root after forward)."""
    m = w.model
    sh = lay.micro_batch * m.seq_length
    sbh, logits = sh * m.hidden_size, sh * m.vocab_size
    full = mpt_layer_bytes(m, w.precision == "fp8") * sbh
    kept = m.num_layers * (2.0 * sbh if lay.recompute == "full" else full)
    root = 2.0 * (memory.embedding_params(m, 1) + (m.seq_length * m.hidden_size
                                                   if m.position_embedding == "learned" else 0.0))
    loss = (kept + 4.0 * sbh, 4.0 * logits, root)
    layer = (kept + (full - 2.0 * sbh if lay.recompute == "full" else 0.0), 0.0,
             root + 6.0 * memory.max_layer_params(m, lay))
    act, out_logits, buffers = max(loss, layer, key=sum)
    out = dict(mem)
    out["activations"], out["logits"], out["zero3_buffers"] = act / 1e9, out_logits / 1e9, buffers / 1e9
    return out


#: torchtitan's first public version (pytorch/torchtitan @ 613bfd0cf, the commit of docs/performance.md's first table) ran
#: what tuner's torchtitan account (torchtitan 0.3.0 on torch 2.13, measured over fake tensors) does not:
#: - `ran_norm = "fused_rmsnorm"` (train_configs/llama_13b.toml: norm_type): torchtitan/models/norms.py's
#:   TritonFusedRMSNorm saves the bf16 input, the weight and an fp32 rstd per row (ctx.save_for_backward(x, weight,
#:   rstd)): 2 bytes per s*b*h element, where torch 2.13's nn.RMSNorm decomposition, which the account's eager bytes
#:   hold, saves the fp32 upcast input and the fp32 normalised input, 4 + 4 (memory_loss.FINAL_NORM_SAVED; checked with
#:   saved_tensors_hooks). The norm's bf16 output is kept by the next linear either way. 6 bytes less per norm: two
#:   per layer, whose activations a layer keeps only without recompute, and the final norm before the loss;
#: - `ran_fp32_logits = true` (models/llama/model.py line 436: `output = self.output(h).float()`; train.py: `pred =
#:   model(input_ids); loss = loss_fn(pred, labels); loss.backward()`, no `del pred`): the fp32 logits stay alive
#:   through the loss's backward, 4 bytes per s*b*V/t element beside the loss's own (memory_loss.loss_phase's
#:   un-chunked account has the bf16 logits freed).
FUSED_NORM_SAVED_LESS = 8.0 - 2.0


def torchtitan_613bfd0(row: dict, lay: Layout, w, out: dict) -> dict:
    """The breakdown (memory.peak_memory's, the loss phase or a layer's backward) with what torchtitan @ 613bfd0cf ran
    (see FUSED_NORM_SAVED_LESS): the layers' norms (recompute none) in both phases, the final norm and the fp32 logits
    in the loss phase (`logits` > 0), which only grows, so the phase stays the peak."""
    m, out = w.model, dict(out)
    if lay.pp != 1:
        raise ValueError(f"{row['source']}: torchtitan @ 613bfd0cf had no pipeline parallelism")
    sh = m.seq_length * lay.micro_batch * m.hidden_size / (lay.tp if lay.sequence_parallel else 1)
    if row.get("ran_norm") == "fused_rmsnorm":
        if lay.recompute == "none":
            out["activations"] -= 2 * FUSED_NORM_SAVED_LESS * sh * m.num_layers / 1e9
        if out["logits"] > 0:
            out["logits"] -= FUSED_NORM_SAVED_LESS * sh / 1e9
    if row.get("ran_fp32_logits") and out["logits"] > 0:
        out["logits"] += 4.0 * m.seq_length * lay.micro_batch * m.vocab_size / lay.tp / 1e9
    return out


def ran_breakdown(row: dict, lay: Layout, w, mem: dict) -> dict:
    """The worst stage's breakdown (tuner.perfmodel.memory.peak_memory) with what the row's recipe ran that tuner
    does not choose:
    - llm-foundry's rows (framework "fsdp", predicted as torchtitan): MPT under Composer's FSDP1
      (llm_foundry_breakdown) in place of torchtitan's activations, loss and FSDP2 buffers;
    - `optimizer_state = "bf16"`: apex's DistributedFusedAdam in bf16 (NeMo's distributed_fused_adam): its parameter
      shard and both moments in `dtype` (apex/contrib/optimizers/distributed_fused_adam.py, StateBucket), 6 bytes per
      parameter over dp*cp where tuner predicts Megatron-Core's 12 (fp32 main parameters and moments);
    - `ran_norm` / `ran_fp32_logits`: torchtitan @ 613bfd0cf's fused RMSNorm and fp32 logits (torchtitan_613bfd0)."""
    out = llm_foundry_breakdown(lay, w, mem) if row["framework"] == "fsdp" else dict(mem)
    if row.get("ran_norm") or row.get("ran_fp32_logits"):
        out = torchtitan_613bfd0(row, lay, w, out)
    if row.get("optimizer_state") == "bf16":
        out["optimizer"] = mem["optimizer"] - (12.0 - 6.0) * mem["params_billion"] / (lay.dp * lay.context_parallel)
    out["total"] = mem["total"] + sum(out[k] - mem[k] for k in ("optimizer", "activations", "logits", "zero3_buffers"))
    return out


#: What a published Megatron-Core row ran for its layers' weights (Framework.quantized_params: with
#: --fp8-param-gather they are TransformerEngine's quantized tensors alone, tuner.perfmodel.quantized), read from source.
#: Megatron-Bridge's performance configs (`_perf_precision` / `get_precision_config`) take
#: bf16_with_fp8_current_scaling_mixed (fp8_cs) or bf16_with_mxfp8_mixed (fp8_mx), which set fp8_param_gather = True
#: (mxfp8 also reuse_grad_buf_for_mxfp8_param_ag) in src/megatron/bridge/training/mixed_precision.py at every tag read,
#: v0.2.0, v0.3.1, v0.4.1 and 067f987df (Kimi's and gpt-oss's configs switch it off: no such row here);
#: bf16_with_nvfp4_mixed sets fp4_param_gather = True from v0.5.0 (whose docs/performance-summary.md is the 26.06
#: container's), so NVFP4 rows from release 26.06 on. Megatron-Core then keeps no bf16 copy of those weights
#: (megatron/core/distributed/param_and_grad_buffer.py @ d98e8a64dd maps the quantized storage into its buffer; the
#: distributed optimizer's fp32 main parameters stay). Every other row is read as tuner's launch runs it: NeMo 2's
#: bf16_with_fp8_mixed sets fp8_params = True at v2.0.0 and v2.1.0, as the rule does (not checked per row's script);
#: NeMo 24.07's table names no config (NeMo 1 defaults fp8_params to False, megatron_base_model.py at NeMo v2.0.0, but
#: the launcher's 24.07 yamls set neither fp8 nor fp8_params and match none of its layouts), so unstated. A row's
#: `ran_fp8_params` states it.
NVFP4_PARAMS_FROM = (26, 6)


def ran_fp8_params(row: dict, lay: Layout, w) -> bool | None:
    """Whether the row's layers' weights were quantized alone where that is not what tuner's launch would run for its
    layout (Framework.quantized_params), else None."""
    from tuner.frameworks import of
    release = row.get("release", "")
    ran = row.get("ran_fp8_params")
    if ran is None and row["framework"] == "megatron-core" and w.precision in ("fp8", "mxfp8", "nvfp4"):
        if release.startswith("Megatron-Bridge "):
            ran = (w.precision != "nvfp4" or
                   tuple(int(x) for x in release.split()[1].split(".")[:2]) >= NVFP4_PARAMS_FROM)
    return None if ran is None or bool(ran) == of(w).quantized_params(lay, w) else bool(ran)


def stage_as_ran(row: dict, lay: Layout, w, stage: int, m: int, alone: bool | None) -> dict:
    """One stage's breakdown (memory.stage_memory) with the row's recompute as it ran: `ran_recompute_also` names a
    second tuner mode whose modules, disjoint from the layout's, the run recomputed as well (DeepSeek-V3's RMSNorm with
    its MLA up-projection: mla_up and norm_act). Each module's freed bytes are its own (tuner.perfmodel.recompute
    .freed_bytes sums them) and a mode other than full leaves the backward's buffers as they are, so the stage keeps
    the layout's activations less what that mode frees on its own."""
    mem = memory.stage_memory(lay, w, stage, m, fp8_params=alone, loss_chunks=ran_loss_chunks(row))
    also = row.get("ran_recompute_also")
    if not also:
        return mem
    if "full" in (also, lay.recompute) or recompute_modules(also) & recompute_modules(lay.recompute):
        raise ValueError(f"{row['source']}: ran_recompute_also {also!r} must name modules apart from "
                         f"{lay.recompute!r}'s, neither of them full")
    none, extra = (memory.stage_memory(dataclasses.replace(lay, recompute=rc), w, stage, m, fp8_params=alone)
                   for rc in ("none", also))
    freed = none["activations"] - extra["activations"]
    return {**mem, "activations": mem["activations"] - freed, "total": mem["total"] - freed}


def dualpipe_devices(lay: Layout, stages: list[dict]) -> list[dict]:
    """DeepSeek's DualPipe (`ran_schedule = "dualpipe"`) from 1F1B's stage breakdowns, one per device. Its rank r runs
    stage r of the forward direction and stage pp-1-r of the reverse one (deepseek-ai/DualPipe @ 3da1bbe
    dualpipe/dualpipe.py DualPipe.step: its warm-up, steps 1-2, runs 2(pp/2 - r - 1) + r + 1 = pp - r - 1 forward
    chunks of phase 0 and r + 1 of phase 1, and the main step one more of phase 0 before its first phase-0
    backward): pp - r and r + 1 micro-batches of the two stages in flight, 1F1B's counts of stages r and pp-1-r,
    pp + 1 in all (the README's table: DualPipe holds 2x the parameters and pp + 1 micro-batches' activations per
    device). So device r holds both stages' model states and activations: the sum of the two stages' breakdowns,
    with one reserve. Both stages' backward buffers are kept (DualPipe overlaps one chunk's forward with another's
    backward)."""
    if lay.pp % 2 or lay.virtual_pipeline != 1:
        raise ValueError(f"DualPipe runs an even number of stages without virtual ones (pp {lay.pp}, "
                         f"vp {lay.virtual_pipeline})")
    devices = []
    for r in range(lay.pp // 2):
        a, b = stages[r], stages[lay.pp - 1 - r]
        devices.append({k: a[k] + b[k] - (a[k] if k == "reserved" else 0.0) for k in a})
        devices[-1]["total"] -= a["reserved"]
    return devices


#: torchtitan's loss as a row ran it: `ran_loss_chunks = N` where its source states a chunked loss. tuner's launch
#: (tuner/render/torchtitan.py, pytorch/torchtitan @ 238fa9953e4a) computes CrossEntropyLoss on the whole logits;
#: torchtitan added ChunkedCELoss on 2026-04-27 (pytorch/torchtitan 786e26f8e, #2937) and its qwen3 configs run
#: ChunkedLossWrapper(CrossEntropyLoss) with num_chunks 8 from then (torchtitan/models/qwen3/config_registry.py
#: qwen3_30b_a3b @ 363709fdab19, 2026-07-21; components/loss.py ChunkedLossWrapper.Config num_chunks = 8), the
#: account tuner.perfmodel.memory_loss.loss_phase derived for 0.3.0's (chunks > 1).
def ran_loss_chunks(row: dict) -> int:
    """The row's loss chunks (1: un-chunked, as tuner launches it)."""
    n = row.get("ran_loss_chunks", memory.LAUNCHED_LOSS_CHUNKS)
    if row.get("ran_loss_chunks") is not None and (row["framework"] != "torchtitan" or int(n) < 2):
        raise ValueError(f"{row['source']}: ran_loss_chunks is torchtitan's chunked loss, 2 chunks or more")
    return int(n)


def peak_as_ran(row: dict, lay: Layout, w) -> dict:
    """The worst stage's predicted breakdown as the row ran (before the framework's measured bias); where its weights
    were held otherwise than tuner's launch holds them (ran_fp8_params), the worst stage after that; with its
    recompute as it ran (stage_as_ran) and, under DeepSeek's DualPipe, the worst device (dualpipe_devices)."""
    m = micro_batches_per_pipeline(lay, w.global_batch)
    alone = ran_fp8_params(row, lay, w)
    if alone is None and not row.get("ran_recompute_also") and "ran_schedule" not in row:
        _, mem = memory.peak_memory(lay, w, m, loss_chunks=ran_loss_chunks(row))
        return ran_breakdown(row, lay, w, mem)
    dual = row.get("ran_schedule") == "dualpipe"
    if row.get("ran_schedule", "dualpipe") != "dualpipe":
        raise ValueError(f"{row['source']}: ran_schedule {row['ran_schedule']!r}: only 'dualpipe' is read")
    stages = [stage_as_ran(row, lay, w, s, m, alone)
              for s in (range(lay.pp) if dual else stage_candidates(lay, w.model))]
    return ran_breakdown(row, lay, w, max(dualpipe_devices(lay, stages) if dual else stages,
                                          key=lambda b: b["total"]))


def memory_as_ran(row: dict, lay: Layout, w) -> tuple[float, float]:
    """(the peak tuner states, GB; its p_fit) for the row as it ran: tuner.perfmodel.breakdown_fit (what memory_fit,
    and so predict, plan and best, state) on peak_as_ran's breakdown."""
    mem, p_fit = breakdown_fit(peak_as_ran(row, lay, w), w)
    return mem["total"], p_fit
