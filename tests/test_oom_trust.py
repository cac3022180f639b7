"""When a cluster's OOM messages are trusted to say what its GPUs hold (task F, gap 3): the median of one or two
messages let one message from a GPU another job shared set every p_fit's capacity. Now the figures that agree --
within the cluster's reserve of their median -- set it where they are most of them; two that disagree leave the
file's capacity (oom_evidence.usable_capacity's docstring says why).

Formats as users posted them: minerva4ai-eu/minerva-benchmarks#42 (two ranks of one run on 64 GB A100s, "GPU 1 has a
total capacity of 63.29 GiB of which 666.69 MiB is free. Including non-PyTorch memory, this process has 62.62 GiB ...",
GPU 2: 758.69 MiB free, 62.53 GiB); a GPU another process shares, as NVML lists it ("Process 3893521 has 618.00 MiB
memory in use. ... Including non-PyTorch memory, this process has 9.74 GiB", FireRedTeam/FireRedTTS2#17) -- figures
here on the same 63.29 GiB GPU."""

from __future__ import annotations

import dataclasses

import pytest

from tuner.oom_evidence import usable_capacity, usable_workload
from tuner.search.guided import GuidedSearcher
from tuner.space import load_space, valid_layouts
from tuner.specs import load_cluster, make_workload
from tuner.trial import oom_capacity_gb

GIB = 2 ** 30 / 1e9
CLUSTER = dataclasses.replace(load_cluster("a100"), memory_gb=63.29 * GIB)      # a 64 GB A100 (Leonardo's)
W = make_workload("22b", 4, cluster=CLUSTER)
RESERVE = CLUSTER.memory_reserved_gb


def alone(gpu: int, free_mib: float, in_use_gib: float) -> str:
    return (f"CUDA out of memory. Tried to allocate 1.96 GiB. GPU {gpu} has a total capacity of 63.29 GiB of which "
            f"{free_mib:.2f} MiB is free. Including non-PyTorch memory, this process has {in_use_gib:.2f} GiB memory "
            f"in use. Of the allocated memory 57.10 GiB is allocated by PyTorch, and 3.51 GiB is reserved by PyTorch "
            f"but unallocated.")


def shared(other_gib: float) -> str:
    mine = 63.29 - other_gib - 0.05
    return (f"CUDA out of memory. Tried to allocate 1.96 GiB. GPU 0 has a total capacity of 63.29 GiB of which 20.00 "
            f"MiB is free. Process 3893521 has {other_gib:.2f} GiB memory in use. Including non-PyTorch memory, this "
            f"process has {mine:.2f} GiB memory in use. Of the allocated memory {mine - 4:.2f} GiB is allocated by "
            f"PyTorch, and 1.00 GiB is reserved by PyTorch but unallocated.")


MINERVA = [alone(1, 666.69, 62.62), alone(2, 758.69, 62.53)]     # the run's own GPUs, nothing else on them


def said(*msgs: str) -> list[float]:
    return [oom_capacity_gb(m, RESERVE) for m in msgs]


def test_one_message_from_a_shared_gpu_does_not_set_the_capacity():
    figures = said(MINERVA[0], shared(24.0))             # 67.9 GB and 42.2 GB: the second had another job beside
    assert usable_capacity(figures, W.cluster.memory_gb) is not None                       # the median of all: 55 GB
    assert usable_workload(W, figures) == (W, None)      # two that disagree: the file's capacity stands
    s = GuidedSearcher(valid_layouts(load_space("frontier-2023"), W), seed=1, workload=W)
    s._note_capacity(shared(24.0))
    assert s.capacity == pytest.approx(oom_capacity_gb(shared(24.0), RESERVE))   # one message: trusted alone
    s._note_capacity(MINERVA[0])
    assert s.capacity == W.cluster.memory_gb             # the next disagrees: neither is trusted


def test_messages_that_agree_set_it_and_a_majority_outvotes_one():
    low = said(shared(24.0), shared(24.5), shared(23.6))    # another job on every GPU: what the job has
    w, why = usable_workload(W, low)
    assert w.cluster.memory_gb == pytest.approx(sorted(low)[1]) and why[1] == 3
    w, why = usable_workload(W, low + said(MINERVA[1]))     # one message of a GPU the job had alone
    assert why[1] == 3 and w.cluster.memory_gb == pytest.approx(sorted(low)[1], abs=0.3)
    w, why = usable_workload(W, said(*MINERVA, shared(24.0)))    # a majority at (about) the GPU's total
    assert why[1] == 2 and w.cluster.memory_gb == pytest.approx(W.cluster.memory_gb, abs=0.05)


def test_consistent_messages_give_what_they_gave():
    # figures within the reserve of each other (the extended worlds' messages are: in use + free, one share per world)
    for figures in ([50.0, 50.4, 49.8], [50.0, 52.9], [40.0], [45.0, 45.0, 46.0, 47.9]):
        assert usable_capacity(figures, W.cluster.memory_gb, RESERVE) == usable_capacity(figures, W.cluster.memory_gb)
