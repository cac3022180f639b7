"""Megatron-Core's data-parallel traffic in its buffers' own dtype (issue 25, item 4): the gradients all-reduced
without the distributed optimizer, reduce-scattered with it, then the bf16 parameters all-gathered
(megatron/core/distributed/param_and_grad_buffer.py at d98e8a64dd, start_grad_sync and start_param_sync)."""

from __future__ import annotations

import pytest

from tuner.perfmodel import comm
from tuner.specs import load_cluster

C = load_cluster("h100")
P = 1e9          # parameters on the GPU
DP = 16


def test_megatron_core_reduces_in_its_gradient_dtype():
    ar = comm.allreduce_time
    bw = comm.group_bandwidth(C, DP, 8)
    z0_fp32 = comm.dp_time(C, 8, DP, 0, P, 4, False, grad_bytes=4.0)
    assert z0_fp32 == {"grad_reduce": pytest.approx(ar(4 * P, DP, bw, C)), "param_gather": 0.0}
    z1_bf16 = comm.dp_time(C, 8, DP, 1, P, 4, False, grad_bytes=2.0)
    assert z1_bf16["grad_reduce"] == pytest.approx(comm.reduce_scatter_time(2 * P, DP, bw, C))
    assert z1_bf16["param_gather"] == pytest.approx(comm.allgather_time(2 * P, DP, bw, C))
    # before: every stack's ZeRO-1 was a 2-byte all-reduce and an all-gather (DeepSpeed's, unchanged)
    old = comm.dp_time(C, 8, DP, 1, P, 4, False)
    assert sum(z1_bf16.values()) < sum(old.values())
    z1_fp32 = comm.dp_time(C, 8, DP, 1, P, 4, False, grad_bytes=4.0)
    assert sum(z1_fp32.values()) == pytest.approx(sum(old.values()), rel=1e-2)   # same bytes (half the latencies)
    assert comm.dp_time(C, 8, 1, 1, P, 4, False, grad_bytes=4.0) == {"grad_reduce": 0.0, "param_gather": 0.0}
