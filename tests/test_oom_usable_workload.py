"""best and the guided searcher take the GPUs' usable capacity from one function (oom_evidence.usable_workload):
the workload on what the OOMs' messages said the GPUs hold, and why (GB, how many said it, the file's GB)."""

from __future__ import annotations

import pytest

from tuner.oom_evidence import usable_workload
from tuner.search.guided import GuidedSearcher
from tuner.space import load_space, valid_layouts
from tuner.specs import make_workload

W = make_workload("22b", 2)


def test_usable_workload_lowers_the_capacity_only_where_the_messages_say_less():
    cap = W.cluster.memory_gb
    w, why = usable_workload(W, [0.8 * cap, 0.82 * cap, 0.81 * cap])
    assert w.cluster.memory_gb == pytest.approx(0.81 * cap) and why == (pytest.approx(0.81 * cap), 3, cap)
    assert w.cluster.name == W.cluster.name and w.model == W.model and W.cluster.memory_gb == cap   # a copy
    assert usable_workload(W, []) == (W, None) and usable_workload(W, [cap + 1.0]) == (W, None)


def test_the_guided_searcher_reads_its_capacity_through_it():
    cands = valid_layouts(load_space("frontier-2023"), W)
    s = GuidedSearcher(cands, seed=1, workload=W)
    gib = 2 ** 30 / 1e9
    msg = (f"HIP out of memory. Tried to allocate 1.00 GiB. GPU 0 has a total capacity of {W.cluster.memory_gb / gib:.2f}"
           f" GiB of which 100.00 MiB is free. Including non-PyTorch memory, this process has {50.0 / gib:.2f} GiB "
           "memory in use. Of the allocated memory 40.00 GiB is allocated by PyTorch, and 1.00 GiB is reserved by "
           "PyTorch but unallocated.")
    assert s._note_capacity(msg) and s.said == [pytest.approx(50.1, abs=0.01)]
    assert s.capacity == usable_workload(W, s.said)[0].cluster.memory_gb == pytest.approx(50.1, abs=0.01)
    assert not s._note_capacity("RuntimeError: CUDA error: out of memory")     # no figure: the capacity stays
