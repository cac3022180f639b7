"""Where Megatron-Core's CPU activation offloading (the layout's offload_layers) runs: the rules its own config
checks, at NVIDIA/Megatron-LM d98e8a64ddf3 (the version `tuner launch` writes for, tuner.render.mcore). Pure.

megatron/core/transformer/transformer_config.py lines 1884-1899: cpu_offloading_num_layers must be >= 0 and below
num_layers; no pipeline parallelism; no activation recompute (recompute_granularity set: full, selective or any
--recompute-modules); line 2800: no per-layer CUDA graphs (the full-iteration graph may; tuner writes none).
arguments.py line 1950 turns cpu_offloading on for --cpu-offloading-num-layers > 0; the offload context takes the
transformer block's num_layers (transformer_block.py line 309). Megatron-DeepSpeed and torchtitan have no such
setting that tuner writes."""

from __future__ import annotations


def offload_refusal(framework: str, layout, workload) -> str | None:
    """Why `framework` cannot run the layout's offload_layers (None: off, or it can)."""
    n = layout.offload_layers
    if not n:
        return None
    if framework != "megatron-core":
        return (f"{framework} has no CPU activation offloading that tuner writes (offload_layers {n}); use "
                "--offload-layers 0, or --framework megatron-core (--cpu-offloading-num-layers)")
    layers = workload.model.num_layers
    if n >= layers:
        return (f"megatron-core offloads fewer layers than the model has: offload_layers {n} >= num_layers {layers} "
                f"(transformer_config.py line 1885); use --offload-layers {layers - 1} or less")
    if layout.pp > 1:
        return (f"megatron-core refuses CPU offloading with pp {layout.pp} (transformer_config.py line 1891: \"no "
                "support for Pipeline parallelism\"); use --pp 1, or --offload-layers 0")
    if layout.recompute != "none":
        return (f"megatron-core refuses CPU offloading with recompute {layout.recompute} (transformer_config.py line "
                "1896: \"does not work when activation recomputation is enabled\"); use --recompute none, or "
                "--offload-layers 0")
    return None


def offload_share(layout, workload) -> float:
    """z's offloading coordinate (tuner.correction.features): the share of the model's layers whose activations
    Megatron-Core offloads to the host, from none (0) to all (1), as far apart as no recompute and full recompute. The
    model hides the copies under compute and prices 24 and 36 offloaded layers alike; without this coordinate two such
    measured twins 8 % apart were one point to the correction (issue 30 round 43). Without a workload, whether it
    offloads at all."""
    if not layout.offload_layers:
        return 0.0
    return min(1.0, layout.offload_layers / workload.model.num_layers) if workload is not None else 1.0
