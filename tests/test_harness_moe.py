"""The harness's mixture-of-experts layer (tuner/runners/harness/moe.py) and expert parallelism.

Fast checks: the routing and load-balancing math against Megatron-Core's formulas, the expert grid
against Megatron-Core's RankGenerator, and the dispatcher itself: two gloo processes (spawned here, no
DeepSpeed engine) run one MoE layer split by ep, etp, tp and SP, and its outputs, input gradients and
weight gradients must equal one process running every expert on every token (tolerance 1e-5 abs on
values ~1e-2..1: they differ by the order of float sums only).

Slow checks (`pytest -m slow tests/test_harness_moe.py`, ~2.5 min on 2 cores): real torchrun trials of
a tiny MoE (4 experts, top-2, a shared expert, one dense layer then three MoE layers) whose per-step
losses must equal the one-process run's for ep 2 (over DP ranks, over TP ranks with etp 1, with TP but
no SP, with ZeRO-1, with full recompute, with pp 2), etp 2, and ep 2 with etp = tp = 2 (Megatron-Core's
own grid: EP over the DP ranks of one TP rank). They train with plain SGD (see test_harness.py) at
lr 1.0: experts start small (std 0.02, output 0.02/sqrt(2L)), so at lr 0.1 halving every expert
gradient moved the step-3 loss by only 4e-6. Tolerance: 2e-6 absolute on losses ~6.2 (3e-7 relative).
Measured differences between layouts are <= 2.4e-7 (sums in another order: expert GEMMs over other
token batches, DP averages, TP partial sums). Bugs land far above it: halving the expert gradients
with ep 2 moved step 3 by 4.0e-5; leaving out the expert marks (experts broadcast and averaged over DP
like dense weights) moved step 1 by 2.6e-5 and step 3 by 9.0e-4.
"""

from __future__ import annotations

import math
import os
import socket
import time
from datetime import timedelta
from pathlib import Path

import pytest

pytest.importorskip("deepspeed", reason="the harness needs `pip install tuner[deepspeed]`")

import torch  # noqa: E402

from test_harness import TINY, one_rank, run_trial  # noqa: E402,F401  (one_rank: a fixture)

#: The tiny MoE: GQA + SwiGLU + RoPE + RMSNorm, no biases; layer 0 dense, layers 1-3 MoE (4 experts of
#: width 32, top-2, one shared expert of width 32).
MOE_TINY = {**TINY, "name": "tiny-moe", "num_query_groups": 2, "ffn_type": "swiglu", "ffn_hidden_size": 96,
            "position_embedding": "rope", "tie_embeddings": False, "normalization": "rmsnorm",
            "add_bias_linear": False, "num_experts": 4, "moe_top_k": 2, "moe_ffn_hidden_size": 32,
            "num_shared_experts": 1, "moe_first_dense_layers": 1}
LOSS_ATOL = 2e-6
SGD_LR1 = {"TUNER_OPTIMIZER": "sgd", "TUNER_LR": "1.0"}
VALUE_ATOL = 1e-5


def spec_of(model: dict):
    from tuner.specs import ModelSpec
    return ModelSpec.from_dict(model, "test model")


# ---- routing math (pure) ---------------------------------------------------------------------------
def test_softmax_routing_is_the_softmax_of_the_top_k_logits():
    from tuner.runners.harness.moe import route

    logits = torch.tensor([[1.0, 3.0, 2.0, -1.0], [0.5, 0.1, 0.2, 0.9]])
    probs, experts, scores = route(logits, 2)
    assert experts.tolist() == [[1, 2], [3, 0]]
    torch.testing.assert_close(probs[0], torch.tensor([3.0, 2.0]).softmax(0))
    torch.testing.assert_close(scores, logits.softmax(-1))
    # Megatron-Core's pre-softmax variant renormalised over the top k is the same distribution
    top = logits.softmax(-1).topk(2).values
    torch.testing.assert_close(probs, top / top.sum(-1, keepdim=True))
    sig, _, _ = route(logits, 2, "sigmoid", 2.5)
    s = torch.sigmoid(torch.tensor([3.0, 2.0]))
    torch.testing.assert_close(sig[0], 2.5 * s / s.sum())


def test_load_balancing_loss_is_switch_transformers():
    """E * sum_i f_i P_i * coeff, f_i the fraction of the T*k assignments that went to expert i and
    P_i the mean router probability of expert i; 1 * coeff when perfectly balanced."""
    from tuner.runners.harness.moe import load_balancing_loss, route

    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(64, 8, generator=gen)
    _, experts, scores = route(logits, 2)
    counts = torch.bincount(experts.flatten(), minlength=8).float()
    f, p = counts / (64 * 2), scores.mean(0)
    torch.testing.assert_close(load_balancing_loss(scores, counts, 64, 2, 0.01), 8 * (f * p).sum() * 0.01)
    uniform = torch.full((64, 8), 1 / 8)
    assert abs(float(load_balancing_loss(uniform, torch.full((8,), 16.0), 64, 2, 0.01)) - 0.01) < 1e-9


def test_regroup_orders_rows_by_local_expert_then_source():
    from tuner.runners.harness.moe import regroup

    counts = torch.tensor([[2, 1], [0, 3]])          # source 0: 2 rows for expert 0, 1 for expert 1; ...
    perm, per_expert = regroup(counts)
    assert per_expert == [2, 4]
    assert perm.tolist() == [0, 1, 2, 3, 4, 5]       # rows 0,1 (s0 e0), none (s1 e0), 2 (s0 e1), 3-5 (s1 e1)
    perm, per_expert = regroup(torch.tensor([[1, 1], [1, 1]]))
    assert perm.tolist() == [0, 2, 1, 3] and per_expert == [2, 2]


@pytest.mark.parametrize("tp,pp,dp,ep,etp,want", [
    # Megatron-Core's expert RankGenerator (order tp-cp-ep-dp-pp with tp = etp), printed for these sizes
    (1, 1, 4, 2, 1, {"ep": [[0, 1], [2, 3]], "etp": [[0], [1], [2], [3]], "edp": [[0, 2], [1, 3]]}),
    (2, 1, 2, 2, 2, {"ep": [[0, 2], [1, 3]], "etp": [[0, 1], [2, 3]], "edp": [[0], [1], [2], [3]]}),
    (2, 1, 2, 2, 1, {"ep": [[0, 1], [2, 3]], "etp": [[0], [1], [2], [3]], "edp": [[0, 2], [1, 3]]}),
    (2, 2, 2, 4, 1, {"ep": [[0, 1, 2, 3], [4, 5, 6, 7]], "etp": [[r] for r in range(8)],
                     "edp": [[r] for r in range(8)]}),
    (4, 1, 2, 2, 2, {"ep": [[0, 2], [1, 3], [4, 6], [5, 7]], "etp": [[0, 1], [2, 3], [4, 5], [6, 7]],
                     "edp": [[0, 4], [1, 5], [2, 6], [3, 7]]}),
])
def test_expert_groups_are_megatron_cores(tp, pp, dp, ep, etp, want):
    """With etp = tp the EP group is made of DP ranks of one TP rank (ranks 0 and 2 at tp 2); with etp 1
    it folds over the TP ranks (0 and 1)."""
    from tuner.runners.harness.topology import expert_coordinates, expert_groups

    got = expert_groups(tp, pp, dp, ep, etp)
    assert {k: sorted(v) for k, v in got.items()} == {k: sorted(v) for k, v in want.items()}
    for rank in range(tp * pp * dp):
        etp_rank, ep_rank, _ = expert_coordinates(rank, tp, dp, ep, etp)
        assert [g.index(rank) for g in got["ep"] if rank in g] == [ep_rank]
        assert [g.index(rank) for g in got["etp"] if rank in g] == [etp_rank]


def test_harness_refuses_what_its_moe_does_not_build():
    from tuner.layout import Layout
    from tuner.runners.harness.support import layout_refusal, model_refusal
    from tuner.specs import load_model

    assert model_refusal(spec_of(MOE_TINY)) is None and model_refusal(load_model("mixtral-8x7b")) is None
    deepseek = model_refusal(load_model("deepseek-v3"))
    assert "multi_latent_attention = True" in deepseek and "moe_router_expert_bias = True" in deepseek
    assert "qk_layernorm = True" in model_refusal(load_model("qwen3-30b-a3b"))
    assert "moe_capacity_factor = 1.25" in model_refusal(spec_of({**MOE_TINY, "moe_capacity_factor": 1.25}))
    assert "add_bias_linear = True with experts" in model_refusal(spec_of({**MOE_TINY, "add_bias_linear": True}))
    z3 = Layout.from_dict({"tp": 1, "pp": 1, "dp": 2, "micro_batch": 1, "zero_stage": 3, "expert_parallel": 2})
    assert "zero_stage = 3 with a mixture-of-experts model" in layout_refusal(z3, 4, model=spec_of(MOE_TINY))
    assert layout_refusal(z3, 4, model=spec_of(TINY)) is None
    assert layout_refusal(Layout.from_dict({**z3.as_dict(), "zero_stage": 2}), 4, model=spec_of(MOE_TINY)) is None


# ---- the dispatcher, distributed, against one process ------------------------------------------------
#: (tp, dp, sequence_parallel, ep, etp): world 2 split every way the layer splits.
CASES = [(1, 2, False, 2, 1), (2, 1, True, 2, 1), (2, 1, True, 1, 2), (2, 1, False, 2, 1), (2, 1, True, 1, 1)]
LAYER_SPEC = {**MOE_TINY, "num_layers": 1, "moe_first_dense_layers": 0, "seq_length": 8}


def _data(spec, dp):
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(dp, 2, spec.seq_length, spec.hidden_size, generator=gen)
    return x, torch.randn(x.shape, generator=gen)


def _run_layer(x, w, grads_of):
    from tuner.runners.harness.moe import MoELayer

    spec = spec_of(LAYER_SPEC)
    layer = MoELayer(spec, 0, 1234, 0.01, coeff=0.05)
    x = x.clone().requires_grad_()
    out = layer(x)
    (out * w).sum().backward()
    return layer, out.detach(), x.grad, grads_of(layer)


def _grads(layer):
    return {"router": layer.router.grad, "fc1": layer.experts.fc1.grad, "fc2": layer.experts.fc2.grad,
            "shared.fc1": layer.shared["fc1"].weight.grad, "shared.fc2": layer.shared["fc2"].weight.grad}


def _worker(rank, port, out_dir, cases):
    os.environ["DS_ACCELERATOR"] = "cpu"
    import deepspeed
    import torch.distributed as dist

    from tuner.runners.harness import topology
    deepspeed.init_distributed("gloo", auto_mpi_discovery=False, init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                               world_size=2, timeout=timedelta(seconds=60), verbose=False)
    spec = spec_of(LAYER_SPEC)
    for i, (tp, dp, sp, ep, etp) in enumerate(cases):
        par = topology.build(tp, 1, dp, sp, ep=ep, etp=etp, experts=True)
        x, w = _data(spec, dp)
        x, w = x[par.dp_rank], w[par.dp_rank]
        if sp and tp > 1:
            x, w = (t.chunk(tp, dim=1)[par.tp_rank] for t in (x, w))
        layer, out, xgrad, grads = _run_layer(x, w, _grads)
        for name in ("fc1", "fc2"):           # what DeepSpeed's engine does: sum over expert-dp
            dist.all_reduce(grads[name], group=par.edp_group)
        torch.save({"par": (par.tp_rank, par.dp_rank, par.ep_rank, par.etp_rank), "out": out, "xgrad": xgrad,
                    "grads": grads}, Path(out_dir) / f"case{i}-rank{rank}.pt")
    dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def distributed_layers(tmp_path_factory):
    """Run every case on two gloo processes (bounded: 240 s) and return their saved results."""
    import torch.multiprocessing as mp

    out = tmp_path_factory.mktemp("moe-layer")
    ctx = mp.start_processes(_worker, args=(_free_port(), str(out), CASES), nprocs=2, join=False,
                             start_method="spawn")
    deadline = time.monotonic() + 240
    while not ctx.join(timeout=5):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                p.kill()
            pytest.fail("the two-process MoE layer run did not finish in 240 s")
    return {(i, r): torch.load(out / f"case{i}-rank{r}.pt") for i in range(len(CASES)) for r in range(2)}


@pytest.mark.parametrize("case", range(len(CASES)))
def test_split_moe_layer_equals_one_process(distributed_layers, one_rank, case):
    """Every rank's output and input gradient equal the one-process layer's on its tokens; its router
    and shared-expert gradients (TP shards) the one-process layer's on its replica; and its experts'
    gradients, summed over expert-dp, the shard it holds of the sum over all replicas."""
    from tuner.runners.harness.layers import column_shard, row_shard

    tp, dp, sp, ep, etp = CASES[case]
    spec = spec_of(LAYER_SPEC)
    xs, ws = _data(spec, dp)
    ref = [_run_layer(xs[d], ws[d], _grads)[1:] for d in range(dp)]
    expert_sum = {k: sum(r[2][k] for r in ref) for k in ("fc1", "fc2")}
    f, per = spec.moe_ffn_hidden_size, spec.num_experts // ep
    moved = 0.0
    for rank in range(2):
        got = distributed_layers[case, rank]
        tp_rank, dp_rank, ep_rank, etp_rank = got["par"]
        out, xgrad, grads = ref[dp_rank]
        if sp and tp > 1:
            out, xgrad = (t.chunk(tp, dim=1)[tp_rank] for t in (out, xgrad))
        torch.testing.assert_close(got["out"], out, atol=VALUE_ATOL, rtol=0)
        torch.testing.assert_close(got["xgrad"], xgrad, atol=VALUE_ATOL, rtol=0)
        torch.testing.assert_close(got["grads"]["router"], grads["router"], atol=VALUE_ATOL, rtol=0)
        torch.testing.assert_close(got["grads"]["shared.fc1"], column_shard(grads["shared.fc1"], [f, f], tp_rank, tp),
                                   atol=VALUE_ATOL, rtol=0)
        torch.testing.assert_close(got["grads"]["shared.fc2"], row_shard(grads["shared.fc2"], tp_rank, tp),
                                   atol=VALUE_ATOL, rtol=0)
        mine = range(ep_rank * per, (ep_rank + 1) * per)
        want1 = torch.stack([column_shard(expert_sum["fc1"][e], [f, f], etp_rank, etp) for e in mine])
        want2 = torch.stack([row_shard(expert_sum["fc2"][e], etp_rank, etp) for e in mine])
        torch.testing.assert_close(got["grads"]["fc1"], want1, atol=VALUE_ATOL, rtol=0)
        torch.testing.assert_close(got["grads"]["fc2"], want2, atol=VALUE_ATOL, rtol=0)
        moved = max(moved, float(want1.abs().max()), float(got["out"].abs().max()))
    assert moved > 100 * VALUE_ATOL        # the compared values are far from the tolerance


# ---- real trials -----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tmp(tmp_path_factory):
    return tmp_path_factory.mktemp("harness-moe")


@pytest.fixture(scope="module")
def moe_baseline(tmp):
    """The tiny MoE on one process (ep 1, every expert local), SGD at lr 1."""
    result, _ = run_trial(tmp, model=MOE_TINY, env=SGD_LR1)
    assert result["status"] == "ok", result["message"]
    return result


def assert_moe_losses_match(result, reference, what):
    assert result["status"] == "ok", f"{what}: {result['message']}"
    got, want = result["losses"], reference["losses"]
    assert len(got) == len(want) == 3
    diffs = [abs(a - b) for a, b in zip(got, want)]
    print(f"{what}: losses {got} vs {want}, max |dloss| {max(diffs):.2e}")
    assert max(diffs) <= LOSS_ATOL, f"{what}: losses {got} != {want} (|diffs| {diffs})"
    assert want[0] - want[-1] > 0.1, f"the MoE should learn in 3 steps at lr 1: {want}"


@pytest.mark.slow
def test_moe_baseline_counts_active_flops_and_builds_its_experts(moe_baseline):
    from tuner.perfmodel.flops import model_flops

    spec, r = spec_of(MOE_TINY), moe_baseline
    assert r["rank0"]["moe_layers"] == 3 and r["rank0"]["local_experts"] == 4
    assert r["rank0"]["parameters"] == spec.num_parameters
    # dropless top-2: every token of every micro-batch ran on 2 experts in each MoE layer (3 iterations)
    assert r["rank0"]["expert_rows"] == 3 * 3 * MOE_TINY["global_batch"] * MOE_TINY["seq_length"] * 2
    assert r["rank0"]["rows_sent_to_other_ranks"] == 0 and r["rank0"]["aux_loss"] > 0
    want = model_flops(spec, 1) * r["samples_per_second"] / 1e12      # active-parameter FLOPs, one rank
    assert math.isclose(r["model_tflops_per_gpu"], want, rel_tol=1e-9)


@pytest.mark.slow
@pytest.mark.parametrize("layout", [
    # four layouts in the slow suite (CI time): ep over DP with ZeRO-1, ep folded over the TP ranks (etp 1),
    # ep beside a pipeline, and 4 ranks with etp 2; dp2-ep2 alone, full recompute, TP without SP and etp 2
    # alone passed too when they were run (issue 20's closing note) and the fast split-layer test covers them
    {"dp": 2, "expert_parallel": 2, "zero": 1},
    {"tp": 2, "sp": True, "expert_parallel": 2},
    {"pp": 2, "dp": 2, "expert_parallel": 2},
    {"tp": 2, "dp": 2, "sp": True, "expert_parallel": 2, "expert_tensor_parallel": 2},
], ids=lambda d: "-".join(f"{k}{v}" for k, v in d.items()))
def test_expert_parallel_equals_one_process(moe_baseline, tmp, layout):
    """ep 2 over DP ranks (Megatron-Core's grid with etp = tp), over the two TP ranks (etp 1: MoE parallel
    folding), with TP but no SP (the layer splits the sequence itself), with ZeRO-1 (expert weights
    partitioned over expert-dp), with full recompute (the all-to-alls re-run) and with pp 2; and etp 2
    (each expert's FFN split over TP), and ep 2 with etp = tp = 2 on 4 ranks. Rank 0 holds E/ep experts
    and sends tokens to another rank."""
    result, _ = run_trial(tmp, model=MOE_TINY, env=SGD_LR1, **layout)
    assert_moe_losses_match(result, moe_baseline, f"MoE {layout} vs one process")
    ep, etp = layout.get("expert_parallel", 1), layout.get("expert_tensor_parallel", 1)
    rank0 = result["rank0"]
    assert rank0["local_experts"] == MOE_TINY["num_experts"] // ep
    assert (rank0["rows_sent_to_other_ranks"] > 0) == (ep > 1)
    if etp > 1 and ep == 1:    # each shard ran every row of its experts, from both TP ranks' tokens
        assert rank0["expert_rows"] == moe_baseline["rank0"]["expert_rows"]


@pytest.mark.slow
def test_a_moe_search_runs_expert_parallel_trials_on_the_harness(tuner):
    """The route a user takes: `tuner search --runner local` on the tiny MoE preset under megatron-core
    (the harness's MoE layer is Megatron-Core's) runs an ep 2 trial for real; other frameworks are refused."""
    code, _, err = tuner("search", "--model", "tiny-moe", "--cluster", "local", "--nodes", "1", "--runner", "local",
                         "--budget", "1", "--study", "refused")
    assert code == 2 and "--framework megatron-core" in err
    code, out, err = tuner("search", "--model", "tiny-moe", "--cluster", "local", "--nodes", "1", "--runner", "local",
                           "--framework", "megatron-core", "--ep", "2", "--budget", "1", "--study", "moe")
    assert code == 0, err
    from tuner.store import open_store
    with open_store(tuner.db) as store:
        (t,) = store.trials("moe")
    assert t.status.value == "ok" and t.layout.expert_parallel == 2 and t.samples_per_second > 0
