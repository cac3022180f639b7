"""DeepSpeed's working buffers beyond the model states, where its engine runs the optimizer (Megatron-DeepSpeed,
`Framework.deepspeed_step`), in two phases that memory._stage_sums adds to a stage's peak:
- through the backward (`backward_bytes`): the ZeRO optimizers' gradient-reduction bucket;
- after it (`after_backward_bytes`), when the activations are freed: the optimizer step's gradient copies (pp 1), or
  under the pipeline engine at ZeRO 1 a second bucket beside the first; the stage's peak holds the larger phase.
Read from DeepSpeed 0.19.8 (runtime/zero/stage_1_and_2.py, stage3.py, engine.py) with bf16 and its defaults, which
`tuner launch`'s ds_config keeps (it sets only the ZeRO stage); measured on CPU ranks (allocated tensor bytes,
benchmarks/harness_cpu_memory.py) and on one H200 (benchmarks/harness_gpu.py). No constant fitted.
"""

from __future__ import annotations

from tuner.layout import Layout, expert_data_parallel
from tuner.specs import Workload

#: DeepSpeed ZeRO's defaults, which `tuner launch` keeps (its ds_config.json sets only the stage): ZeRO-3 prefetches
#: parameters in groups of >= 5e7 elements and every ZeRO stage reduces gradients in buckets of <= 5e8
#: (deepspeed/runtime/zero/config.py @ 38327e07f, prefetch_bucket_size and reduce_bucket_size; the same defaults in
#: v0.3.14's zero/constants.py and 0.19.8's).
DS_PREFETCH_BUCKET, DS_REDUCE_BUCKET = 5e7, 5e8
#: One gradient-reduction bucket: reduce_bucket_size elements (5e8 by default) in the gradients' dtype (bf16; tuner's
#: ds_config sets no data_types, so no fp32 accumulation attribute), whatever the model's size.
BUCKET_BYTES = 2.0 * DS_REDUCE_BUCKET


def backward_bytes(layout: Layout, fw) -> float:
    """What DeepSpeed's ZeRO optimizer holds through the backward: with contiguous_gradients (its default) one bucket of
    BUCKET_BYTES -- at ZeRO 1 and 2 allocated at the first gradient hook (stage_1_and_2.py `setup_buckets`, from
    `process_gradients`) and released in the reduction's epilogue (`_release_ipg_buffers`: at ZeRO 1 at the gradient
    accumulation boundary, so it spans every micro-batch of the step; at ZeRO 2 after each backward), a second one only
    with overlap_comm (off at stages 1 and 2 by default, zero/config.py `overlap_comm_valid`); at ZeRO 3 allocated
    with the optimizer and kept (stage3.py: `bucket.buffer = torch.empty(self.reduce_bucket_size, ...)`). Measured on
    CPU ranks (data/harness_measured_cpu.jsonl): 0.92-1.02 GB above the account at ZeRO 1, 2 and 3, dp 1 and 2, tp 2."""
    if not fw.deepspeed_step or layout.zero_stage == 0:
        return 0.0
    return BUCKET_BYTES


def after_backward_bytes(layout: Layout, workload: Workload, fw, params: float, experts: float) -> float:
    """What DeepSpeed holds after the backward, the activations freed: the optimizer step's gradient copies
    (step_copy_bytes), or under the pipeline engine at ZeRO 1 the bucket of the backward and a second one that
    `reduce_gradients(pipeline_parallel=True)` appends at the gradient accumulation boundary (stage_1_and_2.py, called
    from engine.py `allreduce_gradients`), both released by its epilogue before the step -- measured on CPU ranks: pp 2
    at ZeRO 1 1.94 GB above the account."""
    if fw.deepspeed_step and layout.zero_stage == 1 and layout.pp > 1:
        return 2.0 * BUCKET_BYTES
    return step_copy_bytes(layout, workload, fw, params, experts)


def step_copy_bytes(layout: Layout, workload: Workload, fw, params: float, experts: float) -> float:
    """The gradient copies DeepSpeed's engine makes in its optimizer step, after the backward freed the activations.
    Read from DeepSpeed 0.19.8 with bf16 and its default gradient accumulation dtype (bf16: tuner's ds_config sets no
    data_types), in its plain engine (pp 1: the harness's GPT, Megatron-DeepSpeed's --no-pipeline-parallel): at ZeRO 0
    (`_do_optimizer_sanity_check` -> DDP_BFLOAT16, FP16_Optimizer with a fused Adam, runtime/fp16/fused_optimizer.py
    `step`) an fp32 copy of every gradient and their flattened fp32 buffer, 4 + 4 bytes a parameter beside the bf16
    gradients; at ZeRO 1 and 2 (DeepSpeedZeroOptimizer, runtime/zero/stage_1_and_2.py `step`) the rank's gradient
    partition flattened in bf16 and its fp32 copy, (2 + 4) / d. Measured on one H200 (benchmarks/harness_gpu.py). Not
    read, so 0: ZeRO 3, and the pipeline engine (pp > 1: BF16_Optimizer at ZeRO 0; at ZeRO 1 the Frontier study's 175B
    stage 0, 33.9 GB at pp 16, is met without the copies)."""
    if not steps_copied(layout, fw):
        return 0.0
    if layout.zero_stage == 0:
        return 8.0 * params
    dense = layout.dp * layout.context_parallel
    return 6.0 * ((params - experts) / dense + experts / max(1, expert_data_parallel(layout)))


def steps_copied(layout: Layout, fw) -> bool:
    """Whether step_copy_bytes charges the layout."""
    return fw.deepspeed_step and layout.zero_stage != 3 and layout.pp == 1


def buffers_name(layout: Layout, fw) -> str:
    """The working-buffer entry's name as shown (its key stays zero3_buffers): `zero_buffers` where it holds DeepSpeed's
    ZeRO 1 / 2 bucket (or the step's copies beyond the activations), `step_copies` where only the step's copies
    (ZeRO 0), else `zero3_buffers` (ZeRO 3's gathers and bucket, FSDP's units)."""
    if fw.deepspeed_step and layout.zero_stage in (1, 2):
        return "zero_buffers"
    return "step_copies" if steps_copied(layout, fw) else "zero3_buffers"
