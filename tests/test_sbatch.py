"""The pure Slurm pieces: sbatch scripts (golden files), [slurm] validation, quoting, Megatron args and logs.

Regenerate the golden files after an intended change with TUNER_UPDATE_GOLDEN=1 python -m pytest tests/test_sbatch.py
and review the diff.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest

from tuner.errors import UsageError
from tuner.layout import Layout
from tuner.runners import make_runner, megatron
from tuner.runners.sbatch import SLURM_KEYS, job_name, render_sbatch, time_limit_for, validate_slurm
from tuner.runners.slurm import map_state
from tuner.specs import ModelSpec, load_cluster, load_model, make_workload
from tuner.trial import Status, TrialSpec

HERE = Path(__file__).parent
GOLDEN = HERE / "golden"
FIXTURES = HERE / "fixtures"
TRIAL_DIR = "/lustre/orion/abc123/results/trials/gpt175b-frontier/7"
STUDY_LAYOUT = Layout(tp=4, pp=16, dp=2, micro_batch=1, zero_stage=1, activation_checkpointing=True)


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
    args = megatron.pretrain_args(STUDY_LAYOUT, w, precision="fp16")
    pairs = dict(zip(args, args[1:]))
    assert pairs["--tensor-model-parallel-size"] == "4" and pairs["--pipeline-model-parallel-size"] == "16"
    assert pairs["--micro-batch-size"] == "1" and pairs["--global-batch-size"] == "640"
    assert pairs["--num-layers"] == "96" and pairs["--hidden-size"] == "12288"
    assert pairs["--num-attention-heads"] == "96" and pairs["--seq-length"] == "2048"
    assert pairs["--max-position-embeddings"] == "2048"
    assert pairs["--deepspeed_config"] == "ds_config.json" and pairs["--zero-stage"] == "1"
    assert {"--fp16", "--checkpoint-activations", "--deepspeed-activation-checkpointing", "--deepspeed"} <= set(args)
    assert "--bf16" not in args and "--no-pipeline-parallel" not in args
    no_ckpt = megatron.pretrain_args(Layout(tp=8, pp=1, dp=16, micro_batch=2, zero_stage=2,
                                            activation_checkpointing=False), w)
    assert "--checkpoint-activations" not in no_ckpt and "--no-pipeline-parallel" in no_ckpt and "--bf16" in no_ckpt


def test_deepspeed_config_agrees_with_megatron_args():
    """The study's bug: DeepSpeed told micro-batch 4 while Megatron used 1. One source, no disagreement."""
    w = frontier_trial().workload
    for lay in (STUDY_LAYOUT, Layout(tp=2, pp=8, dp=8, micro_batch=4)):
        ds = megatron.deepspeed_config(lay, w, precision="fp16")
        args = megatron.pretrain_args(lay, w)
        mb = int(args[args.index("--micro-batch-size") + 1])
        assert ds["train_micro_batch_size_per_gpu"] == mb == lay.micro_batch
        assert ds["train_batch_size"] == mb * ds["gradient_accumulation_steps"] * lay.dp == 640
        assert ds["zero_optimization"]["stage"] == lay.zero_stage and ds["fp16"]["enabled"]


# ---- the log parser --------------------------------------------------------------------------------
def test_log_parser_medians_after_warmup():
    log = (FIXTURES / "megatron_log.txt").read_text()
    r = megatron.parse_log(log, load_model("175b"), 128, recompute=True, global_batch=640)
    assert r.iterations == 9                                   # iteration 1 is warm-up
    assert r.time_ms == pytest.approx(212410.2)
    assert r.samples_per_iteration == 640
    assert r.samples_per_second == pytest.approx(640 / 212.4102, rel=1e-3)
    assert r.tflops == pytest.approx(69.13, rel=1e-3) and r.tflops_logged == pytest.approx(69.13, rel=1e-3)
    assert r.peak_memory_gb == pytest.approx(34713.6 / 1024)
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
    assert megatron.looks_oom("torch.cuda.OutOfMemoryError: HIP out of memory")


# ---- bad input ----------------------------------------------------------------------------------
def test_cluster_without_slurm_table_names_the_keys():
    with pytest.raises(UsageError, match="no \\[slurm\\] table.*partition.*valid keys"):
        make_runner("slurm", cluster=dataclasses.replace(load_cluster("local-slurm"), slurm=None))


def test_missing_sbatch_is_one_line(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(UsageError) as e:
        make_runner("slurm", cluster=load_cluster("local-slurm"))
    assert str(e.value) == "sbatch not found: --runner slurm needs Slurm's client commands on PATH"
