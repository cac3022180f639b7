"""What an out-of-memory message says of the GPU (issue 30: a 2N pick stated p_fit 1.000 ran out of memory on GPUs
that held less than the cluster file states): PyTorch's message gives the memory the process had -- in use plus free
-- and every p_fit of `best` and of the guided searcher compares with it once an OOM has said it."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest

from tuner.best import best_for_unmeasured
from tuner.layout import Layout
from tuner.oom_evidence import said_capacities, usable_capacity
from tuner.perfmodel import predict
from tuner.search.guided import GuidedSearcher
from tuner.space import load_space, valid_layouts
from tuner.specs import make_workload
from tuner.trial import Status, TrialResult, failed, oom_capacity_gb

GIB = 2 ** 30 / 1e9
# As users quoted them: pytorch/pytorch#16417 (2.1+), a 2.1 message without the process sentence ("capacty"),
# pytorch/pytorch#59778 (before 2.1).
NEW = ("torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 22.00 MiB. GPU 0 has a total capacity of "
       "23.65 GiB of which 11.06 MiB is free. Including non-PyTorch memory, this process has 23.60 GiB memory in use. "
       "Of the allocated memory 22.90 GiB is allocated by PyTorch, and 194.87 MiB is reserved by PyTorch but "
       "unallocated. If reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF")
NO_NVML = ("torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.70 GiB. GPU 0 has a total capacty of "
           "12.00 GiB of which 9.02 GiB is free. Of the allocated memory 984.52 MiB is allocated by PyTorch, and "
           "463.48 MiB is reserved by PyTorch but unallocated.")
OLD = ("RuntimeError: CUDA out of memory. Tried to allocate 2.26 GiB (GPU 0; 6.00 GiB total capacity; 781.59 MiB "
       "already allocated; 3.03 GiB free; 1.24 GiB reserved in total by PyTorch)")


def message(in_use_gb: float, free_gb: float = 0.1, total_gb: float = 68.7, api: str = "HIP") -> str:
    return (f"{api} out of memory. Tried to allocate 1.00 GiB. GPU 3 has a total capacity of {total_gb / GIB:.2f} GiB "
            f"of which {free_gb / GIB * 1024:.2f} MiB is free. Including non-PyTorch memory, this process has "
            f"{in_use_gb / GIB:.2f} GiB memory in use. Of the allocated memory {(in_use_gb - 4) / GIB:.2f} GiB is "
            f"allocated by PyTorch, and 1.00 GiB is reserved by PyTorch but unallocated.")


def test_pytorch_messages_say_the_memory_the_process_had():
    assert oom_capacity_gb(NEW, 3.0) == pytest.approx((23.60 * 1024 + 11.06) * 2 ** 20 / 1e9, rel=1e-9)
    # no process figure: the allocator's reserved bytes, the cluster's reserve outside PyTorch and the free
    assert oom_capacity_gb(NO_NVML, 1.0) == pytest.approx((984.52 + 463.48) * 2 ** 20 / 1e9 + 1.0 + 9.02 * GIB)
    assert oom_capacity_gb(OLD, 1.0) == pytest.approx((1.24 + 3.03) * GIB + 1.0)
    assert oom_capacity_gb(OLD, 5.0) == pytest.approx(6.00 * GIB)          # never more than the GPU's total
    assert oom_capacity_gb("RuntimeError: CUDA error: out of memory", 3.0) is None     # says nothing of how much
    assert oom_capacity_gb(OLD + "\n...\n" + NEW, 3.0) == oom_capacity_gb(NEW, 3.0)     # the last one


def test_a_failed_result_keeps_the_oom_sentence_a_launcher_summary_pushed_out():
    log = "Traceback ...\n" + NEW + "\n" + "torchrun: ChildFailedError, root cause rank 3 ...\n" * 80
    assert NEW[:60] not in log[-2000:]
    r = failed(log, Status.OOM)
    assert len(r.message) <= 2000 and oom_capacity_gb(r.message, 3.0) == oom_capacity_gb(NEW, 3.0)
    assert failed(log, Status.FAILED).message == log[-2000:]


W2, W4 = make_workload("22b", 2), make_workload("22b", 4)


def record(layout: Layout, status: Status, text: str = "", nodes: int = 2, runner: str = "command"):
    return SimpleNamespace(layout=layout, status=status, nodes=nodes, peak_memory_gb=None, mfu=None, model="gpt-22b",
                           cluster="frontier", study="s", runner=runner, global_batch=None, message=text)


def test_best_at_2n_compares_every_p_fit_with_what_the_ooms_said_the_gpus_hold():
    cap = W4.cluster.memory_gb
    usable = 0.8 * cap
    oomed = Layout(tp=8, pp=1, dp=2, micro_batch=4, zero_stage=1, recompute="none")
    recs = [record(oomed, Status.OOM, message(usable - 0.1)), record(replace(oomed, micro_batch=8), Status.OOM,
                                                                         message(usable - 0.2)),
            record(oomed, Status.OOM, message(0.3 * cap), runner="sim")]   # the model's own: says nothing
    said = said_capacities(recs, W4)
    assert len(said) == 2 and usable_capacity(said, cap)[0] == pytest.approx(usable, abs=0.1)
    plain = best_for_unmeasured(W4, load_space("frontier-2023"), [], k=400)
    after = best_for_unmeasured(W4, load_space("frontier-2023"), recs, k=400)
    assert all(r["memory_capacity_gb"] == pytest.approx(usable, abs=0.1) for r in after)
    assert after[0]["evidence"]["usable_memory_gb"] == pytest.approx(usable, abs=0.1)
    assert "usable per GPU" in after[0]["evidence"]["note"] and plain[0]["evidence"]["usable_memory_gb"] is None
    # a layout the model puts between the GPUs' usable memory and the cluster's capacity: sure before, not after
    between = [r["layout"] for r in plain if r["p_fit"] > 0.95 and usable < r["memory_gb"] < cap]
    assert between
    p_after = {r["layout"]: r["p_fit"] for r in after}
    assert all(p_after.get(lay, 0.0) < 0.5 for lay in between)
    assert after[0]["headroom_ok"] and after[0]["memory_gb"] < usable


def test_the_guided_searcher_lowers_its_capacity_when_an_oom_says_so():
    cands = valid_layouts(load_space("frontier-2023"), W2)
    s = GuidedSearcher(cands, seed=1, workload=W2)
    cap = W2.cluster.memory_gb
    assert s.capacity == cap
    between = [i for i, c in enumerate(cands) if 0.75 * cap < predict(c, W2).memory_gb < 0.95 * cap]
    assert between
    before = s.p_fit()[between]
    oomed = cands[between[0]]
    s.tell(oomed, TrialResult(Status.OOM, message="...\n" + message(0.7 * cap, total_gb=cap)))
    assert s.capacity == pytest.approx(0.7 * cap + 0.1, abs=0.02)
    assert (s.p_fit()[between] < before).all() and (s.p_fit()[between] < 0.5).all()
    s2 = GuidedSearcher(cands, seed=1, workload=W2)
    s2.tell(oomed, TrialResult(Status.OOM, message="CUDA error: out of memory"))     # says nothing of how much
    assert s2.capacity == cap
    # a later study warm-started on that history starts from what it said
    s3 = GuidedSearcher(cands, seed=1, workload=W2, history=[record(oomed, Status.OOM, message(0.7 * cap))])
    assert s3.capacity == pytest.approx(0.7 * cap + 0.1, abs=0.02)
