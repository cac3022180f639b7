"""torchtitan's tensor parallelism as DTensor runs it (issue 25 / 26, tuner.perfmodel.comm.dtensor_tp_extra): per-op
selective recompute runs the two sequence-parallel all-gathers again (its save list keeps the reduce-scatters only), and
PyTorch's functional collectives copy the whole activation around every dim-1 reduce-scatter, and around every dim-1
all-gather unless the micro-batch is 1."""

from __future__ import annotations

import pytest

from tuner.layout import Layout
from tuner.perfmodel import comm
from tuner.perfmodel.stages import stage_times
from tuner.specs import make_workload


def _per_layer(layout, w):
    """One layer's TP seconds: the first stage's, less the embedding's all-reduce, over its layers."""
    act = 2.0 * w.model.seq_length * layout.micro_batch * w.model.hidden_size
    return ((stage_times(layout, w)[0]["tp_comm"] - comm.tp_allreduce_time(w.cluster, layout.tp, act))
            / (w.model.num_layers // layout.pp))


def _parts(w, tp, b=1):
    act = 2.0 * w.model.seq_length * b * w.model.hidden_size
    gather = comm.allgather_time(act, tp, comm.group_bandwidth(w.cluster, tp, 1), w.cluster)
    copy = 2.0 * act / (w.cluster.hbm_bandwidth_gbps * 1e9 * w.cluster.memory_bandwidth_efficiency)
    return comm.tp_allreduce_time(w.cluster, tp, act), gather, copy


def test_op_sac_regathers_and_every_reduce_scatter_copies_at_micro_batch_1():
    w = make_workload("llama3-8b", 2, "h100", 64, "bf16", "torchtitan")
    lay = Layout(tp=2, pp=4, dp=2, micro_batch=1, sequence_parallel=True, recompute="selective")
    ar, gather, copy = _parts(w, 2)
    # 4 all-reduces' worth of collectives, the 2 all-gathers again, 4 reduce-scatter copies; the gathers are views
    assert _per_layer(lay, w) == pytest.approx(4 * ar + 2 * gather + 4 * copy)
    none = Layout(tp=2, pp=4, dp=2, micro_batch=1, sequence_parallel=True, recompute="none")
    assert _per_layer(none, w) == pytest.approx(4 * ar + 4 * copy)
    full = Layout(tp=2, pp=4, dp=2, micro_batch=1, sequence_parallel=True, recompute="full")
    assert _per_layer(full, w) == pytest.approx(6 * ar + 6 * copy)      # full recompute: no save list, the forward again


def test_gathers_copy_too_beyond_micro_batch_1():
    w = make_workload("llama3-8b", 2, "h100", 64, "bf16", "torchtitan")
    lay = Layout(tp=2, pp=4, dp=2, micro_batch=2, sequence_parallel=True, recompute="selective")
    ar, gather, copy = _parts(w, 2, 2)
    assert _per_layer(lay, w) == pytest.approx(4 * ar + 2 * gather + (4 + 6) * copy)


def test_megatrons_sequence_parallelism_pays_none_of_it():
    w = make_workload("llama3-8b", 2, "h100", 64, "bf16", "megatron-deepspeed")
    lay = Layout(tp=2, pp=4, dp=2, micro_batch=2, sequence_parallel=True, recompute="selective")
    ar, _, _ = _parts(w, 2, 2)
    assert _per_layer(lay, w) == pytest.approx(4 * ar)
    assert comm.dtensor_tp_extra(w.cluster, 1, 2, "selective", True, 1e9) == 0.0
