"""Pipeline layouts as each framework writes them (issue 25, item 1): the named splits of tuner.pipeline_split
against the frameworks' own partitioners (transcribed below from their source, file:line at the commit
checked), the space that enumerates them, the heaviest stage the model predicts by, the store, and the flags
`launch` writes. The done-when layouts: DeepSeek-V3 on pp 16, pp 4 x vp 8 and pp 8 x vp 4 (Megatron-Core) and
BLOOM-176B on pp 12 (Megatron-DeepSpeed, tp 4)."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest
from click.testing import CliRunner

import tuner.perfmodel as perfmodel
from tuner.cli import cli
from tuner.errors import UsageError
from tuner.layout import Layout, stage_candidates, stage_layers, why_invalid
from tuner.perfmodel import memory, params, predict, stages
from tuner.pipeline_split import PIPELINE_SPLITS, chunk_sizes, why_invalid_split
from tuner.render import mcore, torchtitan
from tuner.render.launch import launch_files
from tuner.space import load_space
from tuner.specs import load_cluster, load_model, make_workload


# ---- the frameworks' own partitioners, transcribed --------------------------------------------------------
def deepspeed_partition_balanced(weights: list[int], num_parts: int) -> list[int]:
    """deepspeed/runtime/utils.py line 627 (partition_balanced) at edaa72212672, numpy replaced by lists: the
    linear-partition DP that minimises max - min part weight, ties to the latest cut."""
    n, m, inf = len(weights), num_parts, float("inf")
    if n <= m:
        return [min(p, n) for p in range(m + 1)]
    prefix = [0] + [sum(weights[:i + 1]) for i in range(n)]
    dmax = [[inf] * (m + 1) for _ in range(n + 1)]
    dmin = [[inf] * (m + 1) for _ in range(n + 1)]
    cost = [[inf] * (m + 1) for _ in range(n + 1)]
    pos = [[0] * (m + 1) for _ in range(n + 1)]
    dmax[0][0] = cost[0][0] = 0
    for i in range(1, n + 1):
        for j in range(1, min(i, m) + 1):
            for k in range(i):
                part = prefix[i] - prefix[k]
                hi, lo = max(dmax[k][j - 1], part), min(dmin[k][j - 1], part)
                if cost[i][j] >= hi - lo:
                    cost[i][j], dmax[i][j], dmin[i][j], pos[i][j] = hi - lo, hi, lo, k
    parts = [n]
    for j in reversed(range(1, m + 1)):
        parts.append(pos[parts[-1]][j])
    return parts[::-1]


def deepspeed_stage_layers(num_layers: int, pp: int) -> list[int]:
    """Transformer layers per stage of Megatron-DeepSpeed's GPTModelPipe (megatron/model/gpt_model.py lines
    349-441 at 4efb479d5317: a cast, the embedding, the layers, the final norm, the tied LM head, a cast) under
    partition_method 'type:transformer' (line 463; deepspeed/runtime/pipe/module.py line 412: weight 1 for a
    layer whose class name matches, 0 otherwise)."""
    weights = [0, 0] + [1] * num_layers + [0, 0, 0]
    parts = deepspeed_partition_balanced(weights, pp)
    return [sum(weights[parts[s]:parts[s + 1]]) for s in range(pp)]


def torchtitan_fqns(num_stages: int, num_layers: int, input_weight: int = 1, output_weight: int = 1) -> list:
    """torchtitan/distributed/pipeline_parallel.py line 236 (generate_llm_fqn_per_model_part) at 238fa9953e4a."""
    if num_stages == 1:
        return [["tok_embeddings"] + [f"layers.{i}" for i in range(num_layers)] + ["norm", "output"]]
    per, extra = divmod(num_layers + input_weight + output_weight, num_stages)
    out, cur = [], 0
    for s in range(num_stages):
        k = per + (s < extra)
        mods = ["tok_embeddings"] if s == 0 else []
        k -= input_weight if s == 0 else output_weight if s == num_stages - 1 else 0
        for _ in range(k):
            if cur < num_layers:
                mods.append(f"layers.{cur}")
                cur += 1
        out.append(mods + (["norm", "output"] if s == num_stages - 1 else []))
    return out


def megatron_parse_layout(text: str) -> list[list[str]]:
    """megatron/core/transformer/pipeline_parallel_layer_layout.py line 283 (parse_str_to_list) at d98e8a64ddf3:
    commas dropped, "(...)*n" then "x*n" unrolled, stages split at "|"."""
    text = text.replace(",", "")
    for pattern in (r"\(([^)]+)\)\*(\d+)", r"(.)\*(\d+)"):
        text = re.sub(pattern, lambda x: x.group(1) * int(x.group(2)), text)
    return [list(stage) for stage in text.split("|")]


# ---- the named splits are the frameworks' own ---------------------------------------------------------------
@pytest.mark.parametrize("layers, pp", [(70, 12), (61, 16), (61, 8), (30, 4), (95, 12), (80, 3), (24, 5)])
def test_balanced_is_deepspeeds_partition_of_the_transformer_layers(layers, pp):
    assert list(chunk_sizes(layers, pp, 1, "balanced")) == deepspeed_stage_layers(layers, pp)


def test_bloom_on_pp12_is_ten_stages_of_six_then_two_of_five():
    assert chunk_sizes(70, 12, 1, "balanced") == (6,) * 10 + (5, 5)
    assert chunk_sizes(70, 12, 1, "auto") == (5,) + (6,) * 10 + (5,)     # BigScience's fork: transformer|embedding


@pytest.mark.parametrize("layers, pp, vp", [(61, 8, 4), (61, 4, 8), (61, 16, 1), (94, 4, 5), (70, 8, 1), (61, 2, 1)])
def test_balanced_ends_is_torchtitans_own_split_and_writes_its_modules(layers, pp, vp):
    chunks = chunk_sizes(layers, pp, vp, "balanced-ends")
    want = torchtitan_fqns(pp * vp, layers)
    assert [sum(n.startswith("layers.") for n in part) for part in want] == list(chunks)
    assert torchtitan.module_fqns(chunks) == want


def test_light_last_is_nvidias_deepseek_v3_recipe_layouts():
    """Megatron-Bridge recipes/deepseek/h100/deepseek_v3.py line 53 at 067f987df03b (without the MTP layer)."""
    recipe = {(4, 1): [16, 16, 16, 13], (8, 1): [8] * 7 + [5], (4, 2): [8] * 7 + [5],
              (16, 1): [4] * 15 + [1], (8, 2): [4] * 15 + [1], (4, 4): [4] * 15 + [1]}
    for (pp, vp), want in recipe.items():
        assert list(chunk_sizes(61, pp, vp, "light-last")) == want, (pp, vp)


def test_deepseek_v3_on_32_chunks_is_the_layout_nvidia_runs():
    """"Et|(tt|)*30L" (Megatron-MoE-ModelZoo's DeepSeek-V3 guide, pp 8 x vp 4) is balanced-ends over 32 chunks,
    and the string launch writes parses to the same stages."""
    guide = megatron_parse_layout("Et|(tt|)*30L")
    for pp, vp in ((8, 4), (4, 8)):
        chunks = chunk_sizes(61, pp, vp, "balanced-ends")
        assert [s.count("t") for s in guide] == list(chunks)
        assert megatron_parse_layout(mcore.pipeline_layout(chunks)) == guide


@pytest.mark.parametrize("layers, pp, vp, split", [(61, 16, 1, "light-last"), (70, 12, 1, "balanced"),
                                                   (61, 8, 4, "balanced-ends"), (61, 4, 1, "light-last")])
def test_megatron_layout_strings_parse_back_to_the_chunks(layers, pp, vp, split):
    chunks = chunk_sizes(layers, pp, vp, split)
    stages = megatron_parse_layout(mcore.pipeline_layout(chunks))
    assert [s.count("t") for s in stages] == list(chunks)
    assert stages[0][0] == "E" and stages[-1][-1] == "L" and "".join(map("".join, stages)).count("E") == 1
    assert len(stages) % pp == 0 and len(stages) // pp == vp     # arguments.py line 944 derives vp from it


def test_one_name_per_layout_and_refusals_that_name_the_fix():
    assert "use --pipeline-split auto" in why_invalid_split(96, 8, 1, "balanced")        # equal stages already
    assert "use --pipeline-split auto" in why_invalid_split(70, 12, 1, "balanced-ends")  # Megatron's (L+2)/n split
    assert "--pipeline-split balanced, balanced-ends or light-last" in why_invalid_split(61, 16, 1, "auto")
    assert "use fewer stages" in why_invalid_split(61, 8, 4, "light-last")                # the loss stage < 0 layers
    assert why_invalid_split(61, 1, 1, "balanced") is not None                            # one stage: auto
    assert all(why_invalid_split(61, 16, 1, s) is None for s in PIPELINE_SPLITS[1:])


def test_megatron_deepspeed_runs_equal_stages_or_deepspeeds_balance_only():
    w = make_workload("bloom-176b", 48, load_cluster("a100"), framework="megatron-deepspeed")
    lay = Layout(tp=4, pp=12, dp=8, micro_batch=2, zero_stage=0, recompute="full")
    assert "use --pipeline-split balanced" in why_invalid(lay, w)           # Megatron-Core's (L+2)/n split
    assert why_invalid(dataclasses.replace(lay, pipeline_split="balanced"), w) is None
    w32 = dataclasses.replace(w, nodes=32)
    ends = dataclasses.replace(lay, pp=16, dp=4, pipeline_split="balanced-ends")
    assert "type:transformer" in why_invalid(ends, w32)
    core = dataclasses.replace(w, framework="megatron-core")
    assert why_invalid(lay, core) is None
    assert why_invalid(dataclasses.replace(ends, zero_stage=1), dataclasses.replace(core, nodes=32)) is None


# ---- the space enumerates them --------------------------------------------------------------------------------
def deepseek(nodes: int = 128):
    return make_workload("deepseek-v3", nodes, load_cluster("h100"), framework="megatron-core")


PINS = {"tp": 2, "sequence_parallel": True, "context_parallel": 1, "expert_parallel": 64, "expert_tensor_parallel": 1,
        "micro_batch": 1, "zero_stage": 1, "recompute": "full"}


def test_the_default_space_holds_deepseek_v3s_published_layouts():
    got = {(c.pp, c.virtual_pipeline, c.pipeline_split) for c in load_space("default").pinned(PINS).enumerate_layouts(deepseek())}
    assert {(16, 1, "light-last"), (8, 4, "balanced-ends"), (4, 8, "balanced-ends")} <= got
    assert not {c for c in got if c[2] == "auto" and c[0] in (4, 8, 16)}      # 61 layers: never equal stages
    assert (1, 1, "auto") in got and {(2, 1, "balanced"), (2, 1, "light-last")} <= got
    assert not {c for c in got if c[1] not in (1, 2, 4, 8) and c[2] != "auto"}  # the space's uneven_interleaving


def test_the_default_space_holds_blooms_layout_on_megatron_deepspeed():
    w = make_workload("bloom-176b", 48, load_cluster("a100"), framework="megatron-deepspeed")
    pins = {"tp": 4, "sequence_parallel": False, "micro_batch": 2, "zero_stage": 0, "recompute": "full"}
    got = {(c.pp, c.pipeline_split) for c in load_space("default").pinned(pins).enumerate_layouts(w)}
    assert (12, "balanced") in got and (12, "auto") not in got      # 384 GPUs / tp 4 / (dp x mb 2 | 2048): pp 3-24
    assert {s for _, s in got} == {"balanced"}                       # 70 over 3, 6, 12, 24: uneven, DeepSpeed's


# ---- predicted by the heaviest stage ---------------------------------------------------------------------------
LAYOUTS = [Layout(tp=2, sequence_parallel=True, pp=16, pipeline_split=s, dp=32, expert_parallel=64, micro_batch=1,
                  recompute=r) for s in ("balanced", "balanced-ends", "light-last") for r in ("full", "none")] + [
    Layout(tp=2, sequence_parallel=True, pp=8, virtual_pipeline=4, pipeline_split="balanced-ends", dp=64,
           expert_parallel=64, micro_batch=1, recompute="full")]


@pytest.mark.parametrize("lay", LAYOUTS, ids=lambda lay: lay.key())
def test_every_rank_considered_changes_nothing(lay, monkeypatch):
    """The prediction over the candidate ranks equals the one over every rank: no rank left out is heavier."""
    w = deepseek()
    assert why_invalid(lay, w) is None
    fast = predict(lay, w)
    every = lambda layout, model: tuple(range(layout.pp))       # noqa: E731
    monkeypatch.setattr(params, "stage_candidates", every)       # the stage holding the most parameters
    monkeypatch.setattr(stages, "stage_candidates", every)
    monkeypatch.setattr(memory, "stage_candidates", every)
    slow = predict(lay, w)
    assert (slow.step_time_s, slow.memory_gb, slow.memory_stage) == (fast.step_time_s, fast.memory_gb, fast.memory_stage)
    assert len(stage_candidates(lay, w.model)) < lay.pp


def test_the_step_follows_the_heaviest_stage():
    """BLOOM on Megatron-Core, pp 12: balanced puts 6 layers and the embedding on stage 0; auto (Megatron's
    split) 5 there. Same heaviest middle stage (6 layers), so the same stage time unless the embedding stage
    is heavier; and the step is the slowest stage's time x micro-batches plus the bubble."""
    w = make_workload("bloom-176b", 48, load_cluster("a100"), framework="megatron-core")
    for split in ("auto", "balanced"):
        lay = Layout(tp=4, pp=12, pipeline_split=split, dp=8, micro_batch=2, zero_stage=1, recompute="full")
        p, stages = predict(lay, w), perfmodel.stage_times(lay, w)
        slow = max(perfmodel.stage_total(s) for s in stages)
        assert p.time_breakdown["bubble"] == pytest.approx(11 * slow)
        assert [stage_layers(lay, 70, s) for s in stage_candidates(lay, w.model)] == (
            [5, 6, 5] if split == "auto" else [6, 5, 5])
    auto, bal = (predict(Layout(tp=4, pp=12, pipeline_split=s, dp=8, micro_batch=2, zero_stage=1, recompute="full"), w)
                 for s in ("auto", "balanced"))
    assert bal.step_time_s >= auto.step_time_s and bal.memory_gb > auto.memory_gb   # 6 layers + embedding on stage 0


# ---- stored and reloaded --------------------------------------------------------------------------------------
def test_a_split_round_trips_through_json_the_key_and_the_store(tmp_path):
    from tuner.store import open_store
    from tuner.trial import Status, TrialResult
    from test_migrations import add_study, add_trial, old_store, run_sql
    lay = LAYOUTS[4]
    assert "-pslast-" in lay.key() and Layout.from_dict(json.loads(json.dumps(lay.as_dict()))) == lay
    assert Layout.from_dict({k: v for k, v in lay.as_dict().items() if k != "pipeline_split"}).pipeline_split == "auto"
    assert lay.env()["TUNER_PIPELINE_SPLIT"] == "light-last"
    url = f"sqlite:///{tmp_path}/t.db"
    from tuner.study import StudyRecord
    with open_store(url) as store:
        store.create_study(StudyRecord(name="s", workload=deepseek().as_dict(), space={}, searcher="random",
                                       runner="sim"))
        store.record_trial("s", lay, None, TrialResult(Status.OK, samples_per_second=1.0), "sim")
    with open_store(url) as again:
        (t,) = again.trials("s")
    assert t.layout == lay
    old = f"sqlite:///{tmp_path}/old.db"                      # a schema-4 store: its layouts read as auto
    old_store(old, 4)
    run_sql(old, lambda c: add_trial(c, add_study(c, "o", "22b", 8), 1, "tp1-pp8-dp8-mb1-z1-rcfull",
                                     sequence_parallel=False, context_parallel=1, virtual_pipeline=1,
                                     expert_parallel=1, expert_tensor_parallel=1, recompute="full",
                                     samples_per_second=2.0, mfu=0.2))
    from tuner.store import upgrade
    assert "from schema version 4 to" in upgrade(old)
    with open_store(old) as again:
        (t,) = again.trials("o")
    assert t.layout.pipeline_split == "auto" and t.layout.key() == "tp1-pp8-dp8-mb1-z1-rcfull"


# ---- launch writes the framework's own flags -------------------------------------------------------------------
def args_of(lay, w) -> list[str]:
    return launch_files(lay, w, "/scratch/l", framework=w.framework, train_iters=10, mock_data=True) \
        ["megatron_args.txt"].split("\n")


def flag(args: list[str], name: str) -> str | None:
    return args[args.index(name) + 1] if name in args else None


def test_megatron_core_writes_first_and_last_stage_layers_or_the_layout_string():
    w = deepseek()
    pp16 = args_of(LAYOUTS[4], w)
    assert (flag(pp16, "--decoder-first-pipeline-num-layers"), flag(pp16, "--decoder-last-pipeline-num-layers")) == ("4", "1")
    assert "--pipeline-model-parallel-layout" not in pp16 and "--account-for-loss-in-pipeline-split" not in pp16
    vp = args_of(LAYOUTS[-1], w)
    assert flag(vp, "--pipeline-model-parallel-layout") == "Et|(t*2|)*30L"
    assert "--num-layers-per-virtual-pipeline-stage" not in vp and "--decoder-first-pipeline-num-layers" not in vp
    bal = args_of(LAYOUTS[0], w)       # 4 x 13 | 3 x 3: not first/last + equal middle
    assert [s.count("t") for s in megatron_parse_layout(flag(bal, "--pipeline-model-parallel-layout"))] == [4] * 13 + [3] * 3


def test_torchtitan_writes_the_stages_modules():
    import tomllib
    w = make_workload("deepseek-v3", 128, load_cluster("h100"), framework="torchtitan")
    lay = Layout(tp=1, pp=8, virtual_pipeline=4, pipeline_split="balanced-ends", dp=128, expert_parallel=64,
                 micro_batch=1, zero_stage=3, recompute="full")
    assert why_invalid(lay, w) is None
    job = tomllib.loads(launch_files(lay, w, "/scratch/l", framework="torchtitan", train_iters=10,
                                     mock_data=True)["torchtitan.toml"])
    par = job["parallelism"]
    assert par["module_fqns_per_model_part"] == torchtitan_fqns(32, 61)
    assert par["pipeline_parallel_schedule"] == "Interleaved1F1B" and "pipeline_parallel_layers_per_stage" not in par


def test_megatron_deepspeed_needs_no_flag_for_its_balance():
    w = make_workload("bloom-176b", 48, load_cluster("a100"), framework="megatron-deepspeed")
    lay = Layout(tp=4, pp=12, pipeline_split="balanced", dp=8, micro_batch=2, zero_stage=0, recompute="full")
    files = launch_files(lay, w, "/scratch/l", framework="megatron-deepspeed", train_iters=10,
                         data_path="/d/bloom_text_document", tokenizer="bigscience/bloom")
    args = files["megatron_args.txt"].split("\n")
    assert (flag(args, "--pipeline-model-parallel-size"), flag(args, "--num-layers")) == ("12", "70")
    assert not [a for a in args if "pipeline-split" in a or "partition" in a]
    assert json.loads(files["layout.json"])["layout"]["pipeline_split"] == "balanced"
    with pytest.raises(UsageError, match="type:transformer"):
        launch_files(dataclasses.replace(lay, pp=16, dp=4, pipeline_split="balanced-ends"), dataclasses.replace(w, nodes=32), "/scratch/l",
                     framework="megatron-deepspeed", train_iters=10, data_path="/d/x", tokenizer="t")


# ---- done when: predict, plan (a search space) and launch from the command line -------------------------------
DONE_WHEN = [
    ("deepseek-v3", "h100", 128, "megatron-core",
     ["--tp", "2", "--sequence-parallel", "--pp", "16", "--pipeline-split", "light-last", "--ep", "64", "--recompute", "full"],
     ["--decoder-first-pipeline-num-layers", "4", "--decoder-last-pipeline-num-layers", "1"]),
    ("deepseek-v3", "h100", 128, "megatron-core",
     ["--tp", "2", "--sequence-parallel", "--pp", "8", "--vp", "4", "--pipeline-split", "balanced-ends", "--ep", "64",
      "--recompute", "full"], ["--pipeline-model-parallel-layout", "Et|(t*2|)*30L"]),
    ("deepseek-v3", "h100", 128, "megatron-core",
     ["--tp", "2", "--sequence-parallel", "--pp", "4", "--vp", "8", "--pipeline-split", "balanced-ends", "--ep", "64",
      "--recompute", "full"], ["--pipeline-model-parallel-layout", "Et|(t*2|)*30L"]),
    ("bloom-176b", "a100", 48, "megatron-deepspeed",
     ["--tp", "4", "--pp", "12", "--pipeline-split", "balanced", "--recompute", "full", "--zero-stage", "0"],
     ["--pipeline-model-parallel-size", "12", "--tensor-model-parallel-size", "4"]),
]


@pytest.mark.parametrize("model, cluster, nodes, fw, pins, want", DONE_WHEN, ids=lambda x: x if isinstance(x, str) else None)
def test_published_layouts_predict_plan_and_launch(model, cluster, nodes, fw, pins, want, tmp_path):
    r = CliRunner()
    base = ["--model", model, "--cluster", cluster, "--nodes", str(nodes), "--framework", fw]
    mb = ["--micro-batch", "2" if model == "bloom-176b" else "1"]
    got = r.invoke(cli, ["predict", *base, *pins, *mb, "--format", "json"])
    assert got.exit_code == 0, got.output
    split = pins[pins.index("--pipeline-split") + 1]
    assert json.loads(got.output)["layout"]["pipeline_split"] == split
    plan = r.invoke(cli, ["plan", *base, *pins, *mb, "--all", "--format", "json"])
    assert plan.exit_code == 0, plan.output
    assert {row["layout"]["pipeline_split"] for row in json.loads(plan.output)} == {split}
    db = f"sqlite:///{tmp_path}/t.db"
    search = r.invoke(cli, ["search", *base, *pins, *mb, "--runner", "sim", "--budget", "1", "--study", "s",
                            "--db", db])
    assert search.exit_code == 0, search.output
    out = tmp_path / "launch"
    data = ["--mock-data"] if fw != "megatron-deepspeed" else ["--data-path", "/d/x_text_document", "--tokenizer", "t"]
    launched = r.invoke(cli, ["launch", "s", "--out", str(out), "--train-iters", "10", "--db", db, *data])
    assert launched.exit_code == 0, launched.output
    args = (out / "megatron_args.txt").read_text().split("\n")
    assert all(a in args for a in want), (want, args)
    assert json.loads((out / "layout.json").read_text())["layout"]["pipeline_split"] == split


def test_the_interleaved_bubble_waits_on_the_largest_chunk():
    """GPT-3 175B's 96 layers on pp 8: vp 8 balanced (chunks of 2 and 1 layers) has the bubble of vp 6's equal
    2-layer chunks, not of 1.5-layer ones; vp 4 (3-layer chunks) a larger one."""
    w = make_workload("gpt-175b", 64, load_cluster("h100"), global_batch=1536)
    bubble = {}
    for vp, split in ((6, "auto"), (8, "balanced"), (4, "auto")):
        lay = Layout(tp=8, sequence_parallel=True, pp=8, virtual_pipeline=vp, pipeline_split=split, dp=8, micro_batch=4,
                     recompute="none")
        p = predict(lay, w)
        slow = max(perfmodel.stage_total(s) for s in perfmodel.stage_times(lay, w))
        bubble[vp] = p.time_breakdown["bubble"]
        assert bubble[vp] == pytest.approx(7 * slow * max(chunk_sizes(96, 8, vp, split)) / 12)
    # equal compute; vp 8 pays two more chunks' fixed dispatch cost (1 ms each, once per model chunk) in its stage
    assert bubble[8] == pytest.approx(bubble[6], rel=0.01) and bubble[4] > bubble[6]
