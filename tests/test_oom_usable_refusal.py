"""Where the OOMs' messages said the GPUs hold less than the cluster file states (tuner.oom_evidence.usable_capacity),
`best`'s refusal and its note name that usable capacity, why, and the file's: a refusal that printed the usable
figure alone read as a wrong cluster file (review of cceee66)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tuner.best import best_for_unmeasured
from tuner.errors import UsageError
from tuner.layout import Layout
from tuner.space import load_space
from tuner.specs import make_workload
from tuner.trial import Status

GIB = 2 ** 30 / 1e9
W = make_workload("22b", 2)


def oom(in_use_gb: float) -> SimpleNamespace:
    msg = (f"HIP out of memory. Tried to allocate 1.00 GiB. GPU 0 has a total capacity of 63.98 GiB of which 100.00 MiB "
           f"is free. Including non-PyTorch memory, this process has {in_use_gb / GIB:.2f} GiB memory in use. Of the "
           f"allocated memory {(in_use_gb - 4) / GIB:.2f} GiB is allocated by PyTorch, and 1.00 GiB is reserved by "
           "PyTorch but unallocated.")
    return SimpleNamespace(layout=Layout(tp=8, pp=1, dp=2, micro_batch=4, zero_stage=1, recompute="none"),
                           status=Status.OOM, nodes=1, peak_memory_gb=None, mfu=None, model="gpt-22b",
                           cluster=W.cluster.name, study="s", runner="command", global_batch=None, message=msg)


def test_the_refusal_names_the_usable_capacity_and_why():
    with pytest.raises(UsageError) as err:
        best_for_unmeasured(W, load_space("frontier-2023"), [oom(8.0)], k=1)
    text = str(err.value)
    assert "8.1 usable, as 1 out-of-memory message(s) of this cluster said the process had" in text
    assert f"its file states {W.cluster.memory_gb:.1f} GB" in text


def test_the_note_states_the_files_capacity_too():
    r = best_for_unmeasured(W, load_space("frontier-2023"), [oom(0.8 * W.cluster.memory_gb)], k=1)[0]
    assert r["memory_capacity_gb"] == pytest.approx(0.8 * W.cluster.memory_gb, abs=0.2)
    assert f"out-of-memory message(s) of this cluster said the process had (its file states " \
           f"{W.cluster.memory_gb:.1f} GB)" in r["evidence"]["note"]
