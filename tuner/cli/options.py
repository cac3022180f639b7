"""Options shared by several commands: the workload (model, nodes, cluster, batch, precision) and the
layout's dimensions, generated from tuner.layout.DIMENSIONS (one option per dimension)."""

from __future__ import annotations

import functools

import click

from tuner.errors import UsageError
from tuner.layout import DIMENSIONS
from tuner.frameworks import NAMES as FRAMEWORKS
from tuner.specs import PRECISIONS

FRAMEWORK_OPTION = click.option(
    "--framework", type=click.Choice(FRAMEWORKS), default=None,
    help="Training stack: which layouts exist, their memory and overlaps, and the launch files "
         "(default: the cluster's; frontier megatron-deepspeed, h100/h200 megatron-core).")

WORKLOAD_OPTIONS = [
    click.option("--model", required=True,
                 help="Model preset (gpt-1.4b, 22b, 175b, 1t, llama3-8b, llama3-70b, llama3-405b, tiny, small) or TOML path."),
    click.option("--nodes", type=click.IntRange(min=1), default=None,
                 help="Number of nodes of the cluster (required; only `search --runner local` defaults to 1)."),
    click.option("--cluster", default="frontier", show_default=True, help="Cluster preset or TOML path."),
    click.option("--global-batch", type=click.IntRange(min=1), default=None,
                 help="Global batch in samples (default: the model's recipe)."),
    click.option("--precision", type=click.Choice(PRECISIONS), default="bf16", show_default=True,
                 help="GEMM precision: fp8 runs the layers' GEMMs at the cluster's peak_tflops_fp8 (MFU stays "
                      "stated against the bf16 peak)."),
    FRAMEWORK_OPTION,
]


def workload_options(fn):
    for opt in reversed(WORKLOAD_OPTIONS):
        fn = opt(fn)
    return fn


def _dimension_option(d, required: bool):
    if d.type is bool:
        return click.option(f"{d.flag}/--no-{d.flag[2:]}", d.name, default=None, help=d.help)
    kind = click.Choice(d.choices) if d.type is str else (
        click.IntRange(0, 3) if d.name == "zero_stage" else click.IntRange(min=1))
    shown = f" [default: {d.default if d.type is not bool else str(d.default).lower()}]" if d.default is not None else ""
    return click.option(d.flag, d.name, type=kind, required=required, default=None, help=d.help + shown)


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
                wrapper = _dimension_option(d, d.name in required)(wrapper)
        return wrapper
    return deco
