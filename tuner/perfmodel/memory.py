"""Per-GPU memory of a layout: model states per ZeRO stage, activations under 1F1B, logits, overhead.

Pure functions (docs/reference/formulas.md; Rajbhandari et al. 2020; Korthikanti et al. 2022). Mixed
precision with Adam: fp16/bf16 weights (2 bytes), gradients in the framework's buffer (2 bytes in
Megatron-DeepSpeed; 4 in Megatron-Core, which accumulates them in fp32), fp32 master weights, momentum and
variance (12). torchtitan's FSDP2 shards all of it (fp32 parameters, gradients, Adam: 16/d) and gathers
each layer's bf16 parameters as it runs (`fsdp_buffers`). Sizes are in bytes unless a name says GB.

Architecture (ModelSpec): grouped-query attention shrinks K and V (weights h x kv, activations kv
wide instead of h); SwiGLU has three h x f matrices and keeps its two f-wide fc1 outputs for backward;
an untied LM head is its own V x h matrix on the last stage (also with pp = 1); RoPE has no parameters;
RMSNorm has no bias; models without linear biases (Llama) hold none.

Layout: context parallelism gives each rank s/cp of every activation and shards the model states over
the d*c ranks that hold the same weights; sequence parallelism splits the activations outside
attention and the FFN by t too (Korthikanti et al.: 34/t instead of 10 + 24/t bytes per s*b*h);
selective recompute keeps no attention scores (free with FlashAttention, which keeps none anyway);
mixture-of-experts layers hold their routed experts on 1/(ep*etp) of the GPUs and shard those states over
the expert-data-parallel group (tuner.perfmodel.moe); the interleaved schedule keeps p*v + p - 1
virtual-stage passes in flight on the first rank instead of
p (Narayanan et al. 2021: 1 + (p - 1)/(p*v) times the layers' activations). FP8 keeps the layers' weights
quantized (tuner.perfmodel.quantized: a cached copy beside bf16 weights, or, under Megatron-Core's
--fp8-param-gather, in their place; per-tensor FP8 1 byte per parameter on Blackwell and 2 with its transpose
elsewhere, MXFP8 2.0625, NVFP4 1.125) and saves the GEMM inputs for backward in FP8 (1 byte, not 2); NVFP4
0.5625-byte inputs.
"""

from __future__ import annotations

from tuner.layout import Layout, expert_data_parallel, stage_candidates, stage_layers, stage_moe_layers
from tuner.perfmodel.activations import (  # noqa: F401 -- one layer's account, re-exported with the stages' sums
    EAGER_REPLICATED, LAUNCHED_FUSED_QKV, activation_bytes_per_layer, checkpoint_bytes_per_layer, eager_split_bytes,
    fp8_saved_bytes, op_sac_bytes, split_activation_bytes)
from tuner.perfmodel.compute import Shape, shape_of
from tuner.perfmodel.deepspeed_states import (  # noqa: F401 -- re-exported: DeepSpeed's optimizers' own bytes
    bf16_optimizer, bf16_optimizer_state_bytes, buffers_name, step_copy_bytes, steps_copied)
from tuner.perfmodel.layer_backward import megatron_backward_bytes
from tuner.perfmodel.memory_loss import LAUNCHED_LOSS_CHUNKS, loss_phase, megatron_loss_bytes
from tuner.perfmodel.moe import moe_activation_bytes, op_sac_moe_backward_bytes
from tuner.perfmodel.offload import resident_layers
from tuner.perfmodel.params import (  # noqa: F401 -- re-exported: the parameters one GPU holds
    embedding_params, largest_stage_params, layer_params, max_layer_params, mtp_params, stage_expert_params,
    stage_params, tied_embedding_params)
from tuner.perfmodel.quantized import (  # noqa: F401 -- re-exported: the weights as TransformerEngine quantizes them
    QUANTIZED_WEIGHT_BYTES, outside_layer_params, quantized_weight_bytes, quantized_weights)
from tuner.perfmodel.recompute import freed_bytes     # Megatron-Core's --recompute-modules (issue 25)
from tuner.specs import ModelSpec, Workload

GB = 1e9


def model_state_bytes_per_param(zero_stage: int, dp: int, grad_bytes: float = 2.0, fsdp: bool = False,
                                moment_bytes: float = 4.0) -> dict:
    """Bytes per parameter for weights, gradients and optimizer states under a ZeRO stage, with a
    gradient buffer of `grad_bytes` per parameter and Adam's two moments in `moment_bytes` each (2: bf16,
    Megatron-Core's precision-aware optimizer; the fp32 main parameters stay 4).

    2-byte gradients: ZeRO-0: 2 + 2 + 12 = 16; ZeRO-1: 4 + 12/d; ZeRO-2: 2 + 14/d; ZeRO-3: 16/d.
    fp32 gradients (Megatron-Core): 18; distributed optimizer 6 + 12/d. FSDP2 (fsdp): fp32 parameters
    4/d, fp32 gradients 4/d, Adam 8/d."""
    d = max(1, dp)
    if fsdp:
        return {"weights": 4.0 / d, "gradients": 4.0 / d, "optimizer": 8.0 / d}
    weights = 2.0 / d if zero_stage >= 3 else 2.0
    grads = grad_bytes / d if zero_stage >= 2 else grad_bytes
    optim = 4.0 + 2.0 * moment_bytes
    optim = optim / d if zero_stage >= 1 else optim
    return {"weights": weights, "gradients": grads, "optimizer": optim}


# ----------------------------------------------------------------------------------- activations
# one layer's account: tuner/perfmodel/activations.py; here what the stages keep of it


def in_flight(stage: int, pp: int, m: int, vp: int = 1) -> int:
    """Passes of one (virtual) stage's layers whose backward has not run yet, at the stage's peak.
    1F1B: stage i holds min(p - i, m) micro-batches. Interleaved (Megatron's warm-up): 2(p - i - 1)
    + (v - 1)p + 1 virtual-stage passes, at most m*v."""
    if vp == 1:
        return max(1, min(pp - stage, m))
    return max(1, min(2 * (pp - stage - 1) + (vp - 1) * pp + 1, m * vp))


def layer_activation_bytes(model: ModelSpec, shape: Shape, flash_attention: bool) -> tuple[float, float, float]:
    """What one layer keeps for backward on one rank: (a dense layer's full activations, an MoE layer's (0 for a
    dense model), the layer's checkpoint under full recompute), less what its recomputed modules free."""
    full_dense = activation_bytes_per_layer(model, shape, flash_attention) - freed_bytes(model, shape, False)
    full_moe = (moe_activation_bytes(model, shape, flash_attention) - freed_bytes(model, shape, True)
                if model.is_moe else 0.0)
    return full_dense, full_moe, checkpoint_bytes_per_layer(model, shape)


def mean_layer_activation_bytes(model: ModelSpec, shape: Shape, flash_attention: bool) -> float:
    """One layer's full activations on one rank (layer_activation_bytes), the mean over the model's dense and MoE
    layers: what CPU activation offloading moves a layer (tuner.perfmodel.stages.offload_seconds, offload_host_gb)."""
    n, n_moe = model.num_layers, model.num_moe_layers
    full_dense, full_moe, _ = layer_activation_bytes(model, shape, flash_attention)
    return ((n - n_moe) * full_dense + n_moe * full_moe) / n


def offload_host_gb(layout: Layout, workload: Workload, shape: Shape) -> float:
    """Host memory (GB per GPU) that CPU activation offloading holds at once: every offloaded layer's activations of
    the micro-batch in flight (pp 1: one), from its forward until its backward reloads it (TransformerEngine's
    AsyncDoubleBufferGroupOffloadHandler keeps each group's host copy until then, tuner.perfmodel.offload)."""
    if not layout.offload_layers:
        return 0.0
    flash = workload.cluster.flash_attention
    return layout.offload_layers * mean_layer_activation_bytes(workload.model, shape, flash) / 1e9


def host_fits(layout: Layout, workload: Workload, shape: Shape | None = None) -> bool:
    """Whether CPU activation offloading's host copies (offload_host_gb) fit in the host memory per GPU the cluster
    states (host_memory_gb; unchecked where it states none): the node's memory shared evenly by its GPUs, nothing
    else on the host counted, so a bound a layout must keep, not a probability."""
    cap = workload.cluster.host_memory_gb
    if not (layout.offload_layers and cap):
        return True
    return offload_host_gb(layout, workload, shape or shape_of(layout, workload)) <= cap


def stage_activation_bytes(model: ModelSpec, layout: Layout, stage: int, m: int, shape: Shape,
                           flash_attention: bool, per_layer: tuple | None = None, outputs_freed: bool = False) -> float:
    """Activation memory of stage `stage` at its peak (`per_layer`: layer_activation_bytes, where known).

    Each in-flight pass keeps, per layer, its checkpoint (full recompute) or its full activations,
    plus the (virtual) stage's output tensor that the pipeline keeps until the backward pass -- unless
    `outputs_freed`: Megatron-Core (deallocate_pipeline_outputs, which Megatron-LM's argument_utils and
    Megatron-Bridge's GPT provider set) replaces a pass's output data by one element once it is sent
    (schedules.deallocate_output_tensor; custom_backward runs the backward from its grad_fn alone), and the
    input it received is its first layer's input, already in that layer's account. With full recompute, one
    layer's full activations are live during its recompute; that layer's checkpoint (its input) is one of
    them, so it is not counted twice."""
    moe = stage_moe_layers(layout, model, stage)
    dense = stage_layers(layout, model.num_layers, stage) - moe
    if stage == layout.pp - 1 and model.mtp_num_layers:      # the multi-token prediction modules' layers
        moe, dense = (moe + model.mtp_num_layers, dense) if model.is_moe else (moe, dense + model.mtp_num_layers)
    full_dense, full_moe, ckpt = per_layer or layer_activation_bytes(model, shape, flash_attention)
    full_moe = full_moe if moe else 0.0
    boundary = ckpt if layout.pp > 1 and not outputs_freed else 0.0
    if shape.recompute == "full":
        per_pass = (dense + moe) / layout.virtual_pipeline * ckpt + boundary
        working = max(full_dense if dense else 0.0, full_moe) - ckpt
    else:
        per_pass, working = (dense * full_dense + moe * full_moe) / layout.virtual_pipeline + boundary, 0.0
        kept = resident_layers(model.num_layers, layout.offload_layers)   # offloading (pp 1): tuner.perfmodel.offload
        if kept < model.num_layers:
            per_pass = per_pass * kept / model.num_layers
    return in_flight(stage, layout.pp, m, layout.virtual_pipeline) * per_pass + working


def logits_bytes(model: ModelSpec, micro_batch: float, tp: int) -> float:
    """fp32 logits for the loss on the last stage: 4 * s*b*V/t (b/cp of a micro-batch per CP rank)."""
    return 4.0 * model.seq_length * micro_batch * model.vocab_size / tp


def fsdp_buffers(model: ModelSpec, layout: Layout, stage: int, shards: int) -> float:
    """FSDP2's unsharded working set on one rank. Without pipelining (parameters resharded after each
    forward): the gathered bf16 parameters of the unit that runs and of the prefetched one (2 x 2 bytes)
    and the unit's gradients in bf16 and in fp32 for the reduce-scatter (6 bytes), the unit being the
    largest of a layer and the stage's embedding / output matrix. With pipelining (torchtitan keeps a
    stage's parameters gathered from forward to backward): the stage's bf16 parameters and their
    accumulated bf16 gradients (4 bytes each parameter), plus one unit's fp32 reduce buffer."""
    if shards <= 1:
        return 0.0
    unit = max_layer_params(model, layout)
    if stage == 0 or stage == layout.pp - 1:
        unit = max(unit, embedding_params(model, layout.tp))
    if layout.pp > 1:
        return 4.0 * stage_params(model, layout, stage) + 4.0 * unit
    return 10.0 * unit


def zero3_gather_bytes(model: ModelSpec, tp: int, dp: int, zero_stage: int) -> float:
    """ZeRO-3 working buffers: about two layers' fp16 parameters gathered (current + prefetch)."""
    if zero_stage < 3 or dp <= 1:
        return 0.0
    return 2 * 2.0 * layer_params(model, tp) * (1.0 - 1.0 / dp)


# ----------------------------------------------------------------------------------- per stage
def stage_parts(layout: Layout, workload: Workload, stage: int, m: int, sh: Shape,
                memo: dict | None = None) -> tuple[float, float, float, float]:
    """What a stage holds whatever the ZeRO stage: (parameters, routed-expert parameters among them,
    activation bytes, logits bytes). `memo`: the parameters by the model's cut and what one layer keeps by its
    shape, kept for one workload's layouts."""
    from tuner.frameworks import of
    model, flash, freed = workload.model, workload.cluster.flash_attention, of(workload).frees_pipeline_outputs
    if memo is None:
        params, per_layer = (stage_params(model, layout, stage), stage_expert_params(model, layout, stage)), None
    else:
        key = ("params", layout.tp, layout.pp, layout.virtual_pipeline, layout.pipeline_split, layout.expert_parallel,
               layout.expert_tensor_parallel, stage)
        params = memo.get(key)
        if params is None:
            params = memo[key] = (stage_params(model, layout, stage), stage_expert_params(model, layout, stage))
        per_layer = memo.get(("layer", sh))
        if per_layer is None:
            per_layer = memo[("layer", sh)] = layer_activation_bytes(model, sh, flash)
    act = stage_activation_bytes(model, layout, stage, m, sh, flash, per_layer, freed)
    if of(workload).sp_gather_buffer and sh.sp and layout.tp > 1:
        act += sp_gather_bytes(model, sh)
    return (*params, act,
            (1 + model.mtp_num_layers) * logits_bytes(model, sh.tokens, layout.tp) if stage == layout.pp - 1 else 0.0)


def sp_gather_bytes(model: ModelSpec, sh: Shape) -> float:
    """Megatron-Core's sequence-parallel all-gather buffer: a column-parallel linear gathers its s/t input into the
    global memory buffer "mpu" (tensor_parallel/layers.py, get_global_memory_buffer().get_tensor at 0.16.1), which is
    kept and reused once allocated: s*b*h bf16 on every rank (the output layer's, on every spec; the local spec's
    layers use the same one)."""
    return 2.0 * model.seq_length * sh.tokens * model.hidden_size


def state_bytes(layout: Layout, workload: Workload, fw, shards: int) -> tuple[dict, dict]:
    """Model-state bytes per parameter (model_state_bytes_per_param) of the dense and of the routed-expert
    parameters, sharded over dp*cp (`shards`) and over the expert-dp group."""
    gb = fw.grad_bytes(workload)
    mb = 2.0 if workload.optimizer_moments == "bf16" else 4.0
    if bf16_optimizer(layout, workload, fw):
        edp = expert_data_parallel(layout)
        return bf16_optimizer_state_bytes(shards, gb, mb), bf16_optimizer_state_bytes(edp, gb, mb)
    return (model_state_bytes_per_param(layout.zero_stage, shards, gb, fw.fsdp, mb),
            model_state_bytes_per_param(layout.zero_stage, expert_data_parallel(layout), gb, fw.fsdp, mb))


def _memo_state_bytes(layout: Layout, workload: Workload, fw, shards: int, memo: dict) -> tuple[dict, dict]:
    key = ("states", layout.zero_stage, shards, expert_data_parallel(layout), layout.pp > 1)
    got = memo.get(key)
    if got is None:
        got = memo[key] = state_bytes(layout, workload, fw, shards)
    return got


def fsdp_phases(model: ModelSpec, layout: Layout, sh: Shape, act: float, shards: int, flash: bool,
                chunks: int, memo: dict | None = None) -> tuple[float, float, float]:
    """torchtitan with one stage: (activations, activations outside the layers, FSDP buffers) in the phase whose
    sum is largest (tuner.perfmodel.memory_loss): the loss (the layers' kept activations, without full recompute's
    working layer, and loss_phase), a layer's backward (all of `act` and one layer's buffers, as fsdp_buffers) or
    the embedding's backward (its unit's buffers alone). Under per-op SAC an MoE block's backward also holds its
    recomputed block and gradients (moe.op_sac_moe_backward_bytes)."""
    working = _working_bytes(model, sh, flash, memo)
    loss_act, loss_buf = loss_phase(model, layout.tp, sh.sp, sh.tokens, layout.micro_batch, shards, chunks,
                                    compiled=sh.fused)
    layer = act + op_sac_moe_backward_bytes(model, sh)
    phases = ((act - working, loss_act, loss_buf), (layer, 0.0, 10.0 * max_layer_params(model, layout)),
              (0.0, 0.0, 10.0 * embedding_params(model, layout.tp)))
    return max(phases, key=sum)


def _working_bytes(model: ModelSpec, sh: Shape, flash: bool, memo: dict | None) -> float:
    """Full recompute's working layer (its full activations less its checkpoint), live only in that layer's backward."""
    if sh.recompute != "full":
        return 0.0
    per = (memo or {}).get(("layer", sh)) or layer_activation_bytes(model, sh, flash)
    return max(per[0] if model.num_moe_layers < model.num_layers else 0.0, per[1]) - per[2]


def megatron_phases(model: ModelSpec, sh: Shape, act: float, layout: Layout, flash: bool, memo: dict | None = None,
                    last: bool = True) -> tuple[float, float]:
    """Megatron-Core's stage: (activations, bytes outside the layers) at its peak, a layer's backward (`act` and
    layer_backward.megatron_backward_bytes) or, on the last stage, its loss's if larger (act less full recompute's working
    layer, and memory_loss.megatron_loss_bytes per loss: the model's and each multi-token prediction module's)."""
    backward = act + megatron_backward_bytes(model, layout.tp, sh.sp, sh.tokens, layout.pp, sh.recompute)
    if not last:
        return backward, 0.0
    loss = (1 + model.mtp_num_layers) * megatron_loss_bytes(model, layout.tp, sh.sp, sh.tokens)
    return max(((act - _working_bytes(model, sh, flash, memo), loss), (backward, 0.0)), key=sum)


def stage_memory(layout: Layout, workload: Workload, stage: int, m: int, sh: Shape | None = None,
                 memo: dict | None = None, loss_chunks: int = LAUNCHED_LOSS_CHUNKS, fp8_params: bool | None = None) -> dict:
    """Memory breakdown (GB) of one GPU on pipeline stage `stage`; 'total' is the peak. `memo`: the parameters
    and what one layer keeps, kept for one workload's layouts (stage_parts). torchtitan with one stage (FSDP2
    sharded over more than one rank) takes its peak phase (fsdp_phases) with a loss of `loss_chunks` chunks
    (the launched one's by default; a measurement of torchtitan 0.3.0 ran 8). `fp8_params`: the layers' weights
    quantized alone (True) or beside bf16 ones (False) where a run did not do as the framework's rule says."""
    from tuner.frameworks import of
    sh, fw = sh or shape_of(layout, workload), of(workload)
    parts = stage_parts(layout, workload, stage, m, sh, memo)
    states = _states_gb(layout, workload, fw, stage, sh, *parts[:2], fp8_params=fp8_params)
    return _breakdown(*_stage_sums(layout, workload, fw, sh, parts, states, memo, loss_chunks))


def _breakdown(total: float, states: dict, values: tuple, params: float) -> dict:
    """stage_memory's dict from _stage_sums' answer (a new dict: `states` may be the memo's)."""
    out = dict(states)
    out["activations"], out["logits"], out["zero3_buffers"], out["reserved"] = values
    out["total"] = total
    out["params_billion"] = params / 1e9
    return out


def _stage_sums(layout: Layout, workload: Workload, fw, sh: Shape, parts: tuple, states: tuple, memo: dict | None,
                loss_chunks: int = LAUNCHED_LOSS_CHUNKS) -> tuple[float, dict, tuple, float]:
    """stage_memory's figures without its dict, from the stage's stage_parts and _states_gb: (the total GB, the
    model states in GB, (activations, logits, buffers, reserved) in GB, the parameters); the total is the sum of
    the dict's entries in the dict's order."""
    params, _, act, logits = parts
    out, state_values, buffers = states
    shards = layout.dp * layout.context_parallel
    if fw.fsdp and layout.pp == 1 and shards > 1:
        act, logits, buffers = fsdp_phases(workload.model, layout, sh, act, shards, workload.cluster.flash_attention,
                                           loss_chunks, memo)
    elif fw.megatron_loss:
        act, logits = megatron_phases(workload.model, sh, act, layout, workload.cluster.flash_attention, memo, bool(logits))
    act, logits, buffers = act / GB, logits / GB, buffers / GB
    buffers = buffers + max(0.0, step_copy_bytes(layout, workload, fw, params, parts[1]) / GB - act - logits - buffers)
    values = (act, logits, buffers, workload.cluster.memory_reserved_gb)
    return sum((*state_values, *values)), out, values, params


def _states_gb(layout: Layout, workload: Workload, fw, stage: int, sh: Shape, params: float, experts: float,
               memo: dict | None = None, fp8_params: bool | None = None) -> tuple[dict, tuple, float]:
    """A stage's model states in GB (weights, gradients, optimizer, FP8 weights), their values in that order,
    and its ZeRO-3 / FSDP buffer bytes. `fp8_params`: whether the layers' weights are quantized alone, where not
    the framework's rule for the layout (a published run that ran otherwise)."""
    shards = layout.dp * layout.context_parallel
    per, per_e = (state_bytes(layout, workload, fw, shards) if memo is None else
                  _memo_state_bytes(layout, workload, fw, shards, memo))
    out = {k: ((params - experts) * v + experts * per_e[k]) / GB for k, v in per.items()}
    alone = False
    if sh.fp8 and not fw.fsdp:     # sharded like the bf16 weights; FSDP2's float8 casts while it gathers
        alone = fw.quantized_params(layout, workload) if fp8_params is None else fp8_params
        quantized_weights(out, workload, per["weights"] * outside_layer_params(workload.model, layout, stage) / GB,
                          alone)
    if fw.fsdp:
        return out, tuple(out.values()), fsdp_buffers(workload.model, layout, stage, shards)
    gathered = zero3_gather_bytes(workload.model, layout.tp, shards, layout.zero_stage)   # quantized layers gather so
    return out, tuple(out.values()), gathered * (quantized_weight_bytes(workload.precision, workload.cluster) / 2.0
                                                 if alone else 1.0)


def _memo_stages(layout: Layout, workload: Workload, fw, stages: tuple, m: int, sh: Shape, memo: dict) -> tuple:
    """(stage_parts, _states_gb) of each of `stages`, kept in `memo`: the parts for the layouts that differ only in
    ZeRO stage, the states for those that differ only in micro-batch, recompute or sp."""
    cut = (layout.tp, layout.context_parallel, layout.pp, layout.virtual_pipeline, layout.pipeline_split,
           layout.expert_parallel, layout.expert_tensor_parallel)
    key = ("stage_parts", cut, layout.sequence_parallel, layout.micro_batch, layout.recompute, layout.offload_layers, m)
    parts = memo.get(key)
    if parts is None:
        parts = memo[key] = [stage_parts(layout, workload, s, m, sh, memo) for s in stages]
    key = ("states_gb", cut, layout.dp, layout.zero_stage, sh.fp8)      # all _states_gb reads of the layout
    states = memo.get(key)
    if states is None:
        states = memo[key] = [_states_gb(layout, workload, fw, s, sh, *pt[:2], memo) for s, pt in zip(stages, parts)]
    return parts, states


def peak_memory(layout: Layout, workload: Workload, m: int, sh: Shape | None = None,
                memo: dict | None = None, loss_chunks: int = LAUNCHED_LOSS_CHUNKS) -> tuple[int, dict]:
    """The worst stage and its breakdown. Stage 0 holds the most micro-batches in flight and the
    embedding; the last stage holds the LM head and the logits; a middle rank is never worse than the
    first one between them with its layers (tuner.layout.stage_candidates: an uneven split's). Of equal
    totals the first candidate; only the worst stage's dict is built. `loss_chunks`: as stage_memory's."""
    from tuner.frameworks import of
    sh, fw = sh or shape_of(layout, workload), of(workload)
    stages = stage_candidates(layout, workload.model)
    parts, states = _memo_stages(layout, workload, fw, stages, m, sh, {} if memo is None else memo)
    worst = None
    for s, pt, st in zip(stages, parts, states):
        got = _stage_sums(layout, workload, fw, sh, pt, st, memo, loss_chunks)
        if worst is None or got[0] > worst[1][0]:        # max()'s choice: the first of the largest
            worst = (s, got)
    return worst[0], _breakdown(*worst[1])


def fit_reason(breakdown: dict, capacity_gb: float, stage: int, buffers: str = "zero3_buffers") -> str:
    """Why a stage does not fit, naming its largest consumers (the zero3_buffers entry as `buffers`)."""
    parts = sorted(((v, buffers if k == "zero3_buffers" else k) for k, v in breakdown.items()
                    if k not in ("total", "params_billion")), reverse=True)
    top = ", ".join(f"{k} {v:.1f}" for v, k in parts[:3])
    return (f"needs {breakdown['total']:.1f} GB per GPU on stage {stage} but the GPU has {capacity_gb:.1f} GB "
            f"(largest: {top} GB)")
