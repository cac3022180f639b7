"""DeepSpeed's optimizers' own bytes in Megatron-DeepSpeed (and the harness): their states under the pipeline engine
and the gradient copies of their step. Read from DeepSpeed 0.19.8 and checked against Megatron-DeepSpeed's own
training step measured under fake tensors (benchmarks/measure_memory_mds.py, its CONFIGS rows; issue 30 round 33) and
DeepSpeed's plain engine on one H200 (benchmarks/harness_gpu.py). Pure.

- ZeRO 0 in bf16 under the pipeline engine (pp > 1): BF16_Optimizer (runtime/bf16_optimizer.py) partitions the fp32
  master weights and Adam's moments over the data-parallel group (12/d bytes a parameter, as ZeRO 1) and keeps a flat
  gradient-accumulation buffer of every parameter beside the bf16 gradients the backward makes (2 + 2 bytes at its
  default bf16 accumulation); the plain engine (pp 1: DDP_BFLOAT16) keeps 2 and 12 unsharded. Its step is ZeRO 1's
  (`partitioned_stage`): the partition's Adam, then the bf16 parameters all-gathered.
- The optimizer step, after the backward freed the activations (so a stage's peak is its states plus the larger of the
  two phases; memory._stage_sums keeps the excess in the working buffers' entry), with bf16 and DeepSpeed's default
  gradient accumulation dtype (bf16: tuner's ds_config sets no data_types):
  * plain engine, ZeRO 0 (`_do_optimizer_sanity_check` -> DDP_BFLOAT16, FP16_Optimizer with a fused Adam,
    runtime/fp16/fused_optimizer.py `step`): an fp32 copy of every gradient and their flattened fp32 buffer, 4 + 4
    bytes a parameter beside the bf16 gradients (measured on one H200);
  * ZeRO 1 and 2 (DeepSpeedZeroOptimizer, runtime/zero/stage_1_and_2.py `step`): the gradients of parameters outside
    the rank's partition freed (ZeRO 1: they were whole until then, 2 (1 - 1/d)), then the partition flattened in
    bf16 and copied to fp32, 2/d + 4/d: over the states, max(0, 8/d - 2) at ZeRO 1, 6/d at ZeRO 2 (6 at d = 1 both:
    the H200 and the measured pipeline stages at dp 1; 2 at dp 2);
  * BF16_Optimizer (pp > 1, ZeRO 0): the rank's partition of the accumulated gradients in fp32, 4/d (`step`'s
    `grad_partition.to(fp32)`), the bf16 gradients still held.
  Not read, so 0: ZeRO 3.
"""

from __future__ import annotations

from tuner.layout import expert_data_parallel


def bf16_optimizer(layout, workload, fw) -> bool:
    """Whether DeepSpeed steps `layout` with BF16_Optimizer: its pipeline engine at ZeRO 0, not in fp16."""
    return fw.deepspeed_step and layout.pp > 1 and layout.zero_stage == 0 and workload.precision != "fp16"


def partitioned_stage(layout, workload, fw) -> int:
    """The ZeRO stage a layout's step runs as: BF16_Optimizer's (pp > 1, ZeRO 0) all-reduces the gradients, steps its
    partition and all-gathers the updated bf16 parameters (`update_lp_params`), as ZeRO 1 does (comm.dp_time)."""
    return 1 if bf16_optimizer(layout, workload, fw) else layout.zero_stage


def bf16_optimizer_state_bytes(shards: int, grad_bytes: float, moment_bytes: float) -> dict:
    """Bytes a parameter: bf16 weights, the bf16 gradients and the accumulation buffer, the partitioned optimizer."""
    return {"weights": 2.0, "gradients": 2.0 * grad_bytes, "optimizer": (4.0 + 2.0 * moment_bytes) / max(1, shards)}


def step_copy_bytes(layout, workload, fw, params: float, experts: float) -> float:
    """The bytes DeepSpeed's optimizer step holds beyond the stage's states (see the module's docstring)."""
    if not steps_copied(layout, fw):
        return 0.0
    dense, edp = layout.dp * layout.context_parallel, max(1, expert_data_parallel(layout))
    if layout.zero_stage == 0 and layout.pp == 1:
        return 8.0 * params
    if layout.zero_stage == 0:          # the pipeline engine's: BF16_Optimizer's partition (its fp16 optimizer: not read)
        return 4.0 * (params - experts) / dense + 4.0 * experts / edp if bf16_optimizer(layout, workload, fw) else 0.0
    per = (lambda d: max(0.0, 8.0 / d - 2.0)) if layout.zero_stage == 1 else (lambda d: 6.0 / d)
    return per(dense) * (params - experts) + per(edp) * experts


def steps_copied(layout, fw) -> bool:
    """Whether step_copy_bytes charges the layout: then its breakdown's working-buffer entry (key zero3_buffers) holds
    no ZeRO-3 gathers, only the step's copies beyond the activations, and is shown as `step_copies` (fit_reason,
    tuner predict). The pipeline engine runs ZeRO 0 and 1 only."""
    return fw.deepspeed_step and layout.zero_stage != 3 and (layout.pp == 1 or layout.zero_stage <= 1)


def buffers_name(layout, fw) -> str:
    """The working-buffer entry's name as shown (its key stays zero3_buffers): see steps_copied."""
    return "step_copies" if steps_copied(layout, fw) else "zero3_buffers"
