"""Megatron-DeepSpeed's `pretrain_gpt.py`: its arguments and its DeepSpeed config, from a layout. Pure.

`pretrain_args` and `deepspeed_config` come from the same layout, so the micro-batch Megatron uses and
the one DeepSpeed is told about cannot disagree (the Frontier study's micro-batch-4-vs-1 bug, which
made one log print 149 TFLOPs). The log parser is not a renderer: tuner.runners.megatron.

Every flag written here was checked against microsoft/Megatron-DeepSpeed at f4157bea69f3 (2024-12-24),
megatron/arguments.py, and again at deepspeedai/Megatron-DeepSpeed 4efb479d5317 (2025-07-16, the same
repository renamed); `--deepspeed` and `--deepspeed_config` are DeepSpeed's own, added there by
`deepspeed.add_config_arguments(parser)`. tests/test_sbatch.py keeps the list (MEGATRON_FLAGS, with the
line of each) and fails on a flag that is not in it.

The layout's dimensions (arguments.py and megatron/model/transformer.py at 4efb479d5317):
- sequence_parallel: `--sequence-parallel` (line 972); it needs CUDA_DEVICE_MAX_CONNECTIONS=1 (line 405
  raises otherwise: `launch_env`); on accelerators other than CUDA (ROCm reports
  cuda) its layer norm marks weights for sequence parallelism only from 4efb479d5317 (#468) on;
- recompute full: `--checkpoint-activations --deepspeed-activation-checkpointing` (DeepSpeed's
  checkpointing, which GPTModelPipe reads); selective: `--recompute-granularity selective` (line 830;
  ParallelAttention recomputes its core attention, transformer.py line 629, in the pipeline's layers too);
- precision fp8: `--transformer-impl transformer_engine --fp8-hybrid` with the recipe of tuner.render.mcore
  (lines 506-526), only where it runs: the Transformer Engine layer is built by ParallelTransformer, the
  model without DeepSpeed's pipeline (pp 1, transformer.py line 1774), and it asserts no GQA (line 1772);
- the model's rope_theta (when set and not Megatron's 10000): `--rotary-position-embeddings-theta` (line 635,
  dest rope_theta, read by language_model.py line 437);
- the cluster's flash_attention: `--use-flash-attn-v2` (line 930; FlashAttention-2, as the Frontier study ran,
  ROCm's port there). transformer.py line 528 takes it for causal self-attention; its core attention is then
  flash's, so `--recompute-granularity selective` recomputes nothing more (flash keeps no score matrix);
- the launch's data and checkpoints (`data_args`, `checkpoint_args`): `--data-path` (line 1238), `--split`
  (1246), `--tokenizer-type HFTokenizer` (1299) `--tokenizer-model` (1309), `--save` (1069), `--save-interval`
  (1071), `--load` (1077). It has no mock data (no --mock-data; pretrain_gpt.py line 314 builds its datasets
  from --data-path only): a launch with mock data is refused naming `--framework megatron-core`;
- refused (`refusal`): context_parallel > 1 (no such option; `--ds-sequence-parallel-size` is DeepSpeed
  Ulysses, another split of the sequence, never used in its place) and virtual_pipeline > 1
  (`--num-layers-per-virtual-pipeline-stage` exists, line 1164, but DeepSpeed's pipeline engine, which
  runs every pp > 1 here, has no interleaved schedule), and fp8 where the TE layer is not built.
"""

from __future__ import annotations

from tuner.errors import UsageError
from tuner.layout import Layout
from tuner.render.dsconfig import render_ds_config
from tuner.specs import Workload

PRECISIONS = ("fp16", "bf16")   # Megatron's --fp16 / --bf16

# Megatron's optimizer: the same Adam as tuner.render.dsconfig.ADAM_PARAMS (a test checks they agree).
OPTIMIZER_ARGS = ("--lr", "1.0e-4", "--min-lr", "1.0e-5", "--lr-decay-style", "cosine", "--weight-decay", "0.1",
                  "--adam-beta1", "0.9", "--adam-beta2", "0.95", "--clip-grad", "1.0", "--init-method-std", "0.006")
# FP8 through Transformer Engine: Megatron-DeepSpeed's DelayedScaling, with the recipe of tuner.render.mcore.FP8.
FP8 = ("--transformer-impl", "transformer_engine", "--fp8-hybrid", "--fp8-amax-history-len", "1024",
       "--fp8-amax-compute-algo", "max")
RECOMPUTE_FULL = ("--checkpoint-activations", "--deepspeed-activation-checkpointing")
RECOMPUTE_SELECTIVE = ("--recompute-granularity", "selective")

_NAME = "--framework megatron-deepspeed"

ROPE_DEFAULT = 10000       # Megatron-LM's --rotary-base and Megatron-DeepSpeed's --rotary-position-embeddings-theta
SPLIT = "99,1,0"           # train/valid/test shares of --data-path, as Megatron-LM's Llama 3 recipe sets them
SAVE_INTERVAL = 1000       # iterations between checkpoints (both also save at the end of training)
FLASH_ATTENTION = ("--use-flash-attn-v2",)


def _check_precision(precision: str) -> None:
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")


def refusal(layout: Layout, workload: Workload) -> str | None:
    """Why Megatron-DeepSpeed cannot run `layout` on `workload` as it is (one line naming the framework that
    can), or None: the framework's own rules (tuner.frameworks)."""
    from tuner.frameworks import get
    return get("megatron-deepspeed").refusal(layout, workload)


def check(layout: Layout, workload: Workload) -> None:
    """UsageError (exit status 2, one line) when Megatron-DeepSpeed cannot run the layout (see `refusal`)."""
    reason = refusal(layout, workload)
    if reason:
        raise UsageError(reason)


def launch_env(layout: Layout) -> dict[str, str]:
    """Variables the sbatch script exports: --sequence-parallel needs CUDA_DEVICE_MAX_CONNECTIONS=1."""
    return {"CUDA_DEVICE_MAX_CONNECTIONS": "1"} if layout.sequence_parallel else {}


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


def rotary_base(m) -> int | None:
    """The model's RoPE base (`rope_theta`, e.g. 500000 for Llama 3) when it is set and not the frameworks'
    default 10000 (Llama 2's), else None: only then is a flag written."""
    theta = getattr(m, "rope_theta", None)
    if theta is None or m.position_embedding != "rope" or theta == ROPE_DEFAULT:
        return None
    if theta != int(theta):
        raise UsageError(f"model '{m.name}': rope_theta {theta} is not an integer; Megatron's flag takes one")
    return int(theta)


def checkpoint_args(save_dir: str) -> list[str]:
    """Save every SAVE_INTERVAL iterations and at the end into `save_dir`, and resume from it."""
    return ["--save", save_dir, "--load", save_dir, "--save-interval", str(SAVE_INTERVAL)]


def data_args(*, data_path: str | None, tokenizer: str | None, mock_data: bool = False) -> list[str]:
    """The dataset (a preprocessed `_text_document` prefix) and its Hugging Face tokenizer (model id or
    directory). UsageError for mock data, which Megatron-DeepSpeed has not."""
    if mock_data or not data_path:
        raise UsageError(f"{_NAME} has no mock data (no --mock-data: pretrain_gpt.py reads --data-path only): give "
                         "--data-path PATH (a preprocessed dataset prefix) and --tokenizer NAME_OR_PATH")
    if not tokenizer:
        raise UsageError(f"{_NAME}: --data-path needs --tokenizer NAME_OR_PATH, the Hugging Face tokenizer the data "
                         "was preprocessed with")
    return ["--data-path", data_path, "--split", SPLIT, "--tokenizer-type", "HFTokenizer", "--tokenizer-model", tokenizer]


def architecture_args(m) -> list[str]:
    """Megatron-DeepSpeed's flags for the model's architecture (megatron/arguments.py at 4efb479d5317:
    --num-key-value-heads 623, --use-rotary-position-embeddings 633, --no-position-embedding 640,
    --normalization 647, --swiglu 670, --untie-embeddings-and-output-weights 680, --disable-bias-linear
    937, --rotary-position-embeddings-theta 635); a GPT-3-style model needs none."""
    args: list[str] = []
    if m.num_query_groups != m.num_attention_heads:
        args += ["--num-key-value-heads", str(m.num_query_groups)]
    if m.position_embedding == "rope":
        args += ["--use-rotary-position-embeddings", "--no-position-embedding"]
    if rotary_base(m):
        args += ["--rotary-position-embeddings-theta", str(rotary_base(m))]
    if m.normalization == "rmsnorm":
        args += ["--normalization", "rmsnorm"]
    if m.ffn_type == "swiglu":
        args.append("--swiglu")
    if not m.tie_embeddings:
        args.append("--untie-embeddings-and-output-weights")
    if not m.add_bias_linear:
        args.append("--disable-bias-linear")
    return args


def pretrain_args(layout: Layout, workload: Workload, *, deepspeed_config_path: str = "ds_config.json",
                  precision: str = "bf16", iterations: int = 10, extra: tuple[str, ...] | list[str] = ()) -> list[str]:
    """The argv (after `pretrain_gpt.py`) for one trial. `extra` (data paths, tokenizer files) is appended.
    UsageError for a layout Megatron-DeepSpeed cannot run (`refusal`)."""
    _check_precision(precision)
    check(layout, workload)
    args = [*shape_args(layout, workload), *architecture_args(workload.model)]
    if workload.cluster.flash_attention:
        args += list(FLASH_ATTENTION)     # the attention the model assumed (no score matrix kept)
    if layout.sequence_parallel:
        args.append("--sequence-parallel")
    args += run_args(layout, workload, iterations, precision)
    if workload.precision == "fp8":
        args += list(FP8)
    # full: --checkpoint-activations, kept in Megatron-DeepSpeed for DeepSpeed's checkpointing (GPTModelPipe and
    # ParallelTransformer read args.checkpoint_activations); selective: upstream Megatron's core-attention recompute.
    args += list({"full": RECOMPUTE_FULL, "selective": RECOMPUTE_SELECTIVE}.get(layout.recompute, ()))
    args += ["--deepspeed", "--deepspeed_config", deepspeed_config_path, "--zero-stage", str(layout.zero_stage)]
    if layout.pp == 1:
        args.append("--no-pipeline-parallel")   # DeepSpeed's plain engine (ZeRO-2/3 need it)
    return args + [str(a) for a in extra]
