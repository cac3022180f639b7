"""The parallel layout of a training run and the rules that make it valid for a workload.

Pure: no I/O. Megatron-DeepSpeed conventions: GPUs = tp * pp * dp, rank order TP fastest, then DP,
then PP; DeepSpeed's pipeline engine refuses ZeRO-2/3 with pp > 1.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import TYPE_CHECKING

from tuner.errors import InvalidLayout

if TYPE_CHECKING:
    from tuner.specs import Workload

LAYOUT_FIELDS = ("tp", "pp", "dp", "micro_batch", "zero_stage", "activation_checkpointing")


@dataclass(frozen=True, kw_only=True, order=True)
class Layout:
    tp: int
    pp: int
    dp: int
    micro_batch: int
    zero_stage: int = 1
    activation_checkpointing: bool = True

    @property
    def gpus(self) -> int:
        return self.tp * self.pp * self.dp

    def key(self) -> str:
        """A stable, readable key: tp4-pp16-dp2-mb1-z1-ac1."""
        return (f"tp{self.tp}-pp{self.pp}-dp{self.dp}-mb{self.micro_batch}"
                f"-z{self.zero_stage}-ac{int(self.activation_checkpointing)}")

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "Layout":
        missing = [f for f in LAYOUT_FIELDS if f not in d]
        if missing:
            raise InvalidLayout(f"layout is missing {', '.join(missing)}; a layout has {', '.join(LAYOUT_FIELDS)}")
        kw = {f.name: d[f.name] for f in fields(cls)}
        try:
            kw = {k: (bool(v) if k == "activation_checkpointing" else int(v)) for k, v in kw.items()}
        except (TypeError, ValueError) as exc:
            raise InvalidLayout(f"layout values must be integers: {exc}") from None
        return cls(**kw)

    def with_dp_for(self, gpus: int) -> "Layout":
        """The same layout with dp chosen so that tp * pp * dp == gpus (dp 0 if it cannot)."""
        tp_pp = self.tp * self.pp
        dp = gpus // tp_pp if tp_pp and gpus % tp_pp == 0 else 0
        return Layout(**{**self.as_dict(), "dp": dp})


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
