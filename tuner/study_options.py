"""A study's options, declared once: names, types, defaults, help and checks of the workload, the study's
settings and the layout pins. `tuner search` (tuner.cli.study) turns them into its click options and
tuner.config checks a study.toml's keys and tuner.create_study's keyword arguments with the very same
click parameters, so a flag, a key and a keyword argument are refused with the same words. This module
stands below both: it imports nothing from tuner.cli."""

from __future__ import annotations

from dataclasses import dataclass, field

import click

from tuner.frameworks import NAMES as FRAMEWORKS_NAMES
from tuner.layout import DIMENSIONS
from tuner.presets import MODEL_ALIASES, read_toml, shipped_presets
from tuner.runners import DEFAULT_TRIAL_TIMEOUT_S
from tuner.runners.registry import runner_names
from tuner.search import SEARCHERS, STUDY_DEFAULTS
from tuner.specs import GRAD_REDUCES, OPTIMIZER_MOMENTS, PRECISIONS, cluster_framework


@dataclass(frozen=True)
class Opt:
    """One option as click declares it: its flags (and parameter name) and its attributes."""
    decls: tuple[str, ...]
    attrs: dict = field(default_factory=dict)

    def param(self) -> click.Option:
        return click.Option(list(self.decls), **self.attrs)

    @property
    def name(self) -> str:
        return self.param().name

    def decorator(self):
        return click.option(*self.decls, **self.attrs)


def _opt(*decls: str, **attrs) -> Opt:
    return Opt(decls, attrs)


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

FRAMEWORK = _opt(
    "--framework", type=click.Choice(FRAMEWORKS_NAMES), default=None,
    help="Training stack: which layouts exist, their memory and overlaps, and the launch files "
         f"(default: the cluster's: {FRAMEWORK_DEFAULTS}).")

GRAD_REDUCE = _opt(
    "--grad-reduce", type=click.Choice(GRAD_REDUCES), default=None,
    help="The dtype gradients accumulate and reduce in (default: the framework's: fp32 on megatron-core, as "
         "Megatron-LM forces with bf16; bf16 is its --grad-reduce-in-bf16, what NVIDIA's NeMo / Megatron-Bridge "
         "recipes run: 2 bytes per parameter less).")

OPTIMIZER_MOMENTS_OPTION = _opt(
    "--optimizer-moments", type=click.Choice(OPTIMIZER_MOMENTS), default=None,
    help="The dtype of Adam's two moments (default fp32); bf16 is Megatron-Core's precision-aware optimizer "
         "(--use-precision-aware-optimizer --exp-avg-dtype bf16 --exp-avg-sq-dtype bf16, with the distributed "
         "optimizer only), as NVIDIA's DeepSeek-V3 recipes run: 4 bytes per parameter less, sharded.")

SEQ_LENGTH = _opt(
    "--seq-length", type=click.IntRange(min=1, max=2**31 - 1), default=None,
    help="Training sequence length in tokens (default: the preset's; required with a Hugging Face config.json). "
         "Another length than the preset's is its own model: llama3-8b-s4096.")

class NodeCounts(click.ParamType):
    """`tuner search --nodes`: one count (an int) or several (a sorted tuple: 32,64 or 16:64, doubling)."""
    name = "N|N,N,..|FROM:TO"

    def convert(self, value, param, ctx):
        from tuner.errors import UsageError
        from tuner.scaling import parse_nodes
        if isinstance(value, tuple) or (isinstance(value, int) and value >= 1):
            return value
        try:
            counts = parse_nodes(str(value))
        except UsageError:
            self.fail(f"{value!r}: give one count (128), several (32,64) or a range FROM:TO doubling from FROM "
                      "(16:64), each >= 1", param, ctx)
        return counts[0] if len(counts) == 1 else counts


class OneNodeCount(click.IntRange):
    """--nodes of a command that answers one count (plan, predict, best, launch): several or a range, the form
    `search` and `scale` take, is refused naming them (click's IntRange said "'2,4' is not a valid integer range")."""
    name = "integer"

    def __init__(self):
        super().__init__(min=1)

    def convert(self, value, param, ctx):
        if isinstance(value, str) and ("," in value or ":" in value):
            self.fail(f"{value!r}: this command answers one node count (e.g. 8); for several (2,4 or 2:8) use "
                      "`tuner scale --nodes` or `tuner search --nodes`", param, ctx)
        return super().convert(value, param, ctx)


NODES = _opt("--nodes", type=OneNodeCount(), default=None,
             help="Number of nodes of the cluster (required; only `search --runner local` defaults to 1).")
SEARCH_NODES = _opt(
    "--nodes", type=NodeCounts(), default=None,
    help="Number of nodes of the cluster (required; only `search --runner local` defaults to 1). Several (32,64 "
         "or 16:64, doubling): one linked study per count, --budget trials each, run in turn; the guided searcher "
         "at each count learns from the others' measured trials; `tuner resume NAME` continues them all "
         "(docs/commands/search.md).")

WORKLOAD = [
    _opt("--model", required=True, help=f"Model {MODELS}."),
    NODES,
    _opt("--cluster", default="frontier", show_default=True, help=f"Cluster {CLUSTERS}."),
    _opt("--global-batch", type=click.IntRange(min=1), default=None,
         help="Global batch in samples (default: the model's recipe)."),
    SEQ_LENGTH,
    _opt("--precision", type=click.Choice(PRECISIONS), default="bf16", show_default=True,
         help="GEMM precision: fp8 runs the layers' GEMMs at the cluster's peak_tflops_fp8 (MFU stays "
              "stated against the bf16 peak)."),
    FRAMEWORK,
    GRAD_REDUCE,
    OPTIMIZER_MOMENTS_OPTION,
]

#: The study's own settings, in the order `tuner search --help` lists them.
SETTINGS = [
    _opt("--space", default="default", show_default=True, help="Search space name or TOML path."),
    _opt("--runner", type=click.Choice(runner_names()), default="sim", show_default=True,
         help="What runs a trial: the simulator (the model's prediction), your --command, DeepSpeed on "
         "this machine, or Slurm jobs."),
    _opt("--searcher", type=click.Choice(SEARCHERS), default=SEARCHERS[0], show_default=True,
         help="What proposes the next layout (guided: the model corrected by every measurement)."),
    _opt("--budget", type=click.IntRange(min=1), default=50, show_default=True,
         help="Trials to run (pruned layouts cost nothing)."),
    _opt("--parallel", type=click.IntRange(min=1), default=1, show_default=True, help="Trials in flight."),
    _opt("--study", default=None, help="Study name (default: a readable generated one)."),
    _opt("--seed", type=int, default=0, show_default=True, help="Random seed of the searcher and the simulator's noise."),
    _opt("--time-limit", type=click.FloatRange(min=0, min_open=True), default=None, help="Seconds; no new trials after it."),
    _opt("--no-prune", is_flag=True, help="Launch layouts the memory model says cannot fit."),
    _opt("--noise", type=click.FloatRange(min=0), default=0.0, show_default=True, help="sim: relative noise."),
    _opt("--sim-delay", type=click.FloatRange(min=0), default=0.0, show_default=True, help="sim: seconds per trial."),
    _opt("--command", "command", default=None, help="command runner: the training command per trial."),
    _opt("--gpus", type=click.IntRange(min=1), default=None, help="local runner: devices per trial."),
    _opt("--trial-timeout", type=click.FloatRange(min=0, min_open=True), default=None,
         help=f"Seconds a real trial may run before it is killed as timeout (default for the command, local and "
              f"slurm runners: {DEFAULT_TRIAL_TIMEOUT_S:g}, so a trial that cannot start fails in bounded time; "
              "slurm: from the job's start)."),
    _opt("--template", type=click.Choice(["harness", "megatron"]), default=None, help="slurm: launch template."),
    _opt("--executor", type=click.Choice(["thread", "ray"]), default="thread", show_default=True,
         help="Where trials run: threads of this process, or a Ray worker pool."),
    _opt("--ray-address", default=None, help="Ray cluster address for --executor ray (default: start a local one)."),
    _opt("--results-dir", default="results", show_default=True, help="Where trial directories go."),
    _opt("--warm-start", is_flag=True,
         help="guided: correct the model with every stored trial of this model and cluster (any node count)."),
    _opt("--stop-threshold", type=click.FloatRange(0, 1, min_open=True, max_open=True),
         default=STUDY_DEFAULTS["stop_threshold"], show_default=True,
         help=f"guided: stop once {100 * (1 - STUDY_DEFAULTS['stop_probability']):g} % confident that no layout "
              "trains more than this fraction faster than the recommended one."),
    _opt("--no-stop", is_flag=True, help="guided: never stop before the budget."),
    _opt("--keep-going", is_flag=True,
         help="Run on even when trials fail the same way (default: stop after 3 in a row with no success)."),
    _opt("--early-stop", type=click.FloatRange(0, 1, min_open=True, max_open=True), default=None,
         help="Stop a real trial whose throughput after warm-up is below this fraction of the best so far."),
]


def dimension_type(d) -> click.ParamType | None:
    """The click type of layout dimension `d`'s value (None for a flag: an on/off pair)."""
    if d.type is bool:
        return None
    return click.Choice(d.choices) if d.type is str else (
        click.IntRange(0, 3) if d.name == "zero_stage" else click.IntRange(min=0 if d.default == 0 else 1))


def dimension(d, help: str, required: bool = False) -> Opt:
    """Layout dimension `d` as an option: --tp, --recompute, --sequence-parallel/--no-sequence-parallel, ..."""
    if d.type is bool:
        return _opt(f"{d.flag}/--no-{d.flag[2:]}", d.name, default=None, help=help)
    unset = {} if required else {"default": None}     # click >= 8.3 takes default=None as given: no "missing"
    return _opt(d.flag, d.name, type=dimension_type(d), required=required, help=help, **unset)


PINNED = "searched over the --space when omitted"     # a pin's help: what leaving it out does


def pins() -> list[Opt]:
    """One option per searched layout dimension: each given one is pinned (tuner search, tuner plan)."""
    return [dimension(d, f"{d.help} [{PINNED}]") for d in DIMENSIONS if d.searched]


def search_workload() -> list[Opt]:
    """The workload's options as `tuner search` takes them: --nodes may name several counts (tuner.study_group)."""
    return [SEARCH_NODES if o is NODES else o for o in WORKLOAD]


def params() -> dict[str, click.Parameter]:
    """Every setting of a study (workload, settings, layout pins) as its click parameter, by name."""
    return {p.name: p for p in (o.param() for o in [*search_workload(), *SETTINGS, *pins()])}
