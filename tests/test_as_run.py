"""A published run predicted as it ran where its release is not what tuner models (issue 25): TokenExchange's
`overlaps` (the framework overlaps that release had) and `dispatcher`. Taking an overlap away never makes a
layout faster, and stating the framework's own overlaps changes nothing."""

from __future__ import annotations

import pytest

from tuner.frameworks import FRAMEWORKS
from tuner.layout import Layout
from tuner.perfmodel import predict
from tuner.perfmodel.moe_exchange import TokenExchange
from tuner.specs import make_workload

CASES = [
    ("gpt-175b", "a100", 32, 768, Layout(tp=8, sequence_parallel=True, pp=8, virtual_pipeline=6, dp=4, micro_batch=1)),
    ("llama3-70b", "h100", 8, 128, Layout(tp=4, sequence_parallel=True, pp=4, virtual_pipeline=5, dp=4, micro_batch=1)),
    ("qwen3-30b-a3b", "h100", 2, 512, Layout(tp=1, pp=1, dp=16, expert_parallel=16, micro_batch=1)),
    ("mixtral-8x7b", "h100", 4, 256, Layout(tp=2, sequence_parallel=True, pp=2, virtual_pipeline=4, dp=8,
                                           expert_parallel=8, micro_batch=1)),
]


@pytest.mark.parametrize("model, cluster, nodes, batch, lay", CASES, ids=[c[0] for c in CASES])
def test_an_older_release_without_an_overlap_is_never_faster(model, cluster, nodes, batch, lay):
    w = make_workload(model, nodes, cluster, batch, framework="megatron-core")
    own = FRAMEWORKS["megatron-core"].overlaps
    base = predict(lay, w)
    assert predict(lay, w, TokenExchange(overlaps=own)).step_time_s == base.step_time_s
    steps = {name: predict(lay, w, TokenExchange(overlaps=own - {name})).step_time_s for name in own}
    assert all(s >= base.step_time_s for s in steps.values()), steps
    none = predict(lay, w, TokenExchange(overlaps=frozenset())).step_time_s
    assert none >= max(steps.values())
    if lay.sequence_parallel:          # TP's collectives show whole without --tp-comm-overlap
        assert steps["tp"] > base.step_time_s
