"""The performance model's answer for one layout."""

from __future__ import annotations

from dataclasses import dataclass, field

from tuner.layout import Layout


@dataclass(frozen=True)
class Prediction:
    layout: Layout
    tflops_per_gpu: float        # Megatron count (with recompute when checkpointing): what the study reports
    peak_fraction: float         # tflops_per_gpu / cluster peak
    mfu: float                   # model FLOPs (c = 3) / (step time * GPUs * peak)
    step_time_s: float
    samples_per_second: float
    memory_gb: float             # peak per GPU, worst stage
    fits: bool                   # p_fit >= PRUNE_BELOW: the model cannot rule it out (not pruned)
    memory_breakdown: dict = field(default_factory=dict)   # GB, on the worst stage
    time_breakdown: dict = field(default_factory=dict)     # seconds per iteration
    reason: str = ""             # why it does not fit, when it does not
    memory_stage: int = 0        # the pipeline stage whose memory is memory_gb (0 = first)
    p_fit: float = 1.0           # probability that it fits, from the framework's memory error (measured or assumed)

    def as_dict(self) -> dict:
        return {"layout": self.layout.as_dict(), "tflops_per_gpu": self.tflops_per_gpu,
                "peak_fraction": self.peak_fraction, "mfu": self.mfu, "step_time_s": self.step_time_s,
                "samples_per_second": self.samples_per_second, "memory_gb": self.memory_gb, "fits": self.fits,
                "p_fit": self.p_fit, "reason": self.reason, "memory_stage": self.memory_stage,
                "breakdown": {"memory_gb": self.memory_breakdown, "time_s": self.time_breakdown}}
