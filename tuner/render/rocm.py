"""What a launch on AMD Instinct GPUs (a cluster with software = "rocm") adds to the CUDA one. Pure.

The frameworks run unchanged on ROCm builds of their stacks (RCCL answers to the NCCL_* names, HIP to the
CUDA_* ones, ROCm Transformer Engine to Megatron-Core's TE flags), so the arguments are the same files as on
NVIDIA; what differs is the environment, every variable from AMD's Primus training recipes
(AMD-AGI/Primus docs/02-user-guide/end-to-end-training-recipes.md @ fd1eeabbad15, lines 60-64 and 141-146),
which run Megatron-LM and torchtitan on MI300X / MI325X / MI355X:
- gfx942 (MI300X, MI325X, MI300A; "not needed on MI355X/MI350X (gfx950)", line 59): HSA_NO_SCRATCH_RECLAIM=1
  and NVTE_CK_IS_V3_ATOMIC_FP32=1 (ROCm TE's CK attention kernels);
- more than one node: NCCL_IB_GID_INDEX=3 ("3 for RoCE (1 for AMD AINIC)", line 146); NCCL_IB_HCA,
  NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME name the site's devices, which the script cannot know: its
  notes say to set them (line 141: "auto-detection can pick the wrong device on multi-NIC nodes").
The stack to run them with is the ROCm one: AMD's rocm/primus or rocm/megatron-lm images (ROCm Megatron-LM
with ROCm TE and hipBLASLt; torchtitan with torchao), as the notes say.
"""

from __future__ import annotations

GFX942 = {"HSA_NO_SCRATCH_RECLAIM": "1", "NVTE_CK_IS_V3_ATOMIC_FP32": "1"}
MULTI_NODE = {"NCCL_IB_GID_INDEX": "3"}


def gfx942(cluster) -> bool:
    """Whether the cluster's GPUs are CDNA 3 (gfx942): no MX block scaling (CDNA 4, gfx950, has it)."""
    return cluster.software == "rocm" and not cluster.block_scaled


def launch_env(workload) -> dict[str, str]:
    """The ROCm variables a launch script exports (none on a CUDA cluster)."""
    c = workload.cluster
    if c.software != "rocm":
        return {}
    env = dict(GFX942) if gfx942(c) else {}
    if workload.nodes > 1:
        env.update(MULTI_NODE)
    return env


def notes(workload) -> list[str]:
    """The launch script's comment lines for a ROCm cluster."""
    if workload.cluster.software != "rocm":
        return []
    arch = "gfx942 (CDNA 3)" if gfx942(workload.cluster) else "gfx950 (CDNA 4)"
    out = [f"ROCm: AMD Instinct {arch}; run inside AMD's ROCm training image (rocm/primus or rocm/megatron-lm: "
           "RCCL, ROCm Transformer Engine, hipBLASLt). Variables from AMD's Primus recipes are exported below."]
    if workload.nodes > 1:
        out.append("Multi-node RCCL: export NCCL_IB_HCA (from ibv_devices), NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME "
                   "(from ip a) for your nodes; NCCL_IB_GID_INDEX is 3 for RoCE, 1 for AMD AINIC.")
    return out
