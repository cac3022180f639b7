"""The offloaded twins a guided study holds back (tuner.search.reserve, issue 30 round 38): never proposed nor counted
while their plain layout is likelier to fit than not by the memory the searcher has learned, released -- and
proposed -- once a measured peak says otherwise; and an OOM'd layout's own twins, never deferred with it."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from tuner.layout import Layout
from tuner.perfmodel import predict
from tuner.search.base import needs_more_memory
from tuner.search.guided import GuidedSearcher
from tuner.space import load_space, valid_layouts
from tuner.space_offload import RELEASE_BELOW, SURELY_FITS, held_twins
from tuner.specs import make_workload
from tuner.trial import Status, TrialResult

W = make_workload("22b", 2, framework="megatron-core")
PLAIN = Layout(tp=2, sequence_parallel=True, pp=1, dp=8, micro_batch=1, zero_stage=2, recompute="none")  # 58 GB of 64


def _searcher(seed: int = 0) -> tuple[GuidedSearcher, list[Layout], list[Layout]]:
    cands = valid_layouts(load_space("default"), W)
    reserve = held_twins(cands, W)
    return GuidedSearcher(cands, seed=seed, workload=W, reserve=reserve), cands, reserve


def test_held_twins_are_the_twins_the_space_does_not_give():
    s, cands, reserve = _searcher()
    assert PLAIN in cands and predict(PLAIN, W).p_fit >= SURELY_FITS
    twins = [t for t in reserve if replace(t, offload_layers=0) == PLAIN]
    assert sorted(t.offload_layers for t in twins) == [12, 24, 36]          # a quarter, half, three quarters of 48
    assert not set(reserve) & set(cands) and all(t.pp == 1 and t.recompute == "none" for t in reserve)
    assert s.remaining == len(cands)                                          # held: not counted
    assert int(s.reserve.held.sum()) == len(reserve)


def test_a_held_twin_is_released_once_its_layout_is_likelier_out_of_memory_than_not():
    s, cands, reserve = _searcher()
    asked = s.ask(4)
    assert not set(asked) & set(reserve)
    # the plain layout's ZeRO-3 twin ran at 1.4x the model's memory: the plain layout likely does not fit
    ran = replace(PLAIN, zero_stage=3)
    need = 1.4 * predict(ran, W).memory_gb - W.cluster.memory_reserved_gb
    s.tell(ran, TrialResult(Status.OK, mfu=0.3, peak_memory_gb=need))
    for lay in asked:
        s.tell(lay, TrialResult(Status.OK, mfu=0.2, peak_memory_gb=predict(lay, W).memory_gb))
    assert s.p_fit()[s.index[PLAIN]] < RELEASE_BELOW
    before = s.remaining
    s.ask(1)
    twins = [s.index[t] for t in reserve if replace(t, offload_layers=0) == PLAIN]
    assert not s.reserve.held[twins].any() and s.remaining >= before - 1 + len(twins)
    # the twins now weigh like any candidate: the searcher's p_fit puts the most offloaded above its plain layout
    assert s.p_fit()[twins[-1]] > s.p_fit()[s.index[PLAIN]]
    # the rest stay held where their layouts are still likelier to fit than not
    still = np.flatnonzero(s.reserve.held)
    assert still.size and (s.p_fit()[s.reserve.plain[still]] >= RELEASE_BELOW).all()


W8 = make_workload("22b", 8, framework="megatron-core")
PLAIN8 = Layout(tp=1, pp=1, dp=64, micro_batch=2, zero_stage=3, recompute="none")


def _world(lay: Layout) -> TrialResult:
    """A machine whose memory is 1.4x the model's for every layout (its allocator's share), at the model's speed."""
    p = predict(lay, W8)
    need = 1.4 * p.memory_gb
    if need > W8.cluster.memory_gb:
        return TrialResult(Status.OOM)
    return TrialResult(Status.OK, mfu=p.mfu, peak_memory_gb=need - W8.cluster.memory_reserved_gb)


def test_a_study_whose_machine_holds_less_finds_the_offloaded_twin_the_space_did_not_offer():
    """On 8 nodes the fastest layouts such a machine runs (tp1 dp64 mb2 ZeRO 3, offloading 12, 24 or 36 of 48 layers)
    are ones the space does not offer: the model alone says their plain layout fits. A guided study finds one once an
    OOM releases them; without the reserve it cannot run them."""
    cands = valid_layouts(load_space("default"), W8)
    reserve = held_twins(cands, W8)
    runs = {lay: predict(lay, W8).mfu for lay in [*cands, *reserve] if _world(lay).status == Status.OK}
    tops = {lay for lay, v in runs.items() if v == max(runs.values())}    # its twins: every copy hidden alike
    assert tops <= set(reserve) and {replace(t, offload_layers=0) for t in tops} == {PLAIN8}

    def study(seed: int, **kw) -> Layout:
        s = GuidedSearcher(cands, seed=seed, workload=W8, **kw)
        told = {}
        for _ in range(10):
            for lay in s.ask(1):
                told[lay] = _world(lay)
                s.tell(lay, told[lay])
        return max((lay for lay, r in told.items() if r.mfu), key=lambda lay: told[lay].mfu)

    for seed in (1, 2, 3):
        assert study(seed, reserve=reserve) in tops and study(seed) not in tops


def test_an_offloaded_twin_of_an_oomed_layout_is_not_deferred_with_it():
    """An OOM defers the layouts that need at least as much memory (tuner.search.base.needs_more_memory); a twin that
    offloads more of its layers needs less, and is what rescues the layout (issue 30 round 38: every twin of the OOM'd
    layout was deferred with it, so a study never ran them)."""
    twin = replace(PLAIN, offload_layers=12)
    assert not needs_more_memory(twin, PLAIN) and needs_more_memory(PLAIN, twin)
    assert needs_more_memory(replace(twin, micro_batch=2), twin)
    cands = valid_layouts(load_space("default"), W8)
    plain = next(replace(c, offload_layers=0) for c in cands if c.offload_layers)   # one the space rescues
    s = GuidedSearcher(cands, seed=0, workload=W8)
    s.tell(plain, TrialResult(Status.OOM))
    twins = [s.index[c] for c in cands if c.offload_layers and replace(c, offload_layers=0) == plain]
    s.ask(1)
    assert twins and not s.deferred[twins].any()
    assert s.deferred[[s.index[c] for c in cands if needs_more_memory(c, plain)]].all()
