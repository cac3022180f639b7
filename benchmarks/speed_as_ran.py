"""A published row's speed as it ran, where its launch ran otherwise than tuner's would (benchmarks/reading.py hands these
names on: one reading for every accuracy benchmark):
- the framework overlaps its config turned off (`tp_comm_overlap = false`, `overlap_grad_reduce = false`) and the
  weights' bytes in the parameter all-gather (`ran_fp8_params`): `exchange_as_ran`, what tuner.perfmodel.predict
  credits (its TokenExchange, as moe_accuracy reads the overlaps);
- a step's seconds beyond tuner's: torchtitan's Qwen3 TP plan before its fix (`ran_qk_norm`, qk_norm_gather_s) and
  the attention kernel a row ran where it is not the one tuner charges its framework (`ran_attention`, attention_kernel_s:
  FlashAttention-2 or FlexAttention where tuner charges the fused (cuDNN) attention, more seconds).
"""

from __future__ import annotations

import dataclasses

from tuner.frameworks import FRAMEWORKS
from tuner.layout import Layout, micro_batches_per_pipeline
from tuner.perfmodel.moe_exchange import TokenExchange

#: A row's key saying its config turned a framework overlap off (False), by tuner.frameworks Framework.overlaps' name:
#: `tp_comm_overlap = false`, no --tp-comm-overlap (the TP all-gathers and reduce-scatters of sequence parallelism run
#: whole); `overlap_grad_reduce = false`, no --overlap-grad-reduce, and so no --overlap-param-gather, which Megatron-LM
#: refuses without it (the distributed optimizer's gradient reduce-scatter and parameter all-gather run whole after the
#: last backward and before the next forward). Both are store_true flags, off unless passed, in Megatron-LM
#: core_v0.6.0 (megatron/training/arguments.py lines 960, 1278 and 1283; lines 259-264 refuse the gather's overlap
#: without the reduce's) and in FlagScale @ 26cd664 (megatron/arguments.py lines 990, 1300, 1305).
OVERLAP_KEYS = (("tp", "tp_comm_overlap"), ("dp", "overlap_grad_reduce"))


def overlaps_off(row: dict) -> set:
    """The framework overlaps the row states its run turned off."""
    return {name for name, key in OVERLAP_KEYS if row.get(key) is False}


def exchange_as_ran(row: dict) -> TokenExchange | None:
    """A dense row's overlaps as they ran, for tuner.perfmodel.predict: None (the framework's own, what `tuner launch`
    writes) unless the row states one off (overlaps_off) or states `ran_fp8_params` (its layers' weights held as
    TransformerEngine's quantized tensors alone, or not, where tuner's launch would do otherwise: their parameter
    all-gather moves those bytes, tuner.perfmodel.quantized.gather_bytes; reading.ran_fp8_params reads the same key for
    memory). An MoE row's whole exchange is moe_accuracy.exchange_of's."""
    off, quantized = overlaps_off(row), row.get("ran_fp8_params")
    if not off and quantized is None:
        return None
    return TokenExchange(overlaps=FRAMEWORKS[row["framework"]].overlaps - off if off else None,
                         quantized_params=None if quantized is None else bool(quantized))


#: torchtitan's Qwen3 tensor-parallel plan from its first version (f9e8897a6, 2025-08-18) until pytorch/torchtitan #1870
#: (8c1d1c5fc, 2025-10-14; issue #1867 'Qwen3 model parallel including unnecessary all_gather') wrapped q_norm and k_norm
#: in NoParallel(use_local_output=False) (torchtitan/experiments/qwen3/infra/parallelize.py @ d66b72a6 apply_non_moe_tp;
#: torchtitan/distributed/__init__.py NoParallel._prepare_output_fn): each norm's head-sharded output (Shard(2)) is
#: redistributed to Replicate, an all-gather of q (all heads) and k per layer. What follows runs on whole tensors
#: (experiments/qwen3/model/model.py: apply_rotary_emb, repeat_kv) until SDPA's DTensor strategy takes its head shard
#: again (Replicate -> Shard(1): a local chunk), whose backward all-gathers the gradients of q and of the repeated keys
#: (all heads each). A row that ran it states `ran_qk_norm = "gathered"`. Its extra seconds per layer and micro-batch,
#: each from tuner's own accounting (nothing chosen on a row):
#: - the gathers: forward (again under full recompute) q and k, backward the two all-head gradients, each a ring
#:   all-gather over the TP group (tuner.perfmodel.comm), exposed as torchtitan's eager TP collectives are, and each
#:   gathered on a dimension other than 0, so funcol's all_gather_tensor copies it once more (torch.cat of the chunks:
#:   read + write of the gathered tensor, torch/distributed/_functional_collectives.py, gather_dim != 0);
#: - RoPE on every head instead of the rank's: tuner.perfmodel.compute's RoPE traffic (4 bytes per element of q and k,
#:   read + write) unsplit, less the split share the model already charges, eager (UNFUSED_TRAFFIC) over the model's
#:   element-wise passes (forward, recompute, BACKWARD_TRAFFIC);
#: - repeat_kv's copy of the keys on every head (write q's width, read k's; its backward the sum back), less the rank's.
QK_NORM_READINGS = ("gathered",)


def qk_norm_gather_s(row: dict, lay: Layout, w) -> float:
    """A step's seconds beyond tuner's where the row ran torchtitan's Qwen3 TP plan before #1870 (QK_NORM_READINGS)."""
    ran = row.get("ran_qk_norm")
    if ran is None or lay.tp == 1:
        return 0.0
    if ran not in QK_NORM_READINGS or w.framework != "torchtitan" or lay.pp != 1:
        raise ValueError(f"{row['source']}: ran_qk_norm {ran!r} is read for torchtitan without pipeline parallelism "
                         f"only, as one of {QK_NORM_READINGS}")
    from tuner.perfmodel import comm, compute
    m, c, t = w.model, w.cluster, lay.tp
    tokens = lay.micro_batch * m.seq_length / lay.context_parallel
    q, k = m.q_width, m.kv_size
    full = lay.recompute == "full"
    fwd_passes = 2.0 if full else 1.0
    gathered = [2.0 * tokens * (q + k)] * int(fwd_passes) + [2.0 * tokens * (q + q)]
    bw = comm.group_bandwidth(c, t, 1)
    hbm = c.hbm_bandwidth_gbps * 1e9 * c.memory_bandwidth_efficiency
    gathers = sum(comm.allgather_time(n, t, bw, c) + 2.0 * n / hbm for n in gathered)
    unsplit = 1.0 - 1.0 / t
    rope = (unsplit * 4.0 * tokens * (q + k) * compute.UNFUSED_TRAFFIC
            * (fwd_passes + compute.BACKWARD_TRAFFIC) / hbm)
    repeat = unsplit * 2.0 * tokens * (q + k) * (fwd_passes + 1.0) / hbm
    steps = micro_batches_per_pipeline(lay, w.global_batch)
    return steps * m.num_layers * (gathers + rope + repeat)


#: The attention kernel a row ran where it is not the one tuner charges its framework (`ran_attention`), one of
#: tuner.perfmodel.compute.ATTENTION_KERNELS' (compute.attention_kernel: what `tuner launch` runs; kernel_slowdown):
#: - "flash-attn-2": FlashAttention-2, which has no Hopper-specific kernel (FlashAttention-3, the first with Hopper
#:   kernels, came in 2024-07, arXiv 2407.08608). FlagScale @ 26cd664 (BAAI's Megatron-LM fork, 2024-01-11) builds its
#:   LLaMA with Megatron's local transformer (megatron/arguments.py line 614: --transformer-impl default 'local'), whose
#:   --use-flash-attn runs flash_attn_varlen_func (megatron/model/transformer.py lines 46 and 539). torchtitan's SDPA
#:   on a Hopper-class GPU (compute capability 9.0) before pytorch/torchtitan 6a3a9da95 (2025-10-09): its attention
#:   module asked for cuDNN first on compute capability >= 10.0 only (3b85aa31f, 2025-05-14), else PyTorch's default
#:   order (FLASH_ATTENTION before EFFICIENT_ATTENTION; CUDNN_ATTENTION last from pytorch/pytorch #138522, 2024-10-22,
#:   in 2.5.1). llm-foundry's MPT rows (attn_impl 'flash': the flash-attn package's FlashAttention-2).
#: - "cudnn": cuDNN's fused attention through PyTorch SDPA -- torchtitan's from 3b85aa31f on compute capability
#:   >= 10.0 (B200 / GB200) and from 6a3a9da95 on every CUDA GPU (ScaledDotProductAttentionWrapper @ 7e4ab8599);
#:   context parallelism keeps it (0354f22fb, 2025-05-22). A CUDA machine only (ROCm has no cuDNN).
#: - "flex": FlexAttention (torchtitan's attn_type / attn_backend "flex"), at FlashAttention-2's factor
#:   (compute.kernel_slowdown: no source measures it apart).
ATTENTION_READINGS = ("flash-attn-2", "cudnn", "flex")


def _ran_slowdown(row: dict, ran: str, cluster) -> float:
    """The attention time, relative to the cluster's attention_efficiency, of the kernel the row ran."""
    if ran not in ATTENTION_READINGS:
        raise ValueError(f"{row['source']}: ran_attention {ran!r} is none of {ATTENTION_READINGS}")
    if ran == "cudnn" and cluster.software != "cuda":
        raise ValueError(f"{row['source']}: ran_attention 'cudnn' on {cluster.name} ({cluster.software}): "
                         "cuDNN runs on CUDA machines only")
    from tuner.perfmodel import compute
    return compute.kernel_slowdown(ran, cluster)


def attention_kernel_s(row: dict, lay: Layout, w, exchange: TokenExchange | None = None, pr=None) -> float:
    """A step's seconds beyond tuner's (negative: fewer) where the row ran another attention kernel than tuner charges
    its framework (ATTENTION_READINGS): tuner.perfmodel.predict's step with the attention at the kernel's slowdown (its
    Shape, through predict's `fitted`: the stages, the bubble and what the compute hides of the FSDP / DP collectives),
    less its step as tuner charges it (`pr`, that prediction where the caller has it); 0 where the two kernels are one."""
    ran = row.get("ran_attention")
    if ran is None:
        return 0.0
    from tuner.perfmodel import memory_fit, predict
    slowdown = _ran_slowdown(row, ran, w.cluster)
    m, sh, *rest = memory_fit(lay, w)
    if slowdown == sh.attention_slowdown:
        return 0.0
    as_ran = (m, dataclasses.replace(sh, attention_slowdown=slowdown), *rest)
    base = pr if pr is not None else predict(lay, w, exchange, fitted=(m, sh, *rest))
    return predict(lay, w, exchange, fitted=as_ran).step_time_s - base.step_time_s


def tps_as_ran(row: dict, lay: Layout, w, pr, exchange: TokenExchange | None = None) -> float:
    """Tokens/s per GPU of prediction `pr` (made with `exchange`) with the seconds the row's launch ran beyond tuner's
    (qk_norm_gather_s, attention_kernel_s)."""
    extra = qk_norm_gather_s(row, lay, w) + attention_kernel_s(row, lay, w, exchange, pr)
    return pr.samples_per_second * pr.step_time_s / (pr.step_time_s + extra) * row["seq_length"] / row["gpus"]
