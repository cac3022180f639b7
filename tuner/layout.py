"""The parallel layout of a training run and the rules that make it valid for a workload.

Pure: no I/O. Megatron-DeepSpeed conventions: GPUs = tp * pp * dp, rank order TP fastest, then DP,
then PP; DeepSpeed's pipeline engine refuses ZeRO-2/3 with pp > 1.
"""

from __future__ import annotations

from dataclasses import dataclass, field, make_dataclass
from typing import TYPE_CHECKING

from tuner.errors import InvalidLayout

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
    searched: bool = True   # chosen by searchers and spaces (dp follows from tp * pp * dp = GPUs)
    log2: bool = False      # searchers compare its values on a log2 scale


DIMENSIONS: tuple[Dimension, ...] = (
    Dimension("tp", int, "tp", "tp", "TUNER_TP", log2=True),
    Dimension("pp", int, "pp", "pp", "TUNER_PP", log2=True),
    Dimension("dp", int, "dp", "dp", "TUNER_DP", searched=False, log2=True),
    Dimension("micro_batch", int, "mb", "mb", "TUNER_MICRO_BATCH", log2=True),
    Dimension("zero_stage", int, "z", "zero", "TUNER_ZERO_STAGE", default=1),
    Dimension("activation_checkpointing", bool, "ac", "ckpt", "TUNER_ACTIVATION_CHECKPOINTING", default=True),
)
LAYOUT_FIELDS = tuple(d.name for d in DIMENSIONS)
SEARCHED = tuple(d.name for d in DIMENSIONS if d.searched)     # what a searcher or a space chooses


class _LayoutMethods:
    @property
    def gpus(self) -> int:
        return self.tp * self.pp * self.dp

    def key(self) -> str:
        """A stable, readable key: tp4-pp16-dp2-mb1-z1-ac1."""
        return "-".join(f"{d.short}{int(getattr(self, d.name))}" for d in DIMENSIONS)

    def as_dict(self) -> dict:
        return {d.name: getattr(self, d.name) for d in DIMENSIONS}

    def env(self) -> dict[str, str]:
        """The layout as a trial command's environment (TUNER_TP=4, ..., bools as 1/0)."""
        return {d.env: str(int(getattr(self, d.name))) for d in DIMENSIONS}

    @classmethod
    def from_dict(cls, d: dict) -> "Layout":
        missing = [f for f in LAYOUT_FIELDS if f not in d]
        if missing:
            raise InvalidLayout(f"layout is missing {', '.join(missing)}; a layout has {', '.join(LAYOUT_FIELDS)}")
        kw = {}
        for dim in DIMENSIONS:
            v = d[dim.name]
            whole = isinstance(v, (int, float)) and float(v).is_integer()
            if not whole or (dim.type is bool and v not in (0, 1)):
                want = "true/false (or 1/0)" if dim.type is bool else "a whole number"
                raise InvalidLayout(f"layout value {dim.name} = {v!r} must be {want}")
            kw[dim.name] = dim.type(int(v))
        return cls(**kw)


#: A frozen, ordered layout (tp, pp, dp, micro_batch, zero_stage=1, activation_checkpointing=True), its
#: fields made from DIMENSIONS.
Layout = make_dataclass(
    "Layout", [(d.name, d.type) if d.default is None else (d.name, d.type, field(default=d.default))
               for d in DIMENSIONS],
    bases=(_LayoutMethods,), frozen=True, kw_only=True, order=True)
Layout.__module__ = __name__          # pickles (Ray) find it here


def micro_batches_per_pipeline(layout: Layout, global_batch: int) -> int:
    """m = global batch / (micro batch * dp): the gradient-accumulation steps of one replica."""
    return global_batch // (layout.micro_batch * layout.dp)


def why_invalid(layout: Layout, workload: "Workload") -> str | None:
    """The first rule `layout` breaks for `workload`, as a sentence, or None when it is valid."""
    m, gpus = workload.model, workload.gpus
    for name in ("tp", "pp", "dp", "micro_batch"):
        if getattr(layout, name) < 1:
            return f"{name} must be >= 1 (got {getattr(layout, name)})"
    if layout.zero_stage not in (0, 1, 2, 3):
        return f"zero_stage must be 0, 1, 2 or 3 (got {layout.zero_stage})"
    if layout.gpus != gpus:
        return (f"tp*pp*dp = {layout.tp}*{layout.pp}*{layout.dp} = {layout.gpus} but the workload has "
                f"{gpus} GPUs ({workload.nodes} nodes x {workload.cluster.gpus_per_node})")
    if m.num_attention_heads % layout.tp:
        return f"attention heads ({m.num_attention_heads}) are not divisible by tp={layout.tp}"
    if m.num_query_groups % layout.tp:
        return (f"key/value heads (num_query_groups {m.num_query_groups}) are not divisible by tp={layout.tp} "
                "(each tensor-parallel rank holds whole K/V heads)")
    if m.hidden_size % layout.tp:
        return f"hidden size ({m.hidden_size}) is not divisible by tp={layout.tp}"
    if m.ffn_hidden_size % layout.tp:
        return f"ffn hidden size ({m.ffn_hidden_size}) is not divisible by tp={layout.tp}"
    if m.num_layers % layout.pp:
        return f"layers ({m.num_layers}) are not divisible by pp={layout.pp} (stages must hold equal layers)"
    if workload.global_batch % (layout.micro_batch * layout.dp):
        return (f"global batch ({workload.global_batch}) is not divisible by micro_batch*dp = "
                f"{layout.micro_batch}*{layout.dp}")
    if layout.pp > 1 and layout.zero_stage >= 2:
        return (f"ZeRO-{layout.zero_stage} with pp={layout.pp} is refused by DeepSpeed's pipeline engine "
                "(use zero_stage 0 or 1 with pipeline parallelism)")
    return None


def validate(layout: Layout, workload: "Workload") -> Layout:
    """Return `layout` or raise InvalidLayout naming the rule it breaks."""
    reason = why_invalid(layout, workload)
    if reason:
        raise InvalidLayout(f"invalid layout {layout.key()}: {reason}")
    return layout
