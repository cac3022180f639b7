"""Megatron-DeepSpeed's `pretrain_gpt.py`: its arguments and its DeepSpeed config, from a layout. Pure.

`pretrain_args` and `deepspeed_config` come from the same layout, so the micro-batch Megatron uses and
the one DeepSpeed is told about cannot disagree (the Frontier study's micro-batch-4-vs-1 bug, which
made one log print 149 TFLOPs). The log parser is not a renderer: tuner.runners.megatron.

Every flag written here was checked against microsoft/Megatron-DeepSpeed at f4157bea69f3 (2024-12-24),
megatron/arguments.py; `--deepspeed` and `--deepspeed_config` are DeepSpeed's own, added there by
`deepspeed.add_config_arguments(parser)` (arguments.py line 54). tests/test_sbatch.py keeps the list
(MEGATRON_FLAGS, with the line of each) and fails on a flag that is not in it.
"""

from __future__ import annotations

from tuner.layout import Layout
from tuner.render.dsconfig import render_ds_config
from tuner.specs import Workload

PRECISIONS = ("fp16", "bf16")   # Megatron's --fp16 / --bf16

# Megatron's optimizer: the same Adam as tuner.render.dsconfig.ADAM_PARAMS (a test checks they agree).
OPTIMIZER_ARGS = ("--lr", "1.0e-4", "--min-lr", "1.0e-5", "--lr-decay-style", "cosine", "--weight-decay", "0.1",
                  "--adam-beta1", "0.9", "--adam-beta2", "0.95", "--clip-grad", "1.0", "--init-method-std", "0.006")


def _check_precision(precision: str) -> None:
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")


def deepspeed_config(layout: Layout, workload: Workload, *, precision: str = "bf16") -> dict:
    """The DeepSpeed config (ds_config.json) Megatron-DeepSpeed is started with: tuner.render.dsconfig's,
    without an optimizer section (Megatron builds its optimizer from OPTIMIZER_ARGS and hands it to
    deepspeed.initialize) and with DeepSpeed's step line printed every iteration, like Megatron's log."""
    _check_precision(precision)
    return render_ds_config(layout, workload, precision=precision, optimizer=False, steps_per_print=1)


def shape_args(layout: Layout, workload: Workload) -> list[str]:
    """Parallel degrees and model shape: the arguments Megatron-DeepSpeed and Megatron-Core share first."""
    m = workload.model
    return ["--tensor-model-parallel-size", str(layout.tp), "--pipeline-model-parallel-size", str(layout.pp),
            "--num-layers", str(m.num_layers), "--hidden-size", str(m.hidden_size),
            "--ffn-hidden-size", str(m.ffn_hidden_size), "--num-attention-heads", str(m.num_attention_heads),
            "--seq-length", str(m.seq_length), "--max-position-embeddings", str(m.seq_length)]


def run_args(layout: Layout, workload: Workload, iterations: int, precision: str) -> list[str]:
    """Batch, length, logging, optimizer and precision: the arguments both share after the shape."""
    return ["--micro-batch-size", str(layout.micro_batch), "--global-batch-size", str(workload.global_batch),
            "--train-iters", str(iterations), "--log-interval", "1", "--eval-iters", "0", *OPTIMIZER_ARGS,
            f"--{precision}"]


def pretrain_args(layout: Layout, workload: Workload, *, deepspeed_config_path: str = "ds_config.json",
                  precision: str = "bf16", iterations: int = 10, extra: tuple[str, ...] | list[str] = ()) -> list[str]:
    """The argv (after `pretrain_gpt.py`) for one trial. `extra` (data paths, tokenizer files) is appended."""
    _check_precision(precision)
    args = [*shape_args(layout, workload), *run_args(layout, workload, iterations, precision)]
    if layout.checkpointing:
        # --checkpoint-activations: kept in Megatron-DeepSpeed for DeepSpeed's checkpointing (GPTModelPipe
        # and ParallelTransformer read args.checkpoint_activations); --recompute-* is upstream Megatron's.
        args += ["--checkpoint-activations", "--deepspeed-activation-checkpointing"]
    args += ["--deepspeed", "--deepspeed_config", deepspeed_config_path, "--zero-stage", str(layout.zero_stage)]
    if layout.pp == 1:
        args.append("--no-pipeline-parallel")   # DeepSpeed's plain engine (ZeRO-2/3 need it)
    return args + [str(a) for a in extra]
