"""Where a launched layout came from (`Source`): a study's trial, the store, or the performance model.

The launch files themselves are rendered by tuner.render.launch (`launch_files`); `Source` is what
their layout.json and `tuner launch` say about the layout.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Source:
    """Where the launched layout came from: a study's trial (measured or simulated) or the model."""

    kind: str                         # "study" | "store" | "model"
    study: str | None = None
    trial: int | None = None
    runner: str | None = None
    samples_per_second: float | None = None
    mfu: float | None = None
    tflops_per_gpu: float | None = None      # Megatron's count (recompute included), reported beside
    peak_fraction: float | None = None

    @property
    def measured(self) -> bool:
        return self.kind != "model" and self.runner not in (None, "sim")

    def describe(self) -> str:
        pct = "" if self.mfu is None else f", {self.samples_per_second:.4g} samples/s, MFU {100 * self.mfu:.2f} %"
        if self.kind == "model":
            return (f"the performance model's best layout (nothing stored at this node count; predicted, corrected "
                    f"by any stored trials at other node counts{pct})")
        how = "measured" if self.measured else f"predicted by the {self.runner or 'unknown'} runner"
        where = f"study '{self.study}'" if self.kind == "study" else f"the store (study '{self.study}')"
        return f"the best trial of {where}: trial {self.trial}, {how}{pct}"

    def as_dict(self) -> dict:
        return {"kind": self.kind, "study": self.study, "trial": self.trial, "runner": self.runner,
                "measured": self.measured, "samples_per_second": self.samples_per_second, "mfu": self.mfu,
                "tflops_per_gpu": self.tflops_per_gpu,
                "peak_fraction": self.peak_fraction, "description": self.describe()}
