"""Every layout's memory answer at once: `plan`'s count of what may fit, for the largest plans (~150,000 layouts).

`memory_fit` (tuner.perfmodel) answers one layout in ~25 us of Python; `screen_memory` answers a whole list with the
same floats, bit for bit: the total every command states (the worst stage's peak with the framework's measured bias)
and p_fit. What the layouts have in common is computed once by the scalar functions themselves -- each model cut's
stages and parameters (memory.stage_params, stage_expert_params), each (cut, ZeRO stage)'s model states
(memory._states_gb), each Shape's per-layer activations, loss, logits and layer backward (memory.layer_activation_bytes,
megatron_loss_bytes, logits_bytes, sp_gather_bytes, layer_backward.megatron_backward_bytes) -- and what differs per
layout and stage is done over columns (numpy): memory.stage_activation_bytes' in-flight passes, megatron_phases'
choice, _stage_sums' total in the same order of additions, peak_memory's worst stage (the first of the largest),
with_measured_bias, memory_shares and account_sd; gpu_fit_probability's log / hypot / erfc (or, where the framework's
account was measured, fit.errors_fit_probability itself) run per layout with `math`, as the scalar path runs them. IEEE arithmetic (+ - * / sqrt) gives the same double in numpy as in Python, so the order
of operations is all that has to match; tests/test_plan_speed.py holds the two paths equal on every layout of several
workloads, and a change to those memory formulas must be made here too (the test fails until it is; plan checks a
sample of each run against memory_fit and answers with memory_fit where they differ).

Not for FSDP frameworks (torchtitan: fsdp_phases) nor Python >= 3.12, whose sum() of floats compensates its
rounding: `screen_memory` answers None there and the caller asks memory_fit per layout.
"""

from __future__ import annotations

import math
import operator
import sys

import numpy as np

from tuner.frameworks import ALLOCATOR_BIAS, ALLOCATOR_SD, of as framework_of
from tuner.layout import LAYOUT_FIELDS, Layout, stage_candidates, stage_layers, stage_moe_layers
from tuner.perfmodel import memory
from tuner.perfmodel.compute import shape_of
from tuner.perfmodel.layer_backward import megatron_backward_bytes
from tuner.perfmodel.fit import errors_fit_probability, memory_gp_scales
from tuner.perfmodel.memory_loss import megatron_loss_bytes
from tuner.perfmodel.offload import resident_layers
from tuner.specs import Workload

GB = memory.GB
#: A layout's fields the memory reads: the model's cut (with dp), then sp, micro-batch, recompute and ZeRO stage.
CUT = ("tp", "context_parallel", "pp", "virtual_pipeline", "pipeline_split", "expert_parallel", "expert_tensor_parallel",
       "dp")
PARTS = (*CUT, "sequence_parallel", "micro_batch", "recompute", "offload_layers")  # what stage_parts reads (m follows)
STATES = (*CUT, "zero_stage")                                           # what _states_gb reads
SHAPE = ("micro_batch", "tp", "context_parallel", "sequence_parallel", "recompute", "expert_parallel",
         "expert_tensor_parallel")                                      # what shape_of reads of a layout


def supported(workload: Workload) -> bool:
    """Whether screen_memory answers for the workload (not FSDP; Python's sum() not compensated)."""
    return not framework_of(workload).fsdp and sys.version_info < (3, 12)


def screen_memory(layouts: list[Layout], workload: Workload) -> tuple[list[float], list[float]] | None:
    """(each layout's memory_gb, its p_fit): memory_fit's total and p_fit for every layout, in order; None where not
    `supported` (the caller then asks memory_fit)."""
    if not supported(workload) or not layouts:
        return None
    cols = _columns(layouts)
    cuts = _Cuts(layouts, workload, *_group(cols, CUT))
    part_of, part_first = _group(cols, PARTS)
    state_of, state_first = _group(cols, STATES)
    shape_of_group = _group(cols, SHAPE)[0][part_first]
    parts = _parts(layouts, workload, cols, part_first, shape_of_group, cuts)       # (group, stage) columns
    states = _states(layouts, workload, state_first, cuts)
    mems, p_fits = _fit(workload, parts, part_of, states, state_of)
    if workload.cluster.host_memory_gb:      # as memory_fit: offloading beyond the host's memory does not fit
        p_fits = [p if not lay.offload_layers or memory.host_fits(lay, workload) else 0.0
                  for lay, p in zip(layouts, p_fits)]
    return mems, p_fits


def _columns(layouts: list[Layout]) -> dict:
    """Each field of a layout as an int column (a str field: its values numbered)."""
    rows = np.array(list(map(operator.attrgetter(*LAYOUT_FIELDS), layouts)), dtype=object)
    cols = {}
    for j, name in enumerate(LAYOUT_FIELDS):
        column = rows[:, j]
        if isinstance(column[0], str):
            codes = np.zeros(len(column), np.int64)
            for k, value in enumerate(sorted(set(column.tolist()))):
                codes[column == value] = k
            cols[name] = codes
        else:
            cols[name] = column.astype(np.int64)
    return cols


def _group(cols: dict, names: tuple) -> tuple:
    """Each row's group of equal `names` columns (0, 1, ... in the order of the groups' keys) and each group's first
    row."""
    key = np.zeros(len(cols[names[0]]), np.int64)
    for name in names:                       # one mixed-radix number per row (each column's values renumbered)
        values, inverse = np.unique(cols[name], return_inverse=True)
        key = key * len(values) + inverse.ravel()
    _, first, of = np.unique(key, return_index=True, return_inverse=True)
    return of.ravel(), first


class _Cuts:
    """Per model cut (CUT): its candidate stages, each one's layer counts and parameters."""

    def __init__(self, layouts: list[Layout], workload: Workload, of, first):
        self.of, self.stages, self.layers, self.params = of, [], [], []
        model = workload.model
        for i in first.tolist():
            lay = layouts[i]
            stages = stage_candidates(lay, model)
            self.stages.append(stages)
            self.layers.append([_layer_counts(lay, model, s) for s in stages])
            self.params.append([(memory.stage_params(model, lay, s), memory.stage_expert_params(model, lay, s))
                                for s in stages])
        self.pp = np.array([layouts[i].pp for i in first.tolist()], np.int64)
        self.vp = np.array([layouts[i].virtual_pipeline for i in first.tolist()], np.int64)
        self.width = max(len(st) for st in self.stages)

    def columns(self) -> list:
        """Per cut: (stage, dense layers, MoE layers, valid) padded to the most stages, and its pp and vp."""
        stage, dense, moe = (np.zeros((len(self.stages), self.width), np.int64) for _ in range(3))
        valid = np.zeros((len(self.stages), self.width), bool)
        for c, (stages, layers) in enumerate(zip(self.stages, self.layers)):
            for j, (s, (d, e)) in enumerate(zip(stages, layers)):
                stage[c, j], dense[c, j], moe[c, j], valid[c, j] = s, d, e, True
        return [stage, dense, moe, valid, self.pp, self.vp]


def _layer_counts(lay: Layout, model, stage: int) -> tuple[int, int]:
    """(dense, MoE) layers whose activations the stage keeps (memory.stage_activation_bytes: with the MTP modules')."""
    moe = stage_moe_layers(lay, model, stage)
    dense = stage_layers(lay, model.num_layers, stage) - moe
    if stage == lay.pp - 1 and model.mtp_num_layers:
        moe, dense = (moe + model.mtp_num_layers, dense) if model.is_moe else (moe, dense + model.mtp_num_layers)
    return dense, moe


def _shape_terms(lay: Layout, workload: Workload, sh, fw) -> tuple:
    """What memory reads of a Shape: a layer's (full dense, full MoE, checkpoint) bytes, full recompute's working
    layer, the sp gather buffer, the last stage's logits and Megatron-Core's loss bytes."""
    model, flash = workload.model, workload.cluster.flash_attention
    full_dense, full_moe, ckpt = memory.layer_activation_bytes(model, sh, flash)
    gather = memory.sp_gather_bytes(model, sh) if fw.sp_gather_buffer and sh.sp and lay.tp > 1 else 0.0
    logits = (1 + model.mtp_num_layers) * memory.logits_bytes(model, sh.tokens, lay.tp)
    loss = (1 + model.mtp_num_layers) * megatron_loss_bytes(model, lay.tp, sh.sp, sh.tokens)
    return full_dense, full_moe, ckpt, memory._working_bytes(model, sh, flash, None), gather, logits, loss


def _parts(layouts: list[Layout], workload: Workload, cols: dict, firsts, shape_ids, cuts: _Cuts) -> dict:
    """Each group's candidate stages as (group, stage) columns, padded to the most stages (`valid` False): the
    activation and logits bytes in GB as _stage_sums adds them (after megatron_phases)."""
    fw, model = framework_of(workload), workload.model
    shapes, backward = {}, {}
    pps = cols["pp"][firsts].tolist()
    for sid, i, pp in zip(shape_ids.tolist(), firsts.tolist(), pps):
        if sid not in shapes:
            sh = shape_of(layouts[i], workload)
            shapes[sid] = (sh, _shape_terms(layouts[i], workload, sh, fw))
        if fw.megatron_loss and (sid, pp) not in backward:      # a layer's backward (memory.megatron_phases)
            sh = shapes[sid][0]
            backward[(sid, pp)] = megatron_backward_bytes(model, sh.t, sh.sp, sh.tokens, pp, sh.recompute)
    terms = np.array([shapes[s][1] for s in range(len(shapes))], dtype=np.float64)[shape_ids]
    layer_backward = np.array([backward.get(sp, 0.0) for sp in zip(shape_ids.tolist(), pps)], dtype=np.float64)
    m = workload.global_batch // (cols["micro_batch"][firsts] * cols["dp"][firsts])     # micro_batches_per_pipeline
    full = np.array([layouts[i].recompute == "full" for i in firsts.tolist()])
    layers = model.num_layers                  # offloading (pp 1): the layers kept on the GPU (memory.stage_activation_bytes)
    kept = np.array([resident_layers(layers, layouts[i].offload_layers) for i in firsts.tolist()], np.int64)
    return _activations(fw, np.column_stack([terms, layer_backward]), m, full,
                        [a[cuts.of[firsts]] for a in cuts.columns()], (kept, layers))


def _activations(fw, terms, m, full, per_cut: list, offload: tuple) -> dict:
    """memory.stage_activation_bytes (+ the sp gather buffer) and _stage_sums' megatron_phases over (group, stage);
    `offload`: each group's layers resident under CPU offloading, and the model's layers."""
    stage, dense, moe, valid, pp, vp = per_cut
    pp, vp, m, full = pp[:, None], vp[:, None], m[:, None], full[:, None]
    full_dense, full_moe, ckpt, working, gather, logits_b, loss, layer_backward = (terms[:, k][:, None]
                                                                                  for k in range(8))
    full_moe = np.where(moe > 0, full_moe, 0.0)
    boundary = np.where(pp > 1, ckpt, 0.0) if not fw.frees_pipeline_outputs else np.zeros_like(ckpt)
    per_pass = np.where(full, (dense + moe) / vp * ckpt + boundary, (dense * full_dense + moe * full_moe) / vp + boundary)
    kept, layers = offload[0][:, None], offload[1]
    per_pass = np.where(kept < layers, per_pass * kept / layers, per_pass)
    work = np.where(full, np.maximum(np.where(dense > 0, full_dense, 0.0), full_moe) - ckpt, 0.0)
    flight = np.where(vp == 1, np.maximum(1, np.minimum(pp - stage, m)),
                      np.maximum(1, np.minimum(2 * (pp - stage - 1) + (vp - 1) * pp + 1, m * vp)))
    act = flight * per_pass + work + gather          # gather: 0.0 where there is no sp gather buffer
    logits = np.where(stage == pp - 1, logits_b, 0.0)
    if fw.megatron_loss:       # a layer's backward; on the last stage its loss's peak where larger (the first of equals)
        backward, cut_act = act + layer_backward, act - working
        last = logits != 0.0
        loss_peak = last & ~(backward > cut_act + loss)
        act = np.where(loss_peak, cut_act, backward)
        logits = np.where(loss_peak, loss, 0.0)
    return {"act": act / GB, "logits": logits / GB, "valid": valid}


def _states(layouts: list[Layout], workload: Workload, firsts, cuts: _Cuts) -> tuple:
    """Per (cut, ZeRO stage) and candidate stage: the model states in GB (weights, gradients, optimizer, FP8
    weights), their sum in _stage_sums' order, the ZeRO-3 buffers in GB (memory._states_gb) and the optimizer step's
    gradient copies in GB (memory.step_copy_bytes)."""
    fw, memo, firsts = framework_of(workload), {}, firsts.tolist()
    sv = np.zeros((len(firsts), cuts.width, 4))
    sums, bufs, steps = (np.zeros((len(firsts), cuts.width)) for _ in range(3))
    sh = shape_of(layouts[0], workload)                # _states_gb reads the workload's GEMM format of it alone
    for g, (i, c) in enumerate(zip(firsts, cuts.of[firsts].tolist())):
        lay = layouts[i]
        for j, (s, (params, experts)) in enumerate(zip(cuts.stages[c], cuts.params[c])):
            out, values, buffers = memory._states_gb(lay, workload, fw, s, sh, params, experts, memo)
            sv[g, j] = [out.get(k, 0.0) for k in ("weights", "gradients", "optimizer", "fp8_weights")]
            sums[g, j], bufs[g, j] = sum(values), buffers / GB
            steps[g, j] = memory.step_copy_bytes(lay, workload, fw, params, experts) / GB
    return sv, sums, bufs, steps


def _fit(workload: Workload, parts: dict, part_of, states: tuple, state_of) -> tuple[list[float], list[float]]:
    """peak_memory's worst stage (the first of the largest total), then breakdown_fit: the measured bias, the shares,
    account_sd and gpu_fit_probability (per layout, with math), or errors_fit_probability (fit.prior_fit_probability)."""
    fw, sv, sums, bufs, steps = framework_of(workload), *states
    reserved = workload.cluster.memory_reserved_gb
    act, logits, bufs = parts["act"][part_of], parts["logits"][part_of], bufs[state_of]
    bufs = bufs + np.maximum(0.0, steps[state_of] - act - logits - bufs)   # memory._stage_sums' step phase
    total = sums[state_of] + act + logits + bufs + reserved      # sum((*state_values, *values))
    worst = np.where(parts["valid"][part_of], total, -np.inf).argmax(axis=1)[:, None]
    pick = lambda a: np.take_along_axis(a, worst, axis=1)[:, 0]           # noqa: E731
    total, act, logits, buf = pick(total), pick(act), pick(logits), pick(bufs)
    states_gb = np.take_along_axis(sv[state_of], worst[:, :, None], axis=1)[:, 0, :]
    bias = (total - reserved) * math.expm1(fw.memory_bias) if fw.memory_bias else np.zeros_like(total)
    if fw.memory_bias:
        total = total + bias
    if fw.memory_errors:                # fit.prior_fit_probability: the empirical errors, no shares
        mem, cap = total.tolist(), workload.cluster.memory_gb
        return mem, [errors_fit_probability(m, cap, fw.memory_errors) for m in mem]
    values = [*states_gb.T, act, logits, buf, np.full_like(total, reserved), bias]      # fit.MEMORY_KEYS' order
    whole = values[0] + values[1]
    for v in values[2:]:
        whole = whole + v
    whole = np.where(whole == 0.0, 1.0, whole)
    squares = (values[0] / whole) * (values[0] / whole)
    for v in values[1:]:
        squares = squares + (v / whole) * (v / whole)
    s_c, s_w, s_g = memory_gp_scales(fw.memory_sd)
    sd = np.sqrt(s_c ** 2 + s_w ** 2 * squares + s_g ** 2)
    mem = total.tolist()
    return mem, _p_fits(mem, sd.tolist(), workload.cluster.memory_gb)


def _p_fits(mem: list[float], sd: list[float], capacity: float) -> list[float]:
    """gpu_fit_probability of each (memory, account sd), inlined: fit_probability with the allocator's share."""
    top, root2, hypot, log, erfc = math.log(capacity), math.sqrt(2.0), math.hypot, math.log, math.erfc
    return [0.5 * erfc(-((top - log(max(m, 1e-9)) - ALLOCATOR_BIAS) / max(hypot(s, ALLOCATOR_SD), 1e-6)) / root2)
            for m, s in zip(mem, sd)]
