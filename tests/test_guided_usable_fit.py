"""The guided searcher's first picks keep the memory headroom of the usable capacity the OOMs' messages said
(review of cceee66): at the study's first OOM (its headroom was recomputed before that OOM was an observation, so
from the prior at the file's capacity) and where the history's messages come from another framework's study (no
observation of this framework's memory, so every p_fit was the prior at the file's capacity)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from tuner.layout import Layout
from tuner.perfmodel import RECOMMEND_AT, predict
from tuner.search.guided import GuidedSearcher
from tuner.space import load_space, valid_layouts
from tuner.specs import make_workload
from tuner.trial import Status, TrialResult

GIB = 2 ** 30 / 1e9
W2 = make_workload("22b", 2)
CANDS = valid_layouts(load_space("frontier-2023"), W2)
CAP = W2.cluster.memory_gb
BETWEEN = [i for i, c in enumerate(CANDS) if 0.75 * CAP < predict(c, W2).memory_gb < 0.95 * CAP]


def message(in_use_gb: float) -> str:
    return (f"HIP out of memory. Tried to allocate 1.00 GiB. GPU 3 has a total capacity of {CAP / GIB:.2f} GiB of which "
            f"102.40 MiB is free. Including non-PyTorch memory, this process has {in_use_gb / GIB:.2f} GiB memory in "
            f"use. Of the allocated memory {(in_use_gb - 4) / GIB:.2f} GiB is allocated by PyTorch, and 1.00 GiB is "
            "reserved by PyTorch but unallocated.")


def test_the_first_oom_recomputes_the_first_picks_headroom_with_its_capacity():
    s = GuidedSearcher(CANDS, seed=1, workload=W2)
    roomy = [i for i in BETWEEN if s.roomy[i]]          # sure to fit in the file's capacity, not in 0.7 of it
    assert roomy
    s.tell(CANDS[BETWEEN[0]], TrialResult(Status.OOM, message=message(0.7 * CAP)))
    assert s.capacity == pytest.approx(0.7 * CAP + 0.1, abs=0.02)
    assert np.array_equal(s.roomy, s.p_fit() >= RECOMMEND_AT) and not s.roomy[roomy].any()


def test_another_frameworks_oom_messages_lower_every_p_fit_of_a_warm_start():
    other = SimpleNamespace(global_batch=W2.global_batch, workload={"framework": "megatron-core"}, runner="command")
    rec = SimpleNamespace(layout=Layout(tp=8, pp=1, dp=2, micro_batch=4, zero_stage=1, recompute="none"),
                          status=Status.OOM, nodes=2, peak_memory_gb=None, mfu=None, model=W2.model.name,
                          cluster=W2.cluster.name, study="mc", runner="command", global_batch=None,
                          message=message(0.7 * CAP))
    assert W2.framework != "megatron-core"
    s = GuidedSearcher(CANDS, seed=1, workload=W2, history=[rec], history_studies={"mc": other})
    assert s.capacity == pytest.approx(0.7 * CAP + 0.1, abs=0.02)
    assert (s.p_fit()[BETWEEN] < 0.5).all() and not s.roomy[BETWEEN].any()
