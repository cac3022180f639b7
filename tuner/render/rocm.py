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

Two cases the Primus recipes do not cover, where the script writes none of their variables:
- gfx90a (CDNA 2: MI250X, as on OLCF Frontier): Primus's configurations and images are for MI300X, MI325X and
  MI355X / MI350X only (its architecture table, same page), and no source gives gfx90a those settings. The
  stack is the site's ROCm modules (the [slurm] table's) with a ROCm build of the framework: the Frontier study
  ran Megatron-DeepSpeed ported to ROCm 5.4 / 5.7 with FlashAttention-2's ROCm port (docs/reference/
  frontier-paper.md), which `--use-flash-attn-v2` imports as flash_attn.flash_attn_interface (Megatron-DeepSpeed
  @ 4efb479d5317 megatron/model/transformer.py lines 53 and 543).
- a network the [slurm] table already configures through libfabric (it sets FI_* variables: HPE Slingshot's CXI
  provider, Frontier's FI_CXI_ATS=0): RCCL reaches it through the aws-ofi-rccl net plugin, not its InfiniBand /
  RoCE transport, so NCCL_IB_* do not apply; the note says to load the plugin (ROCm/aws-ofi-rccl: "use libfabric
  as a network provider while running AMD's RCCL"; the Frontier study ran RCCL with it).
"""

from __future__ import annotations

GFX942 = {"HSA_NO_SCRATCH_RECLAIM": "1", "NVTE_CK_IS_V3_ATOMIC_FP32": "1"}
MULTI_NODE = {"NCCL_IB_GID_INDEX": "3"}
ARCH_NAMES = {"gfx90a": "gfx90a (CDNA 2)", "gfx942": "gfx942 (CDNA 3)", "gfx950": "gfx950 (CDNA 4)"}


def arch(cluster) -> str:
    """The AMD GPU architecture a ROCm cluster's file describes, from what it states: gfx950 (CDNA 4: MI350X, MI355X)
    scales MX blocks (block_scaled); gfx942 (CDNA 3: MI300X, MI325X, MI300A) has FP8 GEMMs (peak_tflops_fp8) but not
    those; gfx90a (CDNA 2: MI250X, MI250, MI210) neither: "fp8 features are only supported on MI300" among MI200 and
    MI300 (ROCm/TransformerEngine README.rst line 40 @ ac80527), and the MI250X's datasheet lists no FP8 rate."""
    if cluster.block_scaled:
        return "gfx950"
    return "gfx942" if cluster.peak_tflops_fp8 else "gfx90a"


def gfx942(cluster) -> bool:
    """Whether the cluster's GPUs are CDNA 3 (gfx942): the ones Primus's HSA / CK variables are for."""
    return cluster.software == "rocm" and arch(cluster) == "gfx942"


def libfabric(cluster) -> bool:
    """Whether the cluster's [slurm] table configures libfabric (sets an FI_* variable: HPE Slingshot), so RCCL runs
    over the aws-ofi-rccl plugin and RoCE's NCCL_IB_* variables do not apply."""
    return any(name.startswith("FI_") for name in ((cluster.slurm or {}).get("env") or {}))


def launch_env(workload) -> dict[str, str]:
    """The ROCm variables a launch script exports (none on a CUDA cluster)."""
    c = workload.cluster
    if c.software != "rocm":
        return {}
    env = dict(GFX942) if gfx942(c) else {}
    if workload.nodes > 1 and not libfabric(c):
        env.update(MULTI_NODE)
    return env


def notes(workload) -> list[str]:
    """The launch script's comment lines for a ROCm cluster."""
    c = workload.cluster
    if c.software != "rocm":
        return []
    name = f"AMD Instinct {ARCH_NAMES[arch(c)]}"
    if arch(c) == "gfx90a" and workload.framework == "megatron-deepspeed":
        out = [f"ROCm: {name}; run with the site's ROCm modules ([slurm] modules) and a ROCm build of the framework "
               "(the Frontier study: Megatron-DeepSpeed on ROCm 5.x, FlashAttention-2's ROCm port). AMD's Primus "
               "images and their variables are for gfx942 / gfx950: none is exported."]
    elif arch(c) == "gfx90a":
        mods = ((c.slurm or {}).get("framework_modules") or {}).get(workload.framework)
        load = (f"the [slurm] table's framework_modules load {', '.join(mods)}" if mods else
                "load a rocm/6.x (or newer) module in place of the [slurm] table's modules" if mods is None else
                "the [slurm] table's framework_modules load no module for it: the job's environment must bring ROCm 6")
        stack = "PyTorch's ROCm wheels" if workload.framework == "torchtitan" else ("ROCm Transformer Engine, "
                                                                                  "PyTorch's ROCm wheels")
        out = [f"ROCm: {name}; {workload.framework} runs on ROCm 6 or newer ({stack}): {load}, with a ROCm build of "
               "the framework. AMD's Primus images and their variables are for gfx942 / gfx950: none is exported."]
    else:   # gfx950 on one node (or over libfabric) gets none of the variables: the line must not promise them
        said = ("Variables from AMD's Primus recipes are exported below." if launch_env(workload) else
                "None of the Primus recipes' variables applies (HSA_NO_SCRATCH_RECLAIM and NVTE_CK_IS_V3_ATOMIC_FP32 "
                "are for gfx942, NCCL_IB_GID_INDEX for more than one node): none is exported.")
        out = [f"ROCm: {name}; run inside AMD's ROCm training image (rocm/primus or rocm/megatron-lm: RCCL, ROCm "
               f"Transformer Engine, hipBLASLt). {said}"]
    if workload.nodes > 1 and libfabric(c):
        out.append("Multi-node RCCL over libfabric (the [slurm] table's FI_* variables: HPE Slingshot): put the "
                   "aws-ofi-rccl plugin's lib on LD_LIBRARY_PATH, else RCCL falls back to TCP sockets.")
    elif workload.nodes > 1:
        out.append("Multi-node RCCL: export NCCL_IB_HCA (from ibv_devices), NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME "
                   "(from ip a) for your nodes; NCCL_IB_GID_INDEX is 3 for RoCE, 1 for AMD AINIC.")
    return out
