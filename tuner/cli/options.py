"""Options shared by several commands: the workload (model, nodes, cluster, batch, precision) and the
layout's dimensions, generated from tuner.layout.DIMENSIONS (one option per dimension)."""

from __future__ import annotations

import functools

import click

from tuner.errors import UsageError
from tuner.layout import DIMENSIONS
from tuner.frameworks import FRAMEWORKS
from tuner.study_options import (CLUSTERS, FRAMEWORK, FRAMEWORK_DEFAULTS, GRAD_REDUCE, MODELS,  # noqa: F401
                                 OPTIMIZER_MOMENTS_OPTION, PINNED, SEQ_LENGTH, WORKLOAD, cluster_frameworks, dimension,
                                 preset_list)

FRAMEWORK_OPTION = FRAMEWORK.decorator()
GRAD_REDUCE_OPTION = GRAD_REDUCE.decorator()
MOMENTS_OPTION = OPTIMIZER_MOMENTS_OPTION.decorator()
SEQ_LENGTH_OPTION = SEQ_LENGTH.decorator()
WORKLOAD_OPTIONS = [o.decorator() for o in WORKLOAD]


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
    shown = predict_default(d) if not pins else PINNED
    shown = "" if not shown or required else (f" [{shown}]" if pins else f" [default: {shown}]")
    return dimension(d, d.help + shown, required).decorator()


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
