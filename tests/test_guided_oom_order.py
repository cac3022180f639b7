"""The guided searcher's p_fit does not depend on the order its OOMs came in (review of 96f3756 / cceee66): each OOM
bounds its layout's need at the capacity then in force (log(capacity / predicted)), and the usable capacity moves with
later messages -- down where they agree, back up to the file's where one disagrees (96f3756) --, so the same OOMs told
in another order left bounds at another capacity: two OOMs (one without PyTorch's sentence, one at 0.7 of the capacity)
moved p_fit by up to 0.27 between the orders, and a disagreeing pair (0.7 and 0.98 of it) by up to 0.70, on 83 of 322
candidates, at the same final capacity. Now every bound, the history's too, is at the capacity p_fit compares with."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from tests.test_guided_usable_fit import BETWEEN, CANDS, CAP, W2, message
from tuner.correction import OOM_MARGIN, features
from tuner.perfmodel import predict
from tuner.search.guided import GuidedSearcher
from tuner.trial import Status, TrialResult

BY_MEMORY = sorted(BETWEEN, key=lambda i: predict(CANDS[i], W2).memory_gb)
A, B = CANDS[BY_MEMORY[-1]], CANDS[BY_MEMORY[len(BY_MEMORY) // 2]]
NO_FIGURE = TrialResult(Status.OOM, message="RuntimeError: CUDA error: out of memory")


def p_fit_after(*told) -> tuple[float, np.ndarray]:
    s = GuidedSearcher(CANDS, seed=1, workload=W2)
    for layout, result in told:
        s.tell(layout, result)
    return s.capacity, s.p_fit()


@pytest.mark.parametrize("first, second", [(NO_FIGURE, 0.7), (0.98, 0.7)])
def test_the_same_ooms_in_either_order_give_the_same_p_fit(first, second):
    ra = first if isinstance(first, TrialResult) else TrialResult(Status.OOM, message=message(first * CAP))
    rb = TrialResult(Status.OOM, message=message(second * CAP))
    cap1, p1 = p_fit_after((A, ra), (B, rb))
    cap2, p2 = p_fit_after((B, rb), (A, ra))
    assert cap1 == cap2
    assert np.abs(p1 - p2).max() < 1e-9


def test_a_history_ooms_bound_follows_the_capacity():
    rec = SimpleNamespace(layout=A, status=Status.OOM, nodes=2, peak_memory_gb=None, mfu=None, model=W2.model.name,
                          cluster=W2.cluster.name, study="old", runner="command", global_batch=None, message="")
    s = GuidedSearcher(CANDS, seed=1, workload=W2, history=[rec])
    log_mem = features(A, W2).log_mem
    assert s.history.oy == [pytest.approx(max(np.log(CAP) - log_mem, 0.0) + OOM_MARGIN)]
    s.tell(B, TrialResult(Status.OOM, message=message(0.7 * CAP)))
    assert s.capacity < CAP
    assert s.history.oy == [pytest.approx(max(np.log(s.capacity) - log_mem, 0.0) + OOM_MARGIN)]
