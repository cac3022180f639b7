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
The GEMM's own slowdown by chunking and by the SMs the communication kernels hold is not charged: h100.toml's GEMM
curve carries it (docs/benchmarks.md, benchmarks/h100_gap.py).

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
