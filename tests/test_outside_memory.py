"""A run that read its caching allocator's reserved peak is counted by the memory correction at that peak plus the
memory its process held outside the allocator as the cluster's OOM messages said it -- PyTorch's "this process has X
in use" less what the allocator reserved (tuner.trial.oom_outside_gb), their median (oom_evidence.outside_gb) -- and
not at the cluster file's reserve, which stands for that memory and the allocator's median share beside allocated
bytes (issue 30 round 49): where the GPUs hold less outside the allocator than the file says, a layout near the
capacity is likelier to fit, in the guided searcher and in `best` at a node count nobody measured; where no message
said it, the reserve stands."""

from __future__ import annotations

import math
from dataclasses import replace
from types import SimpleNamespace

import pytest

from tuner.best import unmeasured_rows
from tuner.layout import Layout
from tuner.oom_evidence import outside_gb, said_outside
from tuner.perfmodel import predict
from tuner.search.guided import GuidedSearcher
from tuner.space import load_space, valid_layouts
from tuner.specs import make_workload
from tuner.trial import Status, TrialResult, oom_outside_gb

GIB = 2 ** 30 / 1e9
SPACE = load_space("frontier-2023")
W2, W4 = make_workload("22b", 2), make_workload("22b", 4)
CAP, RESERVE = W2.cluster.memory_gb, W2.cluster.memory_reserved_gb
BASE = Layout(tp=2, pp=4, dp=2, micro_batch=1, zero_stage=1, recompute="none")
RAN = [replace(BASE, tp=4, dp=1), replace(BASE, pp=8, dp=1), replace(BASE, recompute="full"), BASE,
       replace(BASE, tp=1, pp=8), replace(BASE, micro_batch=2)]
OOMED = replace(BASE, micro_batch=4)
OUTSIDE = 1.0          # GB the process holds outside the allocator (the file's reserve says 3)


def message(outside: float | None) -> str:
    """PyTorch's message of a process that filled the GPU, holding `outside` GB beside the allocator's reserved bytes
    (None: a message that does not name the process, as on a container's PID namespace)."""
    in_use, reserved = CAP - 0.1, CAP - 0.1 - (outside or 0.0)
    this = f"Including non-PyTorch memory, this process has {in_use / GIB:.4f} GiB memory in use. " if outside else ""
    return (f"CUDA out of memory. Tried to allocate 1.00 GiB. GPU 0 has a total capacity of {CAP / GIB:.4f} GiB of "
            f"which {0.1 / GIB:.4f} GiB is free. {this}Of the allocated memory {(reserved - 1) / GIB:.4f} GiB is "
            f"allocated by PyTorch, and {1 / GIB:.4f} GiB is reserved by PyTorch but unallocated.")


def test_the_message_says_what_the_process_held_outside_the_allocator():
    assert oom_outside_gb(message(OUTSIDE)) == pytest.approx(OUTSIDE, abs=1e-3)
    assert oom_outside_gb(message(None)) is None and oom_outside_gb("killed") is None
    assert outside_gb([1.0, 3.0, 1.4]) == 1.4 and outside_gb([]) is None


def run(layout: Layout) -> TrialResult:
    """An ok run at 2 nodes whose allocator reserved what the model predicts less the file's reserve, 0.94 of it
    allocated: the GPU needed that plus OUTSIDE."""
    reserved = predict(layout, W2).memory_gb - RESERVE
    return TrialResult(Status.OK, mfu=predict(layout, W2).mfu, peak_memory_gb=0.94 * reserved,
                       peak_reserved_gb=reserved)


def searcher(outside: float | None) -> GuidedSearcher:
    s = GuidedSearcher(valid_layouts(SPACE, W2), workload=W2)
    for lay in RAN:
        s.tell(lay, run(lay))
    s.tell(OOMED, TrialResult(Status.OOM, message=message(outside)))
    return s


def test_the_searcher_counts_a_reserved_peak_with_what_its_ooms_said_was_outside():
    said, unsaid = searcher(OUTSIDE), searcher(None)
    assert said.capacity == unsaid.capacity == CAP and said.own.outside_gb == pytest.approx(OUTSIDE, abs=1e-3)
    assert unsaid.own.outside_gb is None
    obs = said._memory_obs()
    for lay, y, y_now in zip(RAN, obs.memory_y(), obs.my):    # each peak counted at reserved + 1 GB, not + 3
        need = predict(lay, W2).memory_gb - RESERVE
        assert y_now == pytest.approx(math.log((need + RESERVE) / predict(lay, W2).memory_gb))
        assert y == pytest.approx(math.log((need + OUTSIDE) / predict(lay, W2).memory_gb), abs=1e-3)
    p, q = said.p_fit(), unsaid.p_fit()
    edge = [i for i in range(len(q)) if 0.3 < q[i] < 0.9]
    assert len(edge) >= 5 and all(p[i] > q[i] for i in edge)


def record(layout: Layout, result: TrialResult):
    return SimpleNamespace(layout=layout, status=result.status, nodes=2, mfu=result.mfu, model="gpt-22b",
                           cluster="frontier", study="s", runner="command", global_batch=None,
                           peak_memory_gb=result.peak_memory_gb, peak_reserved_gb=result.peak_reserved_gb,
                           message=result.message)


def test_best_at_a_node_count_nobody_measured_counts_them_alike():
    recs = {o: [record(lay, run(lay)) for lay in RAN] + [record(OOMED, TrialResult(Status.OOM, message=message(o)))]
            for o in (OUTSIDE, None)}
    assert said_outside(recs[OUTSIDE], W4) == [pytest.approx(OUTSIDE, abs=1e-3)] and said_outside(recs[None], W4) == []
    rows = {o: {r["layout"]: r["p_fit"] for r in unmeasured_rows(W4, SPACE, recs[o])[0]} for o in recs}
    edge = [lay for lay, q in rows[None].items() if 0.3 < q < 0.9]
    assert len(edge) >= 5 and all(rows[OUTSIDE][lay] > rows[None][lay] for lay in edge)
