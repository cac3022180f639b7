"""Group-limited routing in the flex dispatcher's reach (tuner/perfmodel/moe_exchange.hit_probability, issue 25): a
DeepSeek-V3 token picks 4 of 8 expert groups (Megatron-Core's group_limited_topk, kept under
--moe-router-force-load-balancing), so with ep 64 over 8 H100 nodes (one group per node) it reaches at most 4 nodes:
DeepEP / HybridEP send it across the network to fewer nodes than an unconstrained top-8 of 256 would."""

from __future__ import annotations

import dataclasses
import random
from math import comb

import pytest

from tuner.layout import Layout
from tuner.perfmodel.compute import shape_of
from tuner.perfmodel.moe_exchange import _miss, flex_alltoall_time, hit_probability
from tuner.specs import load_model, make_workload


def _free(model):
    return dataclasses.replace(model, moe_router_num_groups=None, moe_router_group_topk=None)


def _group_limited_topk(rng, experts=256, groups=8, picks=4, top_k=8):
    """Megatron-Core's group_limited_topk on random scores (moe_utils.py: the groups by the sum of their two best
    scores, then the top_k of the picked groups' experts)."""
    scores = [rng.random() for _ in range(experts)]
    per = experts // groups
    best = sorted(range(groups), key=lambda g: -sum(sorted(scores[g * per:(g + 1) * per])[-2:]))[:picks]
    pool = [e for g in best for e in range(g * per, (g + 1) * per)]
    return sorted(pool, key=lambda e: -scores[e])[:top_k]


def test_group_limited_reach_against_the_routing_algorithm():
    m = load_model("deepseek-v3")
    assert hit_probability(m, 32) == pytest.approx(1.0 - comb(7, 4) / comb(8, 4))          # a node = one group
    assert hit_probability(_free(m), 32) == pytest.approx(1.0 - _miss(256, 32, 8))        # unconstrained
    rng, n = random.Random(20261203), 3000
    draws = [_group_limited_topk(rng) for _ in range(n)]
    for block in (4, 32, 128):              # one EP rank of ep 64, one node of ep 64, one node of ep 16
        seen = sum(any(e < block for e in d) for d in draws) / n
        assert hit_probability(m, block) == pytest.approx(seen, abs=0.03)
        assert abs(hit_probability(m, block) - seen) < abs(hit_probability(_free(m), block) - seen) + 0.005


def test_deepseek_v3_flex_exchange_crosses_fewer_nodes():
    w = make_workload("deepseek-v3", 128, "h100", None, "bf16", "megatron-core")
    sh = shape_of(Layout(tp=1, pp=8, virtual_pipeline=2, dp=128, expert_parallel=64, micro_batch=1,
                         recompute="none"), w)
    grouped = flex_alltoall_time(w.model, w.cluster, sh, 2.0 * w.model.hidden_size)
    free = flex_alltoall_time(_free(w.model), w.cluster, sh, 2.0 * w.model.hidden_size)
    assert grouped < 0.8 * free             # the network part: 0.5 of the 7 remote nodes hit, not 0.66
    qwen = make_workload("qwen3-235b-a22b", 32, "h100", None, "bf16", "megatron-core")     # no groups: unchanged
    qs = shape_of(Layout(tp=1, pp=8, dp=32, expert_parallel=32, micro_batch=1, recompute="none"), qwen)
    assert hit_probability(qwen.model, 16) == pytest.approx(1.0 - _miss(128, 16, 8))
    assert flex_alltoall_time(qwen.model, qwen.cluster, qs, 8192.0) > 0
