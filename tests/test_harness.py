"""The bundled harness trains for real, and its parallelism is proved, not assumed.

Every layout of the `tiny` model starts from the same weights (drawn at full shape from a seed, then
sliced per TP rank) and sees the same synthetic tokens, so the losses of the first iterations must
agree across TP, PP, DP and ZeRO.

The proofs train with plain SGD (TUNER_OPTIMIZER=sgd: lr 0.1, no clipping), whose update is linear in
the gradient, so a gradient wrong by any factor changes the losses; Adam's first steps are nearly
sign(gradient) and would hide a gradient counted twice. ZeRO-1 is also checked with Adam, whose
moments it partitions.

Tolerance: rtol 1e-5 on fp32 CPU. The layouts differ only in the order of floating-point sums (TP
all-reduces partial matmuls, DP averages half-batch gradients, micro-batches accumulate in another
order); measured differences are <= 4e-8 relative. A real bug shows orders of magnitude above the
tolerance: dropping the backward all-reduce of the TP `f` op moved the step-2 loss by 2.9e-4.

Each run is a real `torchrun` of 1-2 CPU processes (gloo); those tests take ~6 minutes on 2 cores and
are marked slow (`pytest -m slow tests/test_harness.py`). The default suite keeps the in-process
checks (GQA and RoPE semantics, the refusals) and one short torchrun of a refused layout.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

pytest.importorskip("deepspeed", reason="the harness needs `pip install tuner[deepspeed]`")

ROOT = Path(__file__).resolve().parents[1]
TINY = {"name": "tiny", "num_layers": 4, "hidden_size": 64, "num_attention_heads": 4, "seq_length": 64,
        "vocab_size": 512, "global_batch": 16}
RTOL = 1e-5
TIMEOUT_S = 240

def run_trial(tmp: Path, tp=1, pp=1, dp=1, mb=4, zero=0, ac=False, model=None, env=None, steps=2, rc=None,
              sp=False, **extra):
    """Launch the harness with torchrun; return (result dict, completed process). `rc` is the recompute
    mode (none/selective/full; default: full when `ac`), `extra` more layout keys (virtual_pipeline...)."""
    rc = rc or ("full" if ac else "none")
    layout = {"tp": tp, "pp": pp, "dp": dp, "micro_batch": mb, "zero_stage": zero, "recompute": rc,
              "sequence_parallel": sp, **extra}
    model = model or TINY
    name = "-".join([model["name"], f"tp{tp}-pp{pp}-dp{dp}-mb{mb}-z{zero}-rc{rc}-sp{int(sp)}",
                     *(f"{k}{v}" for k, v in extra.items())])
    trial_dir = tmp / name
    trial_dir.mkdir(parents=True, exist_ok=True)
    trial = {"layout": layout, "model": model, "cluster": "local", "nodes": 1, "gpus": tp * pp * dp,
             "global_batch": model["global_batch"], "study": "test", "trial": 0}
    (trial_dir / "trial.json").write_text(json.dumps(trial))
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), "TUNER_TRIAL_JSON": str(trial_dir / "trial.json"),
                "TUNER_RESULT_JSON": str(trial_dir / "result.json"), "TUNER_TRIAL_DIR": str(trial_dir),
                "TUNER_WARMUP_STEPS": "1", "TUNER_STEPS": str(steps), "TUNER_SEED": "1234",
                "OMP_NUM_THREADS": "1", "TUNER_COLLECTIVE_TIMEOUT_S": "120", **(env or {})}
    torchrun = shutil.which("torchrun") or "torchrun"
    cmd = [torchrun, "--standalone", "--nproc_per_node", str(tp * pp * dp), "-m", "tuner.runners.harness.train"]
    proc = subprocess.run(cmd, cwd=trial_dir, env=full_env, capture_output=True, text=True,
                          timeout=TIMEOUT_S, start_new_session=True)
    path = trial_dir / "result.json"
    assert path.exists(), f"no result from {name} (rc {proc.returncode}):\n{proc.stderr[-3000:]}"
    return json.loads(path.read_text()), proc


@pytest.fixture(scope="module")
def tmp(tmp_path_factory):
    return tmp_path_factory.mktemp("harness")


SGD = {"TUNER_OPTIMIZER": "sgd"}
ADAM = {"TUNER_LR": "1e-3"}   # the rendered Adam (beta2 0.95, clipping 1.0) with a visible step


@pytest.fixture(scope="module")
def baseline(tmp):
    """tp1 pp1 dp1, ZeRO-0, one process, SGD: the reference losses of the parallelism proofs."""
    result, _ = run_trial(tmp / "sgd", env=SGD)
    assert result["status"] == "ok", result["message"]
    return result


@pytest.fixture(scope="module")
def adam_baseline(tmp):
    """The same with the rendered config's Adam: the smoke test's run and the ZeRO reference."""
    result, _ = run_trial(tmp / "adam", env=ADAM)
    assert result["status"] == "ok", result["message"]
    return result


def assert_same_losses(result, reference, what, min_drop=0.0):
    assert result["status"] == "ok", f"{what}: {result['message']}"
    got, want = result["losses"], reference["losses"]
    assert len(got) == len(want) == 3
    diffs = [abs(a - b) / abs(b) for a, b in zip(got, want)]
    print(f"{what}: losses {got} vs {want}, max rel diff {max(diffs):.2e}")
    assert max(diffs) <= RTOL, f"{what}: losses {got} != {want} (rel diffs {diffs})"
    assert want[0] - want[-1] > min_drop, f"the model should learn in 3 steps: {want}"


@pytest.mark.slow
def test_tiny_smoke_result_protocol(adam_baseline, tmp):
    r = adam_baseline
    for key in ("tflops_per_gpu", "samples_per_second", "peak_memory_gb", "model_tflops_per_gpu"):
        assert isinstance(r[key], float) and r[key] > 0, key
    assert r["samples"] == 2 * TINY["global_batch"]            # timed steps only, really processed
    assert r["world_size"] == 1 and r["device"] == "cpu" and r["precision"] == "fp32"
    assert r["ds_config"]["train_batch_size"] == 16 and r["ds_config"]["gradient_accumulation_steps"] == 4
    assert r["losses"][-1] < r["losses"][0]
    lines = (tmp / "adam" / "tiny-tp1-pp1-dp1-mb4-z0-rcnone-sp0" / "progress.jsonl").read_text().splitlines()
    lines = [json.loads(x) for x in lines]
    assert [x["step"] for x in lines] == [1, 2, 3] and [x["warmup"] for x in lines] == [True, False, False]
    assert all(x["samples_per_second"] > 0 and x["tflops_per_gpu"] > 0 for x in lines)


@pytest.mark.slow
def test_tensor_parallel_2_equals_1(baseline, tmp):
    result, _ = run_trial(tmp / "sgd", tp=2, ac=True, env=SGD)   # checkpointing (torch.utils) on too
    assert_same_losses(result, baseline, "TP=2 vs TP=1", min_drop=0.05)


@pytest.mark.slow
def test_pipeline_parallel_2_equals_1(baseline, tmp):
    result, _ = run_trial(tmp / "sgd", pp=2, ac=True, env=SGD)   # PipelineModule, 1F1B, checkpointing
    assert_same_losses(result, baseline, "PP=2 vs PP=1", min_drop=0.05)


@pytest.mark.slow
def test_data_parallel_2_equals_1(baseline, tmp):
    result, _ = run_trial(tmp / "sgd", dp=2, env=SGD)   # same global batch, half the accumulation
    assert_same_losses(result, baseline, "DP=2 vs DP=1", min_drop=0.05)


@pytest.mark.slow
def test_zero1_equals_zero0_with_adam(adam_baseline, tmp):
    """ZeRO-1 partitions Adam's moments over the DP ranks: the trajectory must not change."""
    zero1, _ = run_trial(tmp / "adam", dp=2, zero=1, env=ADAM)
    assert_same_losses(zero1, adam_baseline, "Adam ZeRO-1 dp=2 vs ZeRO-0 dp=1")


@pytest.mark.slow
def test_pipeline_parallel_2_equals_1_with_adam_and_clipping(adam_baseline, tmp):
    """Gradient clipping needs the global norm over all stages; DeepSpeed counts a parameter only
    where it is marked model-parallel or on rank 0 of its pipe x tensor group. Without the harness's
    marking the second stage's norm was dropped and PP=2 drifted by 1.5e-4 at step 3."""
    result, _ = run_trial(tmp / "adam", pp=2, env=ADAM)
    assert_same_losses(result, adam_baseline, "Adam PP=2 vs PP=1")


@pytest.mark.slow
def test_zero1_equals_zero0_with_sgd(baseline, tmp):
    result, _ = run_trial(tmp / "sgd", dp=2, zero=1, env=SGD)
    assert_same_losses(result, baseline, "SGD ZeRO-1 dp=2 vs ZeRO-0 dp=1", min_drop=0.05)


@pytest.mark.slow
def test_unbuildable_layout_fails_with_deepspeeds_message(tmp):
    result, proc = run_trial(tmp, pp=2, zero=2)
    assert result["status"] == "failed"
    assert "ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism" in result["message"]
    assert proc.returncode != 0


@pytest.mark.slow
def test_oversized_model_is_oom_under_a_memory_cap(tmp):
    big = {**TINY, "name": "big", "hidden_size": 4096, "num_attention_heads": 32, "vocab_size": 65536}
    result, proc = run_trial(tmp, model=big, env={"TUNER_MEMORY_LIMIT_GB": "0.5"})
    assert result["status"] == "oom", result["message"]
    assert proc.returncode != 0


# ---- Llama-family features, sequence parallelism, selective recompute ---------------------------
#: GQA (2 K/V heads for 4 query heads), SwiGLU, RoPE, untied LM head, RMSNorm, no linear biases.
LLAMA_TINY = {**TINY, "name": "tiny-llama", "num_query_groups": 2, "ffn_type": "swiglu", "ffn_hidden_size": 96,
              "position_embedding": "rope", "tie_embeddings": False, "normalization": "rmsnorm",
              "add_bias_linear": False}
LLAMA_DROP = 0.01   # with SGD at lr 0.1 it learns slower than the GPT (6.261 -> 6.244 in 3 steps)


def spec_of(model: dict):
    from tuner.specs import ModelSpec
    return ModelSpec.from_dict(model, "test model")


def whole_model_parameters(model: dict) -> int:
    m = spec_of(model)
    return m.embedding_parameters + m.num_layers * m.layer_parameters + m.output_parameters


@pytest.fixture(scope="module")
def llama_baseline(tmp):
    """The Llama-style tiny model on one process with SGD: the reference of its parallel layouts."""
    result, _ = run_trial(tmp / "sgd", model=LLAMA_TINY, env=SGD)
    assert result["status"] == "ok", result["message"]
    return result


@pytest.mark.slow
def test_llama_tiny_builds_the_specified_architecture(llama_baseline, baseline):
    """One process holds the whole model: its parameter count is the spec's (K/V of 2 heads, three
    FFN matrices, no position table, its own LM head, RMSNorm weights only, no biases)."""
    assert llama_baseline["rank0"]["parameters"] == whole_model_parameters(LLAMA_TINY)
    assert baseline["rank0"]["parameters"] == whole_model_parameters(TINY)   # GPT: tied head, biases
    assert whole_model_parameters(LLAMA_TINY) != whole_model_parameters(TINY)
    assert llama_baseline["losses"][0] - llama_baseline["losses"][-1] > LLAMA_DROP


@pytest.mark.slow
def test_sequence_parallel_tp2_equals_tp1(baseline, tmp):
    """SP on the GPT model (LayerNorm weight and bias, row-parallel biases: all summed over TP): the
    residual stream holds half the sequence per rank and the losses do not move (TP=2 without SP
    equals TP=1: test_tensor_parallel_2_equals_1)."""
    result, _ = run_trial(tmp / "sgd", tp=2, sp=True, env=SGD)
    assert_same_losses(result, baseline, "TP=2 SP vs TP=1", min_drop=0.05)
    assert result["sequence_parallel"] is True
    assert result["rank0"]["residual_tokens"] == TINY["seq_length"] // 2
    assert baseline["rank0"]["residual_tokens"] == TINY["seq_length"]


@pytest.mark.slow
def test_gqa_with_groups_equal_heads_is_multi_head(baseline, tmp):
    result, _ = run_trial(tmp / "sgd", model={**TINY, "name": "tiny-g4", "num_query_groups": 4}, env=SGD)
    assert_same_losses(result, baseline, "GQA g=a vs multi-head", min_drop=0.05)
    assert result["rank0"]["parameters"] == baseline["rank0"]["parameters"]


@pytest.mark.slow
def test_llama_tiny_tp2_with_sequence_parallel_equals_1(llama_baseline, tmp):
    """Each TP rank holds one whole K/V head and two query heads; SwiGLU's gate and up split alike;
    RMSNorm weights see half the sequence."""
    result, _ = run_trial(tmp / "sgd", tp=2, sp=True, model=LLAMA_TINY, env=SGD)
    assert_same_losses(result, llama_baseline, "Llama tiny TP=2 SP vs TP=1", min_drop=LLAMA_DROP)
    assert result["rank0"]["residual_tokens"] == TINY["seq_length"] // 2
    m = spec_of(LLAMA_TINY)
    replicated = m.embedding_parameters + m.output_parameters + m.num_layers * 2 * m.norm_params
    assert result["rank0"]["parameters"] == replicated + (whole_model_parameters(LLAMA_TINY) - replicated) // 2


@pytest.mark.slow
def test_llama_tiny_pp2_equals_1(llama_baseline, tmp):
    result, _ = run_trial(tmp / "sgd", pp=2, model=LLAMA_TINY, env=SGD)
    assert_same_losses(result, llama_baseline, "Llama tiny PP=2 vs PP=1", min_drop=LLAMA_DROP)


@pytest.mark.slow
@pytest.mark.parametrize("rc", ["selective", "full"])
def test_recompute_modes_equal_none(llama_baseline, tmp, rc):
    """Recompute changes what is kept, never the result; the counters prove it ran: selective re-runs
    the attention core of every layer once per micro-batch, full the whole layer."""
    result, _ = run_trial(tmp / "sgd", model=LLAMA_TINY, env=SGD, rc=rc)
    assert_same_losses(result, llama_baseline, f"recompute {rc} vs none", min_drop=LLAMA_DROP)
    runs, none = result["rank0"], llama_baseline["rank0"]
    assert none["attention_core_runs"] == none["layer_runs"] > 0
    assert runs["attention_core_runs"] == 2 * none["attention_core_runs"]
    assert runs["layer_runs"] == (2 if rc == "full" else 1) * none["layer_runs"]


def test_unbuildable_layout_is_a_failed_trial_with_the_refusal(tmp):
    """virtual_pipeline > 1 reaches the harness anyway: a failed trial naming why, never a run of
    something else."""
    from tuner.runners.harness.support import layout_refusal as harness_layout_refusal

    result, proc = run_trial(tmp, virtual_pipeline=2)
    assert result["status"] == "failed" and proc.returncode != 0
    assert "virtual_pipeline = 2" in result["message"] and "no interleaved schedule" in result["message"]
    layout = _layout(virtual_pipeline=2)
    assert result["message"].endswith(harness_layout_refusal(layout))


def _layout(**kw):
    from tuner.layout import Layout
    return Layout.from_dict({"tp": 1, "pp": 1, "dp": 2, "micro_batch": 1, **kw})


def test_harness_layout_refusal():
    from tuner.runners.harness.support import layout_refusal as harness_layout_refusal

    assert harness_layout_refusal(_layout()) is None
    assert harness_layout_refusal(_layout(sequence_parallel=True, recompute="selective")) is None
    assert "virtual_pipeline = 2" in harness_layout_refusal(_layout(virtual_pipeline=2))
    assert "context_parallel = 2" in harness_layout_refusal(_layout(context_parallel=2))
    assert "must divide 126 layers" in harness_layout_refusal(_layout(pp=8, dp=1), num_layers=126)
    assert harness_layout_refusal(_layout(pp=2, dp=1), num_layers=126) is None
    assert "trains in bf16" in harness_layout_refusal(_layout(), num_layers=4, precision="fp8")


def test_harness_builds_llama_models_and_refuses_what_it_cannot():
    from tuner.runners.harness.support import model_refusal
    from tuner.specs import load_model, Workload, load_cluster
    from tuner.study import harness_refusal, new_record
    from tuner.space import load_space

    for name in ("llama3-8b", "llama3-70b", "gpt-175b", "tiny"):
        w = Workload(load_model(name), load_cluster("local"), 1, 16)
        assert harness_refusal(new_record("s", w, load_space(), runner="local"), w) is None, name
    odd = spec_of({**LLAMA_TINY, "hidden_size": 60, "num_attention_heads": 4})   # head size 15
    assert "RoPE with an odd head size" in model_refusal(odd)


# ---- in-process semantics (no torchrun) ------------------------------------------------------------
@pytest.fixture
def one_rank():
    """The model's view of a single-process run (tp = pp = dp = 1), without process groups."""
    from tuner.runners.harness import topology
    saved = topology._STATE
    topology._STATE = topology.Parallel(tp=1, pp=1, dp=1, tp_rank=0, pp_rank=0, dp_rank=0, tp_group=None,
                                        dp_group=None, topology=None, grid=None)
    yield
    topology._STATE = saved


def test_gqa_query_heads_share_their_groups_kv_head(one_rank):
    """Grouped-query attention = multi-head attention whose K/V heads are the groups' heads repeated:
    query head j uses K/V head j // (heads / groups), as in Megatron-Core."""
    import torch
    from tuner.runners.harness.model import Block

    gqa = Block(spec_of(LLAMA_TINY), 0, 1234)
    mha = Block(spec_of({**LLAMA_TINY, "num_query_groups": 4}), 0, 1234)
    h, d = 64, 16
    with torch.no_grad():
        q, k, v = gqa.qkv.weight.split([h, 2 * d, 2 * d])
        rep = lambda w: w.view(2, d, h).repeat_interleave(2, dim=0).reshape(4 * d, h)   # noqa: E731
        mha.qkv.weight.copy_(torch.cat([q, rep(k), rep(v)]))
        for name in ("proj", "fc1", "fc2"):
            getattr(mha, name).weight.copy_(getattr(gqa, name).weight)
    x = torch.randn(2, 8, h, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(gqa(x), mha(x), rtol=1e-6, atol=1e-6)
    with torch.no_grad():   # a wrong grouping (head j with K/V head j % groups) is a different model
        mha.qkv.weight.copy_(torch.cat([q, k.view(2, d, h).repeat(2, 1, 1).reshape(4 * d, h),
                                        v.view(2, d, h).repeat(2, 1, 1).reshape(4 * d, h)]))
    assert not torch.allclose(gqa(x), mha(x), rtol=1e-4, atol=1e-4)


def test_rope_scores_depend_on_relative_position_only(one_rank):
    import torch
    from tuner.runners.harness.layers import apply_rotary, rotary_tables

    cos, sin = rotary_tables(16, 8)
    gen = torch.Generator().manual_seed(0)
    q, k = torch.randn(8, generator=gen), torch.randn(8, generator=gen)
    rot = lambda x, pos: apply_rotary(x.expand(1, 1, 16, 8), cos, sin)[0, 0, pos]   # noqa: E731
    score = lambda m, n: float(rot(q, m) @ rot(k, n))   # noqa: E731
    assert abs(score(3, 1) - score(10, 8)) < 1e-5 and abs(score(3, 1) - score(3, 2)) > 1e-3
    torch.testing.assert_close(rot(q, 0), q)                  # position 0 is not rotated
