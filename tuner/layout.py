"""The parallel layout of a training run and the rules that make it valid for a workload.

Pure: no I/O. Megatron conventions: GPUs = tp * cp * pp * dp, rank order TP fastest, then CP, then DP,
then PP; sequence parallelism (sp) lives inside the TP group; virtual pipeline stages (vp) interleave
the layers of each pipeline rank; recompute is none, selective (the attention core) or full (every
layer); ZeRO stage 1 is Megatron's distributed optimizer. What a training stack can run (ZeRO-2/3 with
pipelines, interleaving, context parallelism, FSDP) is its framework's rule (tuner.frameworks), asked
for every layout through the workload's framework. Mixture-of-experts models add expert parallelism (ep)
and expert tensor parallelism (etp, default 1: whole experts, not Megatron-Core's default etp = tp): the
MoE layers regroup each stage's tp*cp*dp GPUs as etp x ep x expert-dp (why_invalid_experts). How the layers
are cut into pipeline stages is the layout's pipeline_split (tuner.pipeline_split: auto, balanced,
balanced-ends, light-last). offload_layers (0: off) is Megatron-Core's CPU activation offloading of the first N
layers (tuner.offload says where it runs; tuner.perfmodel.offload what it costs).
"""

from __future__ import annotations

from dataclasses import dataclass, field, make_dataclass, replace
from math import gcd
from typing import TYPE_CHECKING

from tuner.errors import InvalidLayout
from tuner.recompute_modes import RECOMPUTE, RECOMPUTE_MODULES, recompute_modules, recomputes_at_least  # noqa: F401
from tuner.pipeline_split import (PIPELINE_SPLITS, SPLIT_KEYS, accounting_split, even_split, stage_candidates,
                                  stage_layer_indices, stage_layers, stage_moe_layers, why_invalid_split)  # noqa: F401

if TYPE_CHECKING:
    from tuner.specs import Workload



@dataclass(frozen=True)
class Dimension:
    """One dimension of a layout, declared once: the Layout class and every list of dimensions (store
    columns, table columns, trial environment, searcher encoding, spaces) derive from DIMENSIONS."""

    name: str            # the Layout field, the store column, the JSON key
    type: type           # int or bool
    short: str           # the layout key's prefix (tp4-pp16-...)
    column: str          # the table column
    env: str             # the variable a trial command reads (bools as 1/0)
    default: object = None  # None: required
    searched: bool = True   # chosen by searchers and spaces (dp follows from tp * cp * pp * dp = GPUs)
    log2: bool = False      # searchers compare its values on a log2 scale
    choices: tuple = ()     # the allowed values of a str dimension, in the order searchers compare them
    in_key: str = "always"  # "always", or "set": the layout key names it only away from its default
    flag: str = ""          # the command-line option (predict, plan, search)
    help: str = ""
    keys: tuple = ()        # (value, how the layout key writes it) where shorter than the value

    def key_text(self, value) -> str:
        """The value as the layout key writes it (a short form where `keys` gives one)."""
        return dict(self.keys).get(value, self.text(value))

    def ordinal(self, value) -> float:
        """The value as a number searchers compare: a str dimension's index among its choices."""
        return float(self.choices.index(value)) if self.choices else float(value)

    def text(self, value) -> str:
        """The value as the key and the trial environment write it (bools 1/0)."""
        return value if self.type is str else str(int(value))


DIMENSIONS: tuple[Dimension, ...] = (
    Dimension("tp", int, "tp", "tp", "TUNER_TP", log2=True, flag="--tp",
              help="Tensor-parallel degree (GPUs per layer)."),
    Dimension("sequence_parallel", bool, "sp", "sp", "TUNER_SEQUENCE_PARALLEL", default=False, in_key="set",
              flag="--sequence-parallel", help="Megatron sequence parallelism inside the TP group (needs tp > 1)."),
    Dimension("context_parallel", int, "cp", "cp", "TUNER_CONTEXT_PARALLEL", default=1, log2=True, in_key="set",
              flag="--cp", help="Context-parallel degree (splits the sequence; ring K/V exchange)."),
    Dimension("pp", int, "pp", "pp", "TUNER_PP", log2=True, flag="--pp", help="Pipeline-parallel degree (stages)."),
    Dimension("virtual_pipeline", int, "vp", "vp", "TUNER_VIRTUAL_PIPELINE", default=1, log2=True, in_key="set",
              flag="--vp", help="Virtual stages per pipeline rank (interleaved 1F1B)."),
    Dimension("pipeline_split", str, "ps", "split", "TUNER_PIPELINE_SPLIT", default="auto", choices=PIPELINE_SPLITS,
              in_key="set", flag="--pipeline-split", keys=tuple(SPLIT_KEYS.items()),
              help="How the layers are cut into the pp*vp stages: auto (equal, or Megatron-Core's embedding- and "
              "loss-aware split), balanced (DeepSpeed's: the first stages one layer more), balanced-ends (the "
              "embedding and the loss count as a layer each: torchtitan's), light-last (the loss stage counts "
              "three layers: NVIDIA's DeepSeek-V3 recipes)."),
    Dimension("dp", int, "dp", "dp", "TUNER_DP", searched=False, log2=True, flag="--dp",
              help="Data-parallel degree (default: GPUs / (tp * cp * pp))."),
    Dimension("expert_parallel", int, "ep", "ep", "TUNER_EXPERT_PARALLEL", default=1, log2=True, in_key="set",
              flag="--ep", help="Expert-parallel degree: GPUs that share one MoE layer's experts (each holds "
              "num_experts/ep; tokens reach them by all-to-all). MoE models only."),
    Dimension("expert_tensor_parallel", int, "etp", "etp", "TUNER_EXPERT_TENSOR_PARALLEL", default=1, log2=True,
              in_key="set", flag="--etp", help="Expert tensor-parallel degree: GPUs that split each expert's "
              "weights (1: whole experts, as NVIDIA's MoE recipes run; not Megatron-Core's own default, etp = tp, "
              "so launch always writes it). MoE models only."),
    Dimension("micro_batch", int, "mb", "mb", "TUNER_MICRO_BATCH", log2=True, flag="--micro-batch",
              help="Samples per micro-batch per replica."),
    Dimension("zero_stage", int, "z", "zero", "TUNER_ZERO_STAGE", default=1, flag="--zero-stage",
              help="ZeRO stage 0-3 (1 = Megatron's distributed optimizer, 3 = FSDP; what each --framework runs: "
              "docs/frameworks.md)."),
    Dimension("recompute", str, "rc", "recompute", "TUNER_RECOMPUTE", default="full", choices=RECOMPUTE,
              flag="--recompute", help="Activation recompute: none, selective (the attention core), full, or "
              "Megatron-Core's module sets moe_act, norm_act (layernorm + moe_act), mlp (the dense layers' MLP), "
              "mla_up (mla_up_proj), mla_up_mlp (mla_up_proj + mlp), mla_up_mlp_moe (and moe: the whole MoE layer), "
              "norm_moe (layernorm + moe)."),
    Dimension("offload_layers", int, "off", "offload", "TUNER_OFFLOAD_LAYERS", default=0, in_key="set",
              flag="--offload-layers", help="Megatron-Core's CPU activation offloading: the first N layers' activations "
              "copied to the host in the forward and back in the backward (--cpu-offloading-num-layers N; 0: off). "
              "Megatron-Core only, with pp 1, recompute none and N below the layer count."),
)
BY_NAME = {d.name: d for d in DIMENSIONS}
LAYOUT_FIELDS = tuple(d.name for d in DIMENSIONS)
SEARCHED = tuple(d.name for d in DIMENSIONS if d.searched)     # what a searcher or a space chooses


class _LayoutMethods:
    @property
    def gpus(self) -> int:
        return self.tp * self.context_parallel * self.pp * self.dp

    @property
    def checkpointing(self) -> bool:
        """Whether every layer is recomputed (DeepSpeed's activation checkpointing)."""
        return self.recompute == "full"

    def key(self) -> str:
        """A stable, readable key: tp4-pp16-dp2-mb1-z1-rcfull (sp1, cp2, vp4 appear when set)."""
        return "-".join(f"{d.short}{d.key_text(getattr(self, d.name))}" for d in DIMENSIONS
                        if d.in_key == "always" or getattr(self, d.name) != d.default)

    def as_dict(self) -> dict:
        return {d.name: getattr(self, d.name) for d in DIMENSIONS}

    def flags(self) -> str:
        """The layout as the command-line options that pin it in `tuner search` and `plan` (--tp 4
        --sequence-parallel --cp 1 ...): every searched dimension (dp follows from the GPUs)."""
        def one(d: Dimension) -> str:
            v = getattr(self, d.name)
            return (d.flag if v else f"--no-{d.flag[2:]}") if d.type is bool else f"{d.flag} {v}"
        return " ".join(one(d) for d in DIMENSIONS if d.searched)

    def env(self) -> dict[str, str]:
        """The layout as a trial command's environment (TUNER_TP=4, ..., bools as 1/0, TUNER_RECOMPUTE=
        full), TUNER_LAYOUT_KEY; TUNER_ACTIVATION_CHECKPOINTING (1 when recompute is full) stays for
        older scripts."""
        env = {d.env: d.text(getattr(self, d.name)) for d in DIMENSIONS}
        env["TUNER_ACTIVATION_CHECKPOINTING"] = str(int(self.checkpointing))
        env["TUNER_LAYOUT_KEY"] = self.key()
        return env

    @classmethod
    def from_dict(cls, d: dict) -> "Layout":
        """A layout from its JSON form. Dimensions with a default may be absent; a layout written before
        recompute had three modes (`activation_checkpointing` true/false) reads as full/none."""
        d = dict(d)
        if "recompute" not in d and "activation_checkpointing" in d:
            ac = d.pop("activation_checkpointing")
            d["recompute"] = ("full" if ac else "none") if ac in (0, 1) else ac
        unknown = sorted(set(d) - set(LAYOUT_FIELDS))
        if unknown:
            raise InvalidLayout(f"unknown layout key(s) {', '.join(map(str, unknown))}; a layout has "
                                f"{', '.join(LAYOUT_FIELDS)}")
        missing = [dim.name for dim in DIMENSIONS if dim.default is None and dim.name not in d]
        if missing:
            raise InvalidLayout(f"layout is missing {', '.join(missing)}; a layout has {', '.join(LAYOUT_FIELDS)}")
        return cls(**{dim.name: _value(dim, d[dim.name]) for dim in DIMENSIONS if dim.name in d})


def _value(dim: Dimension, v):
    """One dimension's value from JSON/TOML, or InvalidLayout naming what it must be."""
    if dim.type is str:
        if v not in dim.choices:
            raise InvalidLayout(f"layout value {dim.name} = {v!r} must be one of {', '.join(dim.choices)}")
        return v
    whole = isinstance(v, (int, float)) and not isinstance(v, str) and float(v).is_integer()
    if not whole or (dim.type is bool and v not in (0, 1)):
        want = "true/false (or 1/0)" if dim.type is bool else "a whole number"
        raise InvalidLayout(f"layout value {dim.name} = {v!r} must be {want}")
    return dim.type(int(v))


#: A frozen, ordered layout (tp, sequence_parallel=False, context_parallel=1, pp, virtual_pipeline=1,
#: dp, expert_parallel=1, expert_tensor_parallel=1, micro_batch, zero_stage=1, recompute="full", offload_layers=0), its
#: fields made from DIMENSIONS.
Layout = make_dataclass(
    "Layout", [(d.name, d.type) if d.default is None else (d.name, d.type, field(default=d.default))
               for d in DIMENSIONS],
    bases=(_LayoutMethods,), frozen=True, kw_only=True, order=True)
Layout.__module__ = __name__          # pickles (Ray) find it here


def layout_from(*parts: dict) -> Layout:
    """Layout(**parts[0], **parts[1], ...) for dicts that hold every field once, in field order from the first to
    the last: the same object (its fields set in field order) without the frozen dataclass's __init__, for the
    ~150,000 layouts and ~150,000 refusal probes plan's enumeration makes."""
    lay = _new_layout(Layout)
    fields = lay.__dict__
    for part in parts:
        fields.update(part)
    return lay


_new_layout = object.__new__


def flat_layout(layout: dict) -> dict:
    """A layout's fields (as_dict) under their table column names (tp, sp, cp, pp, vp, dp, mb, ...)."""
    return {d.column: layout[d.name] for d in DIMENSIONS}


def micro_batches_per_pipeline(layout: Layout, global_batch: int) -> int:
    """m = global batch / (micro batch * dp): the gradient-accumulation steps of one replica."""
    return global_batch // (layout.micro_batch * layout.dp)


def why_invalid(layout: Layout, workload: "Workload") -> str | None:
    """The first rule `layout` breaks for `workload`, as a sentence, or None when it is valid."""
    return (why_invalid_values(layout, workload) or why_invalid_cut(layout, workload.model)
            or why_invalid_schedule(layout, workload) or why_invalid_framework(layout, workload))


def why_invalid_framework(layout: Layout, workload: "Workload") -> str | None:
    """What the workload's framework cannot run (tuner.frameworks)."""
    from tuner.frameworks import of
    return of(workload).refusal(layout, workload)


def why_invalid_values(layout: Layout, workload: "Workload") -> str | None:
    """Rules on the values alone: degrees >= 1, known ZeRO stage and recompute mode, the GPU count."""
    gpus = workload.gpus
    for name in ("tp", "context_parallel", "pp", "virtual_pipeline", "dp", "expert_parallel", "expert_tensor_parallel",
                 "micro_batch"):
        if getattr(layout, name) < 1:
            return f"{name} must be >= 1 (got {getattr(layout, name)})"
    if layout.offload_layers < 0:
        return f"offload_layers must be >= 0 (got {layout.offload_layers})"
    if layout.zero_stage not in (0, 1, 2, 3):
        return f"zero_stage must be 0, 1, 2 or 3 (got {layout.zero_stage})"
    if layout.recompute not in RECOMPUTE:
        return f"recompute must be one of {', '.join(RECOMPUTE)} (got {layout.recompute!r})"
    if layout.gpus != gpus:
        cp = f"*{layout.context_parallel}" if layout.context_parallel > 1 else ""
        return (f"tp*{'cp*' if cp else ''}pp*dp = {layout.tp}{cp}*{layout.pp}*{layout.dp} = {layout.gpus} but the "
                f"workload has {gpus} GPUs ({workload.nodes} nodes x {workload.cluster.gpus_per_node})")
    return None


def why_invalid_experts(layout: Layout, m) -> str | None:
    """Rules of expert parallelism (ep) and expert tensor parallelism (etp) for model `m`. Megatron-Core
    (parallel_state.initialize_model_parallel, "MoE parallel folding") and torchtitan (ParallelDims) regroup
    the tp*cp*dp GPUs of each pipeline stage for the MoE layers as etp x ep x expert-dp, etp fastest in the
    rank order: so ep*etp must divide tp*cp*dp (with etp = tp: ep divides cp*dp), and the experts split
    evenly over ep (whole experts) and etp (each expert's FFN width)."""
    ep, etp = layout.expert_parallel, layout.expert_tensor_parallel
    if not m.is_moe:
        if ep > 1 or etp > 1:
            which = "expert_parallel" if ep > 1 else "expert_tensor_parallel"
            return (f"{which} {ep if ep > 1 else etp} needs a mixture-of-experts model: '{m.name}' is dense "
                    "(num_experts 0); use ep 1 and etp 1")
        return None
    if m.num_experts % ep:
        return f"num_experts ({m.num_experts}) is not divisible by expert_parallel={ep} (each rank holds whole experts)"
    if m.moe_ffn_hidden_size % etp:
        return f"moe_ffn_hidden_size ({m.moe_ffn_hidden_size}) is not divisible by expert_tensor_parallel={etp}"
    dense = layout.tp * layout.context_parallel * layout.dp
    if dense % (ep * etp):
        return (f"ep*etp = {ep}*{etp} does not divide tp*cp*dp = {dense}: the MoE layers regroup each pipeline "
                "stage's GPUs as etp x ep x expert-dp (Megatron-Core's MoE parallel folding)")
    return None


def expert_data_parallel(layout: Layout) -> int:
    """Replicas of each expert (expert-dp): tp*cp*dp / (ep*etp)."""
    return layout.tp * layout.context_parallel * layout.dp // (layout.expert_parallel * layout.expert_tensor_parallel)


def why_invalid_cut(layout: Layout, m) -> str | None:
    """Rules the model's shape sets on how tp, sp, cp, pp, vp, ep and etp cut it (they read no other
    dimension but dp, which the GPU count fixes)."""
    reason = why_invalid_experts(layout, m)
    if reason:
        return reason
    tp, cp = layout.tp, layout.context_parallel
    if m.num_attention_heads % tp:
        return f"attention heads ({m.num_attention_heads}) are not divisible by tp={tp}"
    if m.num_query_groups % tp:
        return (f"key/value heads (num_query_groups {m.num_query_groups}) are not divisible by tp={tp} "
                "(each tensor-parallel rank holds whole K/V heads)")
    if m.hidden_size % tp:
        return f"hidden size ({m.hidden_size}) is not divisible by tp={tp}"
    if m.ffn_hidden_size % tp:
        return f"ffn hidden size ({m.ffn_hidden_size}) is not divisible by tp={tp}"
    if layout.sequence_parallel and tp == 1:
        return "sequence_parallel needs tp > 1 (it splits the sequence across the tensor-parallel group)"
    if layout.sequence_parallel and m.seq_length % (tp * cp):
        return (f"sequence length ({m.seq_length}) is not divisible by tp*cp = {tp * cp} "
                "(sequence parallelism gives each tensor-parallel rank an equal share)")
    if cp > 1 and m.seq_length % (2 * cp):
        return (f"sequence length ({m.seq_length}) is not divisible by 2*cp = {2 * cp} (context parallelism "
                "cuts the sequence into 2*cp chunks to balance causal attention)")
    if layout.virtual_pipeline > 1 and layout.pp == 1:
        return "virtual_pipeline > 1 needs pp > 1 (it interleaves the stages of a pipeline)"
    return why_invalid_split(m.num_layers, layout.pp, layout.virtual_pipeline, layout.pipeline_split)


def uneven_split(layout: Layout, num_layers: int) -> bool:
    """Whether the stages use Megatron-Core's embedding- and loss-aware split (pipeline_split auto, pp*vp
    divides layers + 2, not layers: --account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split)."""
    return accounting_split(layout, num_layers)


def why_invalid_schedule(layout: Layout, workload: "Workload") -> str | None:
    """Rules of the batch and the schedule: micro-batches, the interleaved schedule's multiple."""
    if workload.global_batch % (layout.micro_batch * layout.dp):
        return (f"global batch ({workload.global_batch}) is not divisible by micro_batch*dp = "
                f"{layout.micro_batch}*{layout.dp}")
    m = micro_batches_per_pipeline(layout, workload.global_batch)
    if layout.virtual_pipeline > 1 and m % layout.pp:
        return (f"the interleaved schedule needs the micro-batches per pipeline ({m}) to be a multiple of "
                f"pp={layout.pp} (Megatron's rule with virtual_pipeline > 1)")
    return None


def batch_hint(workload: "Workload", has_layouts) -> str:
    """The nearest global batch that `has_layouts(workload with it)` accepts, as the flag that asks for it ('' when
    neither neighbour does): dp must divide the global batch, so the GPU count's odd factor (an NVL72 rack's 9 of
    72 GPUs, where tp, cp and pp are powers of two) must divide it too; the step keeps the batch's powers of two."""
    odd, gb = workload.gpus, workload.global_batch
    while odd % 2 == 0:
        odd //= 2
    step = odd * gcd(gb, workload.gpus // odd)
    for c in sorted({max(step, gb // step * step), (gb // step + 1) * step}, key=lambda c: (abs(c - gb), c)):
        if c != gb and has_layouts(replace(workload, global_batch=c)):
            return f"; pass --global-batch {c}" + (f" (a multiple of {step}, so dp can divide it)" if step > 1 else "")
    return ""


def validate(layout: Layout, workload: "Workload") -> Layout:
    """Return `layout` or raise InvalidLayout naming the rule it breaks."""
    reason = why_invalid(layout, workload)
    if reason:
        raise InvalidLayout(f"invalid layout {layout.key()}: {reason}")
    return layout
