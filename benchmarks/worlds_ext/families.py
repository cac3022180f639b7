"""The extended worlds' families: which workloads each runs and the ranges its hidden constants are drawn from.

- "gemm-roofline": the measured per-shape GEMM and attention speeds dominate (fast network, light host,
  no stragglers); what a layout's cut does to each GEMM's shape decides.
- "alloc-memory": tight memory: a large allocator fragmentation growing with in-flight micro-batches,
  extra saved copies, communicator buffers per process group, a wide backward working set.
- "pipeline-host": the pipeline as simulated op by op: a heavy host cost per micro-batch and stage, a
  straggler GPU, per-op jitter, slow inter-node latency.
- "torchtitan": Llama 3 under torchtitan (FSDP2 per-layer gathers, eager kernels, SDPA's FlashAttention-2,
  per-op selective recompute) on H100.
- "moe": Mixtral 8x7B under Megatron-Core: expert loads drawn from a Dirichlet (concentration 6-30 per
  expert: with the router's load-balancing loss the busiest of 8 experts takes about 1.2-1.6x a fair share),
  each expert's small GEMM at its measured speed, the token all-to-all at the measured all-to-all speed,
  skewed by the busiest rank.

Hardware anchors: H100 SXM (132 SMs, XLA's sm_90 tables as measured); MI250X GCD (110 CUs, the MI300X
tables rescaled: GEMMs to a drawn 95-150 TFLOPS plateau -- AMD's MI250X datasheet peak is 191.5 per GCD;
links per block size at drawn fractions of MI300X's, whose seven 64 GB/s links per GPU face one to four
50 GB/s Infinity Fabric links per GCD pair on MI250X; 4 x 25 GB/s Slingshot NICs per node).
"""

from __future__ import annotations

import zlib

import numpy as np

FAMILIES: tuple[str, ...] = ("gemm-roofline", "alloc-memory", "pipeline-host", "torchtitan", "moe")
#: (model, nodes, cluster, framework) per family; the space is frontier-2023 for Megatron-DeepSpeed on
#: Frontier (the Frontier study's), the default space otherwise.
WORKLOADS: dict[str, tuple[tuple[str, int, str, str], ...]] = {
    "gemm-roofline": (("22b", 2, "frontier", "megatron-deepspeed"), ("llama3-8b", 4, "h100", "megatron-core")),
    "alloc-memory": (("175b", 16, "frontier", "megatron-core"), ("llama3-70b", 16, "h100", "megatron-core")),
    "pipeline-host": (("1t", 128, "frontier", "megatron-deepspeed"), ("175b", 16, "frontier", "megatron-deepspeed")),
    "torchtitan": (("llama3-8b", 8, "h100", "torchtitan"), ("llama3-70b", 16, "h100", "torchtitan")),
    "moe": (("mixtral-8x7b", 8, "h100", "megatron-core"),),
}

#: The GPU's link to its host, GB/s per direction (the peak; a world draws what its copies get of it, OFFLOAD):
#: H100 SXM5's PCIe Gen5 x16 (32 GT/s x 16 lanes, 128b/130b: 63 GB/s); a Frontier MI250X GCD's Infinity Fabric link
#: to the EPYC CPU, 36 GB/s each way (OLCF Frontier User Guide, "Node types": "36+36 GB/s" CPU-GCD).
HOST_LINK_GBPS = {"h100": 63.0, "frontier": 36.0}
#: Megatron-Core's CPU activation offloading (a layout's offload_layers): the share of the host link a copy gets, the
#: share of a pass's compute the copies hide under, and the offloaded layers whose activations stay on the GPU while
#: in flight (copy and reload buffers). Drawn from a stream of their own, so every other constant of a world is
#: the one it had before worlds could offload.
OFFLOAD = {"host_eff": (0.55, 0.85), "off_overlap": (0.3, 0.9), "off_buffers": (1.0, 3.0)}
HARDWARE = {
    "h100": {"hw": "sm_90", "sms": 132, "gemm_scale": (0.75, 0.92), "attn_fa2": (0.85, 1.05), "attn_cudnn": (0.8, 1.0),
             "link_2": (0.85, 1.05), "link_4": (0.85, 1.05), "link_8": (0.85, 1.05), "nic_gbps": (400, 400.001),
             "launch_us": (3, 8), "lat_inter_us": (4, 12)},
    "frontier": {"hw": "gfx942", "sms": 110, "gemm_tflops": (95, 150), "attn_frac": (0.12, 0.25),
                 "link_2": (0.4, 0.7), "link_4": (0.2, 0.4), "link_8": (0.1, 0.25), "nic_gbps": (100, 100.001),
                 "launch_us": (6, 15), "lat_inter_us": (6, 20)},
}
BASE = {
    "causal": (0.7, 0.95), "attn_wave": (0.3, 1.0), "attn_bwd": (0.55, 0.85), "hbm_eff": (0.6, 0.85),
    "fuse": (0.35, 0.7), "eager_ew": (2.0, 4.0), "ew_bwd": (1.6, 2.6), "kernels": (25, 50), "eager_kernels": (1.3, 2.0),
    "nic_eff": (0.6, 0.9), "congestion": (0.0, 0.2), "a2a_eff": (0.3, 0.7),
    "step_ms": (5, 50), "jitter": (0.0, 0.02), "straggler": (1.0, 1.05), "straggler_at": (0.0, 1.0),
    "tp_overlap": (0.3, 0.8), "cp_overlap": (0.5, 0.95), "dp_overlap": (0.5, 0.95), "fsdp_overlap": (0.5, 0.95),
    "p2p_overlap": (0.3, 0.9), "z3_prefetch": (0.3, 0.8), "ep_overlap": (0.3, 0.8), "sac_mm": (0.0, 1.0),
    "opt_bytes": (16, 40), "dtensor_us": (15, 60), "tt_cp_eff": (0.7, 0.95), "moe_kernels": (4, 12),
    "moe_skew": (1.0, 1.3), "moe_alpha": (10, 40),
    "frag0": (0.02, 0.08), "frag1": (0.0, 0.05), "context_gb": (0.5, 1.5), "comm_gb": (0.05, 0.4),
    "bwd_ws": (0.5, 1.5), "usable": (0.95, 1.0), "qkv_copy": (0, 1), "logits_fp32": (0, 1), "ds_grad": (0, 3),
    "norm_fp32": (0, 1), "rope_fp32": (0, 1),
}
#: Host cost per op (one micro-batch through one stage), ms, per framework: DeepSpeed's pipeline engine
#: interprets its instructions in Python; Megatron's schedules are leaner.
MB_MS = {"megatron-deepspeed": (1.0, 6.0), "megatron-core": (0.1, 1.0), "torchtitan": (0.2, 1.5)}
FAMILY = {
    "gemm-roofline": {"jitter": (0.0, 0.005), "straggler": (1.0, 1.0001), "step_ms": (2, 10), "nic_eff": (0.8, 0.95),
                      "congestion": (0.0, 0.05), "attn_wave": (0.6, 1.2), "causal": (0.6, 0.8)},
    "alloc-memory": {"frag0": (0.06, 0.16), "frag1": (0.03, 0.10), "usable": (0.86, 0.95), "context_gb": (1.0, 3.0),
                     "comm_gb": (0.3, 1.0), "bwd_ws": (1.5, 3.5), "qkv_copy": (0.4, 1.0), "logits_fp32": (0.5, 1)},
    "pipeline-host": {"jitter": (0.03, 0.10), "straggler": (1.05, 1.3), "lat_inter_us": (15, 40),
                      "mb_ms": (8.0, 30.0), "step_ms": (50, 300)},
    "torchtitan": {"fsdp_overlap": (0.3, 0.9), "jitter": (0.0, 0.03), "cp_overlap": (0.0, 0.4)},
    "moe": {"moe_alpha": (6.0, 30.0), "moe_skew": (1.0, 1.5), "a2a_eff": (0.35, 0.75)},
}
DS_GRAD_BYTES = (2.0, 4.0, 6.0)          # DeepSpeed bf16 grads: bf16 only, an fp32 accumulation buffer, both


def draw_physics(family: str, case: tuple[str, int, str, str], seed: int, num_experts: int = 0) -> dict:
    """The hidden constants of (family, workload case, seed); the node count does not enter (a world at
    2N nodes has the same physics)."""
    if family not in FAMILIES:
        raise ValueError(f"unknown family '{family}'; families: {', '.join(FAMILIES)}")
    model, _, cluster, fw = case
    rng = np.random.default_rng([FAMILIES.index(family), zlib.crc32(f"{model}:{cluster}:{fw}".encode()), int(seed)])
    hw = HARDWARE[cluster]
    ranges = {**BASE, "mb_ms": MB_MS[fw], **{k: v for k, v in hw.items() if isinstance(v, tuple)}, **FAMILY[family]}
    ph = {k: float(rng.uniform(*ranges[k])) for k in sorted(ranges)}
    ph["hw"], ph["sms"] = hw["hw"], hw["sms"]
    off = np.random.default_rng([FAMILIES.index(family), zlib.crc32(f"{model}:{cluster}:{fw}".encode()), int(seed), 7])
    ph.update({k: float(off.uniform(*OFFLOAD[k])) for k in sorted(OFFLOAD)})
    ph["host_gbps"] = HOST_LINK_GBPS[cluster]
    from worlds_ext import compute, tables
    if cluster == "frontier":
        ph["gemm_scale"] = ph["gemm_tflops"] * 1e12 / tables.gemm_peak("gfx942", "bf16")
        ph["attn_peak_tflops"] = ph["attn_frac"] * 191.5
    else:
        kernel = "cudnn" if fw == "megatron-core" else "fa2"
        ph["attn_peak_tflops"] = max(compute.FA_SPEED[kernel]) * ph[f"attn_{kernel}"]
    for flag in ("qkv_copy", "norm_fp32", "rope_fp32"):
        ph[flag] = ph[flag] > 0.5
    ph["logits_fp32"] = ph["logits_fp32"] > 0.5 or fw != "torchtitan"
    ph["ds_grad_bytes"] = DS_GRAD_BYTES[min(int(ph["ds_grad"]), 2)]
    if num_experts:
        ph["expert_load"] = tuple(float(x) for x in rng.dirichlet([ph["moe_alpha"]] * num_experts))
    return ph
