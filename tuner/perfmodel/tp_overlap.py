"""What of a layer's tensor-parallel collectives shows under Megatron-Core's --tp-comm-overlap (Transformer Engine's
userbuffers, with sequence parallelism): each collective is bound to one GEMM and hides under that GEMM alone, not
under the layer's GEMMs together. Pure.

Transformer Engine pairs them in `initialize_ub` (NVIDIA/TransformerEngine @ d0067d0d,
transformer_engine/pytorch/module/base.py): forward, the all-gather of the sequence-parallel input runs as a ring
exchange under the QKV and fc1 GEMMs ("ring_exchange": qkv_fprop, fc1_fprop), the reduce-scatter of the output as a
pipeline under the attention projection and fc2 GEMMs ("pipeline": proj_fprop, fc2_fprop); backward, the all-gather
of the output gradient under the projection's and fc2's data-gradient GEMMs (ring exchanges: proj_dgrad, fc2_dgrad),
and for QKV and fc1 the re-gather of the input under the data-gradient GEMM and the reduce-scatter of the input
gradient under the weight-gradient GEMM ("bulk": qkv_dgrad / qkv_wgrad, fc1_dgrad / fc1_wgrad). All-gather buffers
hold FP8 when the GEMMs run in FP8 (`fp8_buf`: the names in layers_all_gather_overlap); reduce-scatters move bf16.

How long each shows (transformer_engine/common/comm_gemm_overlap/comm_gemm_overlap.cpp, same commit):
- ring exchange (CommOverlapP2PBase::split_overlap_ag): the GEMM runs in tp chunks along the tokens; chunk 0 is the
  rank's own shard, each later chunk waits for the p2p step that brings its shard (tp - 1 steps), so the transfer
  shows by what it outlasts tp - 1 of the tp chunks: max(0, c - g (tp - 1) / tp);
- pipeline (CommOverlapBase::split_overlap_rs): the GEMM runs in num_splits = 4 chunks (TE's default and NeMo's
  H100 settings), chunk i's reduce-scatter after GEMM chunk i, so the last chunk's always shows:
  max(c / 4, c - g 3 / 4);
- bulk (CommOverlapBase::bulk_overlap): the transfer is launched beside the whole GEMM: max(0, c - g).
The GEMM's own slowdown by chunking and by the SMs the communication kernels hold (`gemm_cost_seconds`) is charged
only where a cluster file says its GEMM curve is a kernel measurement that does not carry it (`tp_overlap_gemm_cost`,
with `sm_count`: b200.toml, gb200.toml); h100.toml's guessed curve carries it (docs/benchmarks.md,
benchmarks/h100_gap.py).

A mixture-of-experts layer without shared experts runs the attention's collectives only (`mlp` False): Megatron-Core's
MoE block routes the rank's own sequence-parallel tokens and moves them in the dispatcher, with no TP collective at
expert-TP 1 (stages.attention_tp_only). With shared experts it is charged as the model's dense layer (the shared experts'
fc1 / fc2 gather and reduce-scatter the whole activation, as a dense FFN; their pairs hide under the dense FFN's
GEMMs, ffn_hidden_size wide, an approximation). stages._layer_comms caps the result at the non-overlapped time.
"""

from __future__ import annotations

from tuner.perfmodel import comm, compute
from tuner.specs import ClusterSpec, ModelSpec

PIPELINE_SPLITS = 4          # num_splits of TE's "pipeline" reduce-scatter overlap (its default; NeMo's H100 configs)
#: Megatron-Bridge's TP-overlap settings for B200 (NVIDIA-NeMo/Megatron-Bridge @ 067f987d
#: src/megatron/bridge/training/comm_overlap.py, userbuffers_{bf16,fp8}_b200_h16384_tp4_cp2_mbs1_seqlen8192), per GEMM
#: (qkv, proj, fc1, fc2) and pass: (method, chunks: 0 = tp, SMs the communication holds); its Llama 3.1 405B
#: performance configs give them to B200, GB200, B300 and GB300 alike (and set tp_comm_overlap False for NVFP4, @
#: c8327cfc2~1 scripts/performance/configs/llama/llama31_llm_pretrain.py). Taken for every model width: the one
#: Blackwell table its recipes share (its 70B tp2 settings hold 32 / 16 SMs where these hold 32 / 8). A bulk overlap
#: there sets set_sm_margin False (BulkOverlapCfg), so the GEMM keeps every SM and loses the comm kernel's while the
#: transfer runs; a pipeline sets it True: the GEMM runs on sm_count - num_sm SMs throughout (comm_gemm_overlap.cpp
#: line 143, `_math_sms`).
BLACKWELL_USERBUFFERS = {
    "bf16": {"fprop": (("ring", 0, 0), ("pipeline", 4, 32), ("ring", 0, 0), ("pipeline", 4, 8)),
             "dgrad": (("bulk", 1, 8), ("ring", 0, 0), ("bulk", 1, 2), ("ring", 0, 0)),
             "wgrad": (("bulk", 1, 24), None, ("bulk", 1, 2), None)},
    "fp8": {"fprop": (("ring", 0, 0),) * 4,
            "dgrad": (("bulk", 1, 8), ("ring", 0, 0), ("bulk", 1, 2), ("ring", 0, 0)),
            "wgrad": (("bulk", 1, 32), None, ("bulk", 1, 8), None)}}


def table_key(fp8: bool | str) -> str:
    """Which of a settings table's precisions runs GEMMs in `fp8` (compute.Shape.fp8): "fp8" for FP8, MXFP8 and NVFP4
    (their GEMMs take the FP8 settings), else "bf16"."""
    return "fp8" if fp8 else "bf16"


def charged_table(cluster: ClusterSpec, fp8: bool | str) -> dict | None:
    """The BLACKWELL_USERBUFFERS table (fprop / dgrad / wgrad) gemm_cost_seconds charges on `cluster` for GEMMs in
    `fp8`, or None where the cluster's file charges none (no `tp_overlap_gemm_cost` with `sm_count`). `tuner launch`
    writes the one returned as Megatron-LM's --tp-comm-overlap-cfg file (tuner.render.userbuffers)."""
    if not (cluster.tp_overlap_gemm_cost and cluster.sm_count):
        return None
    return BLACKWELL_USERBUFFERS[table_key(fp8)]


def ring(c: float, g: float, tp: int) -> float:
    """A ring-exchange all-gather's exposed seconds beside a GEMM of `g` seconds split into tp chunks."""
    return max(0.0, c - g * (tp - 1) / tp)


def pipeline(c: float, g: float, splits: int = PIPELINE_SPLITS) -> float:
    """A pipelined reduce-scatter's exposed seconds beside a GEMM of `g` seconds in `splits` chunks."""
    return max(c / splits, c - g * (splits - 1) / splits)


def bulk(c: float, g: float) -> float:
    """A bulk transfer's exposed seconds beside a whole GEMM of `g` seconds."""
    return max(0.0, c - g)


def exposed_seconds(model: ModelSpec, cluster: ClusterSpec, sh: compute.Shape, mlp: bool = True) -> float:
    """A dense layer's TP collectives shown per micro-batch (forward, its full recompute, backward) when each hides
    under its own GEMM as Transformer Engine pairs them (module docstring); `mlp` False: the attention's alone."""
    t = sh.t
    qkv, proj, fc1, fc2 = (compute.gemm_time(cluster, f, sh.fp8)
                           for f in compute.layer_gemm_flops(model, sh.tokens, t))
    act = 2.0 * model.seq_length * sh.tokens * model.hidden_size          # one bf16 activation, whole
    rs = 0.5 * comm.tp_allreduce_time(cluster, t, act)
    ag = 0.5 * comm.tp_allreduce_time(cluster, t, act / 2.0 if sh.fp8 == "fp8" else act)
    b = sh.backward_gemm
    forward = ring(ag, qkv, t) + pipeline(rs, proj)
    backward = ring(ag, proj * b, t) + bulk(ag, qkv * b) + bulk(rs, qkv * b)
    if mlp:
        forward += ring(ag, fc1, t) + pipeline(rs, fc2)
        backward += ring(ag, fc2 * b, t) + bulk(ag, fc1 * b) + bulk(rs, fc1 * b)
    return forward * (2.0 if sh.recompute == "full" else 1.0) + backward


def overlapped_gemm_seconds(model: ModelSpec, cluster: ClusterSpec, sh: compute.Shape, settings: dict, sms: int,
                            mlp: bool = True) -> float:
    """A dense layer's GEMM seconds per micro-batch (forward, its full recompute, both backward GEMMs) run as
    `settings` (per precision, per pass, per GEMM: (method, chunks, SMs held), BLACKWELL_USERBUFFERS' form) runs them
    out of `sms` SMs: a ring exchange's and a pipeline's chunks one after another on the GEMM curve (chunks 0: tp); a
    pipeline's SMs lost for the whole GEMM, a bulk transfer's while it lasts (the sequence's all-gather /
    reduce-scatter over the TP group, as comm.py times it). `mlp` False: the attention's QKV and projection alone."""
    flops = compute.layer_gemm_flops(model, sh.tokens, sh.t)[:4 if mlp else 2]
    act = 2.0 * model.seq_length * sh.tokens * model.hidden_size
    transfer = comm.reduce_scatter_time(act, sh.t, comm.group_bandwidth(cluster, sh.t, 1), cluster)
    cfg = settings[table_key(sh.fp8)]

    def run(f: float, how) -> float:
        if how is None:
            return compute.gemm_time(cluster, f, sh.fp8)
        method, chunks, held = how
        n = chunks or sh.t
        t, share = n * compute.gemm_time(cluster, f / n, sh.fp8), held / sms
        if method == "pipeline":
            return t / (1.0 - share)
        return t + min(transfer * share, t * share / (1.0 - share)) if method == "bulk" else t

    fwd = sum(run(f, how) for f, how in zip(flops, cfg["fprop"]))
    bwd = sum(run(f, a) + run(f, b) for f, a, b in zip(flops, cfg["dgrad"], cfg["wgrad"]))
    return fwd * (2.0 if sh.recompute == "full" else 1.0) + bwd * sh.backward_gemm


def gemm_cost_seconds(model: ModelSpec, cluster: ClusterSpec, sh: compute.Shape, mlp: bool = True) -> float:
    """What Transformer Engine's TP overlap itself costs a dense layer's GEMMs per micro-batch (BLACKWELL_USERBUFFERS
    run against the same GEMMs whole on every SM), where the cluster's file charges it (`tp_overlap_gemm_cost`, with
    `sm_count`; module docstring), else 0."""
    if charged_table(cluster, sh.fp8) is None or sh.t <= 1:
        return 0.0
    flops = compute.layer_gemm_flops(model, sh.tokens, sh.t)[:4 if mlp else 2]
    whole = sum(compute.gemm_time(cluster, f, sh.fp8) for f in flops)
    plain = whole * (2.0 if sh.recompute == "full" else 1.0) + 2.0 * whole * sh.backward_gemm
    return max(0.0, overlapped_gemm_seconds(model, cluster, sh, BLACKWELL_USERBUFFERS, cluster.sm_count, mlp) - plain)
