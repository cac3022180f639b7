"""The pure Slurm pieces: sbatch scripts (golden files), [slurm] validation, quoting, Megatron args (golden,
and every flag checked against Megatron-DeepSpeed) and logs.

Regenerate the golden files after an intended change with TUNER_UPDATE_GOLDEN=1 python -m pytest tests/test_sbatch.py
and review the diff.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest

from tuner.errors import UsageError
from tuner.layout import Layout
from tuner.render.dsconfig import ADAM_PARAMS, GRADIENT_CLIPPING, render_ds_config
from tuner.render.megatron import OPTIMIZER_ARGS, deepspeed_config, pretrain_args
from tuner.render.sbatch import SLURM_KEYS, job_name, render_sbatch, time_limit_for, validate_slurm
from tuner.runners import make_runner, megatron
from tuner.runners.slurm_jobs import map_state
from tuner.specs import ModelSpec, load_cluster, load_model, make_workload
from tuner.trial import Status, TrialSpec, looks_oom

HERE = Path(__file__).parent
GOLDEN = HERE / "golden"
FIXTURES = HERE / "fixtures"
TRIAL_DIR = "/lustre/orion/abc123/results/trials/gpt175b-frontier/7"
STUDY_LAYOUT = Layout(tp=4, pp=16, dp=2, micro_batch=1, zero_stage=1, recompute="full")


def frontier_trial(model: ModelSpec | str = "175b") -> TrialSpec:
    w = make_workload(model, 16, "frontier", 640)
    return TrialSpec("gpt175b-frontier", 7, STUDY_LAYOUT, w)


def frontier_slurm(**extra) -> dict:
    table = dict(frontier_trial().workload.cluster.slurm)
    table.update(account="abc123", partition="batch", time_limit="00:30:00", **extra)
    return table


MEGATRON = dict(megatron_dir="/lustre/orion/abc123/Megatron-DeepSpeed",
                megatron_args=["--data-path", "/lustre/orion/abc123/data/pile_text_document",
                               "--vocab-file", "gpt2-vocab.json", "--merge-file", "gpt2-merges.txt"])


def check_golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("TUNER_UPDATE_GOLDEN"):
        path.write_text(text)
    assert path.exists(), f"{path} missing: run with TUNER_UPDATE_GOLDEN=1 once and review it"
    assert text == path.read_text(), f"{name} differs from the golden file (TUNER_UPDATE_GOLDEN=1 to accept)"


# ---- golden scripts -----------------------------------------------------------------------------
def test_frontier_harness_script_matches_golden():
    script = render_sbatch(frontier_trial(), frontier_slurm(), template="harness", python="python",
                           trial_dir=TRIAL_DIR)
    check_golden("sbatch_frontier_harness.sh", script)


def test_frontier_megatron_script_matches_golden():
    script = render_sbatch(frontier_trial(), frontier_slurm(**MEGATRON), template="megatron", python="python",
                           trial_dir=TRIAL_DIR)
    check_golden("sbatch_frontier_megatron.sh", script)


def test_frontier_script_carries_the_studys_launch_settings():
    script = render_sbatch(frontier_trial(), frontier_slurm(), template="harness", python="python",
                           trial_dir=TRIAL_DIR)
    for needle in ("#SBATCH --nodes=16", "#SBATCH --ntasks-per-node=8", "#SBATCH --gpus-per-node=8",
                   "--gpu-bind=closest", "export NCCL_NET_GDR_LEVEL=3", "export FI_CXI_ATS=0",
                   "export CUDA_DEVICE_MAX_CONNECTIONS=1", "module load rocm/5.7.0",
                   "export TUNER_TRIAL_JSON=" + TRIAL_DIR + "/trial.json", "export TUNER_TP=4",
                   "-m tuner.runners.harness.train", 'RANK="$SLURM_PROCID"', 'LOCAL_RANK="$SLURM_LOCALID"',
                   "export MASTER_ADDR="):
        assert needle in script, needle


@pytest.mark.parametrize("template", ["harness", "megatron"])
def test_rendered_scripts_are_valid_bash(template):
    script = render_sbatch(frontier_trial(), frontier_slurm(**MEGATRON), template=template, python="python",
                           trial_dir=TRIAL_DIR)
    subprocess.run(["bash", "-n"], input=script, text=True, check=True)


# ---- quoting (issue 8, item 5) --------------------------------------------------------------------
HOSTILE = "gpt'; touch /tmp/tuner-pwned #\n$(touch /tmp/tuner-pwned2) `id` \"x\" ${HOME}"


def test_a_hostile_model_name_cannot_inject_shell(tmp_path):
    base = load_model("tiny")
    model = ModelSpec(**{**base.as_dict(), "name": HOSTILE})
    w = make_workload(model, 1, "local-slurm", 16)
    trial = TrialSpec("s", 0, Layout(tp=1, pp=1, dp=2, micro_batch=1), w)
    trial_dir = tmp_path / "it's a dir; rm -rf ~"
    script = render_sbatch(trial, w.cluster.slurm, template="command", python="python", trial_dir=trial_dir,
                           command=["printenv", "TUNER_MODEL"])
    subprocess.run(["bash", "-n"], input=script, text=True, check=True)
    # The name reaches the shell only as one single-quoted word, never as code or as a new line.
    exports = [l for l in script.splitlines() if l.startswith("export TUNER_MODEL=")]
    assert exports == ["export TUNER_MODEL=" + shlex.quote(HOSTILE).split("\n")[0]]
    assert shlex.split(script.split("export TUNER_MODEL=", 1)[1])[0] == HOSTILE
    header = script.splitlines()[1]
    assert header.startswith("# ") and "\\n" in header          # escaped in the comment, not a line break
    # Run the part of the script before srun in a real bash: the variables hold the exact strings
    # and nothing was executed.
    trial_dir.mkdir()
    prologue = script.split('export MASTER_ADDR=')[0] + 'printf "%s" "$TUNER_MODEL" > model.txt\n'
    subprocess.run(["bash", "-c", prologue], check=True, cwd=tmp_path)
    assert (trial_dir / "model.txt").read_text() == HOSTILE
    assert not Path("/tmp/tuner-pwned").exists() and not Path("/tmp/tuner-pwned2").exists()


@pytest.mark.parametrize("key,value", [
    ("account", "abc\n#SBATCH --wrap=evil"), ("partition", "batch; rm -rf /"), ("qos", "normal\nid"),
    ("gpu_bind", "closest && id"), ("extra_sbatch", ["--exclusive\nrm -rf /"]), ("modules", ["rocm\nid"]),
    ("env", {"A;B": "1"}), ("time_limit", "30 minutes"),
])
def test_values_that_would_break_a_directive_are_refused(key, value):
    with pytest.raises(UsageError, match=f"slurm key '{key}'"):
        validate_slurm({key: value})


def test_env_and_modules_values_are_quoted():
    script = render_sbatch(frontier_trial(), frontier_slurm(env={"X": "a b;c"}, modules=["my mod"]),
                           python="python", trial_dir=TRIAL_DIR)
    assert "export X='a b;c'" in script and "module load 'my mod'" in script


# ---- [slurm] validation --------------------------------------------------------------------------
def test_unknown_key_lists_the_valid_ones():
    with pytest.raises(UsageError) as e:
        validate_slurm({"acount": "x"})
    assert "acount" in str(e.value) and all(k in str(e.value) for k in SLURM_KEYS)


def test_wrong_types_are_refused():
    with pytest.raises(UsageError, match="tasks_per_node' must be int"):
        validate_slurm({"tasks_per_node": "8"})
    with pytest.raises(UsageError, match="must be a list of strings"):
        validate_slurm({"modules": [1]})
    with pytest.raises(UsageError, match="precision"):
        validate_slurm({"precision": "fp8"})


def test_rank_count_must_match_the_layout():
    with pytest.raises(UsageError, match="tasks_per_node = 8"):
        render_sbatch(frontier_trial(), frontier_slurm(tasks_per_node=4), python="python", trial_dir=TRIAL_DIR)


def test_megatron_template_needs_megatron_dir():
    with pytest.raises(UsageError, match="megatron_dir"):
        render_sbatch(frontier_trial(), frontier_slurm(), template="megatron", python="python", trial_dir=TRIAL_DIR)


def test_job_name_and_time_limit():
    assert job_name(TrialSpec("my study/..", 3, STUDY_LAYOUT, frontier_trial().workload)) == "tuner-my_study_..-3"
    assert time_limit_for(None) is None and time_limit_for(60) == "2" and time_limit_for(61) == "3"


def test_state_mapping():
    assert map_state("RUNNING") == (None, False) and map_state("PENDING") == (None, False)
    assert map_state("OUT_OF_MEMORY") == (Status.OOM, False)
    assert map_state("TIMEOUT") == (Status.TIMEOUT, False)
    assert map_state("NODE_FAIL") == (Status.FAILED, True)
    assert map_state("CANCELLED by 0") == (Status.INTERRUPTED, False)
    assert map_state("FAILED") == (Status.FAILED, False)


# ---- Megatron arguments and DeepSpeed config ------------------------------------------------------
def test_megatron_args_for_the_175b_layout():
    w = frontier_trial().workload
    args = pretrain_args(STUDY_LAYOUT, w, precision="fp16")
    pairs = dict(zip(args, args[1:]))
    assert pairs["--tensor-model-parallel-size"] == "4" and pairs["--pipeline-model-parallel-size"] == "16"
    assert pairs["--micro-batch-size"] == "1" and pairs["--global-batch-size"] == "640"
    assert pairs["--num-layers"] == "96" and pairs["--hidden-size"] == "12288"
    assert pairs["--num-attention-heads"] == "96" and pairs["--seq-length"] == "2048"
    assert pairs["--max-position-embeddings"] == "2048"
    assert pairs["--deepspeed_config"] == "ds_config.json" and pairs["--zero-stage"] == "1"
    assert {"--fp16", "--checkpoint-activations", "--deepspeed-activation-checkpointing", "--deepspeed"} <= set(args)
    assert "--bf16" not in args and "--no-pipeline-parallel" not in args
    no_ckpt = pretrain_args(Layout(tp=8, pp=1, dp=16, micro_batch=2, zero_stage=2,
                                   recompute="none"), w)
    assert "--checkpoint-activations" not in no_ckpt and "--no-pipeline-parallel" in no_ckpt and "--bf16" in no_ckpt


def test_deepspeed_config_agrees_with_megatron_args():
    """The study's bug: DeepSpeed told micro-batch 4 while Megatron used 1. One source, no disagreement."""
    w = frontier_trial().workload
    for lay in (STUDY_LAYOUT, Layout(tp=2, pp=8, dp=8, micro_batch=4)):
        ds = deepspeed_config(lay, w, precision="fp16")
        args = pretrain_args(lay, w)
        mb = int(args[args.index("--micro-batch-size") + 1])
        assert ds["train_micro_batch_size_per_gpu"] == mb == lay.micro_batch
        assert ds["train_batch_size"] == mb * ds["gradient_accumulation_steps"] * lay.dp == 640
        assert ds["zero_optimization"]["stage"] == lay.zero_stage and ds["fp16"]["enabled"]


# Every flag pretrain_args writes, with the line of microsoft/Megatron-DeepSpeed's megatron/arguments.py
# (HEAD f4157bea69f3, 2024-12-24) that defines it: `git -C <mirror> show HEAD:megatron/arguments.py |
# grep -n -- "'--flag'"`. `--deepspeed` and `--deepspeed_config` are DeepSpeed's own (deepspeed/__init__.py,
# _add_core_arguments), added by `parser = deepspeed.add_config_arguments(parser)` at line 54.
# `--checkpoint-activations` is marked deprecated there but kept on purpose ("DeepSpeed still relies on
# the old activation checkpointing mechanism", line 862): GPTModelPipe and ParallelTransformer read it.
MEGATRON_FLAGS = {
    "--tensor-model-parallel-size": 1149, "--pipeline-model-parallel-size": 1154, "--num-layers": 602,
    "--hidden-size": 616, "--ffn-hidden-size": 618, "--num-attention-heads": 621, "--seq-length": 1278,
    "--max-position-embeddings": 630, "--micro-batch-size": 801, "--global-batch-size": 808,
    "--train-iters": 873, "--log-interval": 887, "--eval-iters": 1220, "--lr": 1017, "--min-lr": 1048,
    "--lr-decay-style": 1021, "--weight-decay": 772, "--adam-beta1": 783, "--adam-beta2": 786,
    "--clip-grad": 781, "--init-method-std": 1005, "--fp16": 1111, "--bf16": 1113,
    "--checkpoint-activations": 864, "--deepspeed-activation-checkpointing": 1524, "--zero-stage": 1487,
    "--no-pipeline-parallel": 954, "--deepspeed": 54, "--deepspeed_config": 54,
    # deepspeedai/Megatron-DeepSpeed 4efb479d5317 (arguments.py unchanged since f4157bea69f3):
    "--sequence-parallel": 972, "--recompute-granularity": 830, "--transformer-impl": 516, "--fp8-hybrid": 508,
    "--fp8-amax-history-len": 520, "--fp8-amax-compute-algo": 523,
    "--num-key-value-heads": 623, "--use-rotary-position-embeddings": 633, "--no-position-embedding": 640,
    "--normalization": 647, "--swiglu": 670, "--untie-embeddings-and-output-weights": 680,
    "--disable-bias-linear": 937,
    # the launch's RoPE base, flash attention, data and checkpoints (4efb479d5317): --rotary-position-embeddings-theta
    # (dest rope_theta), --use-flash-attn-v2, --tokenizer-type HFTokenizer (a choice at 1306)
    "--rotary-position-embeddings-theta": 635, "--use-flash-attn-v2": 930, "--data-path": 1238, "--split": 1246,
    "--tokenizer-type": 1299, "--tokenizer-model": 1309, "--save": 1069, "--save-interval": 1071, "--load": 1077,
}


def test_megatron_deepspeed_builds_the_llama_architecture():
    """A Llama model launched with Megatron-DeepSpeed gets its architecture flags (never a plain GPT of
    the same size); a GPT model gets none of them."""
    from tuner.specs import make_workload
    w = make_workload("llama3-70b", 8, "h100")
    args = pretrain_args(Layout(tp=8, sequence_parallel=True, pp=1, dp=8, micro_batch=1, zero_stage=1), w)
    flags = {a for a in args if a.startswith("--")}
    assert flags <= set(MEGATRON_FLAGS), f"unchecked flags {flags - set(MEGATRON_FLAGS)}: check them in arguments.py"
    assert args[args.index("--num-key-value-heads") + 1] == "8" and args[args.index("--normalization") + 1] == "rmsnorm"
    assert {"--swiglu", "--use-rotary-position-embeddings", "--no-position-embedding",
            "--untie-embeddings-and-output-weights", "--disable-bias-linear"} <= flags
    assert args[args.index("--ffn-hidden-size") + 1] == "28672"
    gpt = {a for a in pretrain_args(STUDY_LAYOUT, frontier_trial().workload) if a.startswith("--")}
    assert not gpt & {"--swiglu", "--num-key-value-heads", "--normalization", "--use-rotary-position-embeddings"}


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
@pytest.mark.parametrize("lay", [STUDY_LAYOUT, Layout(tp=8, pp=1, dp=16, micro_batch=2, zero_stage=2,
                                                      recompute="none")])
def test_every_megatron_flag_exists_in_megatron_deepspeed(lay, precision):
    args = pretrain_args(lay, frontier_trial().workload, precision=precision)
    flags = {a for a in args if a.startswith("--")}
    assert flags <= set(MEGATRON_FLAGS), f"unchecked flags {flags - set(MEGATRON_FLAGS)}: check them in arguments.py"


@pytest.mark.parametrize("lay, precision", [
    (Layout(tp=8, sequence_parallel=True, pp=1, dp=16, micro_batch=2, zero_stage=1, recompute="selective"), "bf16"),
    (Layout(tp=8, pp=1, dp=16, micro_batch=2, zero_stage=1), "fp8"),
])
def test_every_new_dimension_flag_exists_in_megatron_deepspeed(lay, precision):
    w = dataclasses.replace(frontier_trial().workload, precision=precision)
    args = pretrain_args(lay, w)
    flags = {a for a in args if a.startswith("--")}
    assert flags <= set(MEGATRON_FLAGS), f"unchecked flags {flags - set(MEGATRON_FLAGS)}: check them in arguments.py"
    assert ("--sequence-parallel" in flags) == lay.sequence_parallel
    assert ("--recompute-granularity" in flags) == (lay.recompute == "selective")
    assert ("--fp8-hybrid" in flags) == (precision == "fp8")


def test_megatron_template_exports_cuda_device_max_connections_for_sequence_parallel():
    """Megatron-DeepSpeed raises without CUDA_DEVICE_MAX_CONNECTIONS=1 under --sequence-parallel."""
    slurm = {**frontier_slurm(**MEGATRON), "env": {}}
    sp = dataclasses.replace(frontier_trial(), layout=dataclasses.replace(STUDY_LAYOUT, sequence_parallel=True))
    assert "export CUDA_DEVICE_MAX_CONNECTIONS=1\n" in render_sbatch(sp, slurm, template="megatron", trial_dir="/t")
    assert "CUDA_DEVICE_MAX_CONNECTIONS" not in render_sbatch(frontier_trial(), slurm, template="megatron",
                                                              trial_dir="/t")
    once = render_sbatch(sp, frontier_slurm(**MEGATRON), template="megatron", trial_dir="/t")   # the table exports it already
    assert once.count("export CUDA_DEVICE_MAX_CONNECTIONS=1") == 1


def test_megatron_optimizer_is_the_deepspeed_configs():
    """Megatron builds its own Adam from its arguments: the same settings the harness gives DeepSpeed."""
    opt = dict(zip(OPTIMIZER_ARGS[::2], OPTIMIZER_ARGS[1::2]))
    assert float(opt["--lr"]) == ADAM_PARAMS["lr"] and float(opt["--weight-decay"]) == ADAM_PARAMS["weight_decay"]
    assert [float(opt["--adam-beta1"]), float(opt["--adam-beta2"])] == ADAM_PARAMS["betas"]
    assert float(opt["--clip-grad"]) == GRADIENT_CLIPPING


def test_megatron_renderers_match_golden():
    w = frontier_trial().workload
    args = pretrain_args(STUDY_LAYOUT, w, precision="fp16", extra=MEGATRON["megatron_args"])
    check_golden("megatron_args_175b_tp4_pp16_dp2_fp16.txt", "".join(f"{a}\n" for a in args))
    ds = deepspeed_config(STUDY_LAYOUT, w, precision="fp16")
    check_golden("ds_config_megatron_175b_tp4_pp16_dp2_fp16.json", json.dumps(ds, indent=2, sort_keys=True) + "\n")


def test_megatron_and_harness_share_one_deepspeed_config():
    """One renderer: Megatron's config is the harness's without the optimizer section (issue 13)."""
    w = frontier_trial().workload
    for precision in ("fp16", "bf16"):
        harness = render_ds_config(STUDY_LAYOUT, w, precision=precision)
        mgt = deepspeed_config(STUDY_LAYOUT, w, precision=precision)
        assert mgt[precision] == harness[precision] and "optimizer" not in mgt
        assert {k: v for k, v in harness.items() if k not in ("optimizer", "steps_per_print")} == \
               {k: v for k, v in mgt.items() if k != "steps_per_print"}
    fp16 = deepspeed_config(STUDY_LAYOUT, w, precision="fp16")["fp16"]
    assert fp16 == {"enabled": True, "loss_scale": 0, "initial_scale_power": 16, "loss_scale_window": 1000,
                    "hysteresis": 2, "min_loss_scale": 1}            # DeepSpeed's documented settings
    assert "bf16" not in deepspeed_config(STUDY_LAYOUT, w, precision="fp16")


# ---- the log parser --------------------------------------------------------------------------------
def test_log_parser_medians_after_warmup():
    log = (FIXTURES / "megatron_log.txt").read_text()
    r = megatron.parse_log(log, load_model("175b"), 128, recompute=True, global_batch=640)
    assert r.iterations == 9                                   # iteration 1 is warm-up
    assert r.time_ms == pytest.approx(212410.2)
    assert r.samples_per_iteration == 640
    assert r.samples_per_second == pytest.approx(640 / 212.4102, rel=1e-3)
    assert r.tflops == pytest.approx(69.13, rel=1e-3) and r.tflops_logged == pytest.approx(69.13, rel=1e-3)
    assert r.peak_memory_gb == pytest.approx(34713.6 * 1024 ** 2 / 1e9)   # MiB -> GB of 1e9 bytes, as the model's
    assert r.mismatch is None


def test_log_parser_flags_tflops_that_count_samples_never_processed():
    log = (FIXTURES / "megatron_log_mismatch.txt").read_text()
    r = megatron.parse_log(log, load_model("175b"), 128, recompute=True, global_batch=640)
    assert r.tflops == pytest.approx(69.13, rel=1e-3)           # recomputed from consumed samples
    assert r.tflops_logged == pytest.approx(276.5, rel=1e-3)
    assert r.mismatch and "4.00x" in r.mismatch


def test_log_parser_flags_a_batch_other_than_the_layouts():
    log = re.sub(r"consumed samples:\s+\d+ \| ", "", (FIXTURES / "megatron_log_mismatch.txt").read_text())
    r = megatron.parse_log(log, load_model("175b"), 128, recompute=True, global_batch=640)
    assert r.samples_per_iteration == 2560
    assert "global batch is 640" in r.mismatch


def test_log_parser_without_iterations():
    assert megatron.parse_log("loading...\nCUDA out of memory", load_model("175b"), 128, recompute=True) is None
    assert looks_oom("torch.cuda.OutOfMemoryError: HIP out of memory")
    # the one list (tuner.trial.OOM_MARKERS) serves the harness, the command and Slurm runners and Megatron logs
    for text in ("hipErrorOutOfMemory", "terminate called after throwing an instance of 'std::bad_alloc'",
                 "MemoryError", "Cannot allocate memory"):
        assert looks_oom(text), text
    assert not looks_oom("iteration 3/10 | elapsed time per iteration (ms): 12.0")


# ---- bad input ----------------------------------------------------------------------------------
def test_cluster_without_slurm_table_names_the_keys():
    with pytest.raises(UsageError, match="no \\[slurm\\] table.*partition.*valid keys"):
        make_runner("slurm", cluster=dataclasses.replace(load_cluster("local-slurm"), slurm=None))


def test_missing_sbatch_is_one_line(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(UsageError) as e:
        make_runner("slurm", cluster=load_cluster("local-slurm"))
    assert str(e.value) == "sbatch not found: --runner slurm needs Slurm's client commands on PATH"


# ---- launch scripts (tuner launch): no trial variables, no writer's path, a readable name, any cluster ----
def test_a_launch_script_is_not_a_trial_script():
    from tuner.render.sbatch import launch_job_name
    script = render_sbatch(frontier_trial(), frontier_slurm(), template="command", command=["true"],
                           launch=launch_job_name("gpt-175b", STUDY_LAYOUT), notes=["a note\nsplit"])
    assert "#SBATCH --job-name=gpt-175b-tp4-pp16-dp2\n" in script and "# a note\\nsplit\n" in script
    assert "TUNER_" not in script and TRIAL_DIR not in script and "exit_status" not in script
    assert 'cd "${SLURM_SUBMIT_DIR:-.}"' in script
    subprocess.run(["bash", "-n"], input=script, text=True, check=True)
    trial = render_sbatch(frontier_trial(), frontier_slurm(), template="command", command=["true"], trial_dir=TRIAL_DIR)
    assert "export TUNER_TRIAL=7" in trial and f"cd {TRIAL_DIR}" in trial and "exit_status" in trial


def test_launch_job_names_are_readable_and_sbatch_safe():
    from tuner.render.sbatch import generic_slurm, launch_job_name
    modern = Layout(tp=4, sequence_parallel=True, context_parallel=2, pp=4, virtual_pipeline=5, dp=16, micro_batch=1)
    assert launch_job_name("llama3-70b", modern) == "llama3-70b-tp4-cp2-pp4-vp5-dp16"
    assert launch_job_name("llama3-70b", Layout(tp=4, pp=4, dp=4, micro_batch=1)) == "llama3-70b-tp4-pp4-dp4"
    assert re.fullmatch(r"[A-Za-z0-9_.-]+", launch_job_name("my model; rm -rf /\n", STUDY_LAYOUT))
    assert validate_slurm(generic_slurm(8))["gpus_per_node"] == 8
