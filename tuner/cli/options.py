"""Options shared by several commands: the workload (model, nodes, cluster, batch, precision) and the
layout's dimensions, generated from tuner.layout.DIMENSIONS (one option per dimension)."""

from __future__ import annotations

import functools

import click

from tuner.errors import UsageError
from tuner.layout import DIMENSIONS
from tuner.frameworks import FRAMEWORKS, NAMES as FRAMEWORKS_NAMES
from tuner.presets import MODEL_ALIASES, read_toml, shipped_presets
from tuner.specs import GRAD_REDUCES, PRECISIONS, cluster_framework


def preset_list(kind: str) -> str:
    """The shipped presets of `kind` ('models', 'clusters', 'search_spaces') as help text reads them, a
    model's short alias beside it (gpt-175b (175b)): read from the preset folders, so a new file appears."""
    alias = {v: k for k, v in MODEL_ALIASES.items()} if kind == "models" else {}
    return ", ".join(f"{n} ({alias[n]})" if n in alias else n for n in sorted(shipped_presets(kind)))


def cluster_frameworks() -> dict[str, list[str]]:
    """framework -> the shipped cluster presets that run it by default (their `framework` key)."""
    by: dict[str, list[str]] = {}
    for name, path in sorted(shipped_presets("clusters").items()):
        by.setdefault(cluster_framework(read_toml(path)), []).append(name)
    return {fw: by[fw] for fw in FRAMEWORKS_NAMES if fw in by}


FRAMEWORK_DEFAULTS = "; ".join(f"{fw} on {', '.join(names)}" for fw, names in cluster_frameworks().items())
MODELS = f"preset ({preset_list('models')}), TOML path, or Hugging Face config.json (or its folder)"       # "Model " + MODELS: the --model help
CLUSTERS = f"preset ({preset_list('clusters')}) or TOML path"

FRAMEWORK_OPTION = click.option(
    "--framework", type=click.Choice(FRAMEWORKS_NAMES), default=None,
    help="Training stack: which layouts exist, their memory and overlaps, and the launch files "
         f"(default: the cluster's: {FRAMEWORK_DEFAULTS}).")

GRAD_REDUCE_OPTION = click.option(
    "--grad-reduce", type=click.Choice(GRAD_REDUCES), default=None,
    help="The dtype gradients accumulate and reduce in (default: the framework's: fp32 on megatron-core, as "
         "Megatron-LM forces with bf16; bf16 is its --grad-reduce-in-bf16, what NVIDIA's NeMo / Megatron-Bridge "
         "recipes run: 2 bytes per parameter less).")

SEQ_LENGTH_OPTION = click.option(
    "--seq-length", type=click.IntRange(min=1, max=2**31 - 1), default=None,
    help="Training sequence length in tokens (default: the preset's; required with a Hugging Face config.json). "
         "Another length than the preset's is its own model: llama3-8b-s4096.")

WORKLOAD_OPTIONS = [
    click.option("--model", required=True, help=f"Model {MODELS}."),
    click.option("--nodes", type=click.IntRange(min=1), default=None,
                 help="Number of nodes of the cluster (required; only `search --runner local` defaults to 1)."),
    click.option("--cluster", default="frontier", show_default=True, help=f"Cluster {CLUSTERS}."),
    click.option("--global-batch", type=click.IntRange(min=1), default=None,
                 help="Global batch in samples (default: the model's recipe)."),
    SEQ_LENGTH_OPTION,
    click.option("--precision", type=click.Choice(PRECISIONS), default="bf16", show_default=True,
                 help="GEMM precision: fp8 runs the layers' GEMMs at the cluster's peak_tflops_fp8 (MFU stays "
                      "stated against the bf16 peak)."),
    FRAMEWORK_OPTION,
    GRAD_REDUCE_OPTION,
]


def workload_options(fn):
    for opt in reversed(WORKLOAD_OPTIONS):
        fn = opt(fn)
    return fn


def _by_framework(value) -> str:
    """'megatron-deepspeed 1, megatron-core 1, torchtitan 3': a per-framework default, from FRAMEWORKS."""
    return ", ".join(f"{name} {value(fw)}" for name, fw in FRAMEWORKS.items())


def predict_default(d) -> str:
    """What `predict` uses for a dimension left out (tuner.cli.plan.predict fills these in)."""
    if d.name == "zero_stage":
        return f"the framework's: {_by_framework(lambda fw: fw.zero_stages[0])}"
    if d.name == "sequence_parallel":
        always = [name for name, fw in FRAMEWORKS.items() if fw.sp_with_tp]
        moe = [name for name, fw in FRAMEWORKS.items() if fw.sp_with_moe_tp]
        return (f"on when tp > 1 for {', '.join(always)} (its TP always shards the sequence) and for an MoE "
                f"model on {', '.join(moe)} (which requires it), else off")
    if d.name == "dp" or d.default is None:
        return ""                       # required, or its help says how it follows from the others
    return str(d.default).lower() if d.type is bool else str(d.default)


def _dimension_option(d, required: bool, pins: bool):
    """A dimension's option. Its help says what happens when it is left out: with `pins` (plan, search)
    the dimension is searched over the space's values; else (predict) the default predict uses."""
    shown = predict_default(d) if not pins else "searched over the --space when omitted"
    shown = "" if not shown or required else (f" [{shown}]" if pins else f" [default: {shown}]")
    if d.type is bool:
        return click.option(f"{d.flag}/--no-{d.flag[2:]}", d.name, default=None, help=d.help + shown)
    kind = click.Choice(d.choices) if d.type is str else (
        click.IntRange(0, 3) if d.name == "zero_stage" else click.IntRange(min=1))
    unset = {} if required else {"default": None}     # click >= 8.3 takes default=None as given: no "missing"
    return click.option(d.flag, d.name, type=kind, required=required, help=d.help + shown, **unset)


def layout_options(required: tuple = (), pins: bool = False):
    """One option per layout dimension (--tp, --sequence-parallel/--no-sequence-parallel, --cp, --pp,
    --vp, --dp, --micro-batch, --zero-stage, --recompute) and --activation-checkpointing/--no-... (the
    old spelling of --recompute full/none). The command receives `layout`: a dict of the values given.
    With `pins` (plan, search) only the searched dimensions are offered: each given one is pinned."""
    def deco(fn):
        @functools.wraps(fn)
        def wrapper(*args, **kw):
            given = {d.name: kw.pop(d.name, None) for d in DIMENSIONS}
            ac = kw.pop("activation_checkpointing", None)
            if ac is not None:
                if given["recompute"] not in (None, "full" if ac else "none"):
                    raise UsageError(f"--{'' if ac else 'no-'}activation-checkpointing contradicts --recompute "
                                     f"{given['recompute']}: give only --recompute")
                given["recompute"] = "full" if ac else "none"
            return fn(*args, layout={k: v for k, v in given.items() if v is not None}, **kw)

        wrapper = click.option("--activation-checkpointing/--no-activation-checkpointing", default=None,
                               help="Old spelling of --recompute full / --recompute none.")(wrapper)
        for d in reversed(DIMENSIONS):
            if not pins or d.searched:
                wrapper = _dimension_option(d, d.name in required, pins)(wrapper)
        return wrapper
    return deco
