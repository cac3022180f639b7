"""A cluster spec: the hardware constants the performance model reads (CLUSTER_KEYS, each with its documented
default), its scale-up domain, its Slurm and operations tables, loaded from a preset or a TOML file with unknown
keys refused. Pure apart from reading that file."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from tuner.errors import SpecError
from tuner.frameworks import NAMES as FRAMEWORK_NAMES
from tuner.goodput import check_operations
from tuner.presets import find_spec_file, read_toml
from tuner.scaleup import DOMAIN_KEYS, check_domain, segment
from tuner.spec_keys import check_keys

# Every hardware constant the performance model uses lives here, with its documented default.
# Numbers must be > 0, except the fixed overheads (ALLOW_ZERO), which may be measured as none.
CLUSTER_KEYS: dict[str, tuple[type, Any]] = {
    "name": (str, ...),
    "gpus_per_node": (int, ...),
    "peak_tflops": (float, ...),                 # dense bf16/fp16 per GPU
    "peak_tflops_fp8": (float, None),            # dense FP8 per GPU (none: the GPU has no FP8 GEMMs)
    "peak_tflops_fp4": (float, None),            # dense FP4 (NVFP4 / MXFP4) per GPU (none: no FP4 GEMMs)
    "block_scaled": (bool, False),               # tensor cores scale MX / NVFP4 blocks (Blackwell, CDNA 4)
    "software": (str, "cuda"),                   # the GPU stack `launch` writes for: "cuda" | "rocm" (AMD)
    "matmul_efficiency_fp8": (float, None),      # eta_max of FP8 GEMMs where measured apart (default matmul_efficiency)
    "matmul_efficiency_fp4": (float, None),      # eta_max of FP4 GEMMs where measured apart (default the FP8 one)
    "memory_gb": (float, ...),                   # per GPU: the bytes one process can allocate, GB of 1e9 (not
                                                 # the vendor's binary nameplate: an H100 "80 GB" allocates 84.9)
    "memory_gib": (float, None),                 # the same in GiB (2^30 bytes), as cudaMemGetInfo / PyTorch's
                                                 # "total capacity" / rocm-smi state it; read into memory_gb once
    "hbm_bandwidth_gbps": (float, ...),          # per GPU
    "intra_node_bandwidth_gbps": (float, ...),   # per GPU, per direction, whole-node groups
    "inter_node_bandwidth_gbps": (float, None),  # per node injection, per direction (required unless
                                                 # scale_out_bandwidth_gbps gives it per GPU)
    # The scale-up domain (NVLink / Infinity Fabric) when it is more than one node: an NVL72 rack is 18 trays
    # (nodes, gpus_per_node 4) in one 72-GPU NVLink domain. Default: the node.
    "scale_up_domain_gpus": (int, None),         # GPUs in one domain (a multiple of gpus_per_node)
    "scale_up_bandwidth_gbps": (float, None),    # per GPU, per direction, across the domain's nodes
                                                 # (default intra_node_bandwidth_gbps)
    "scale_out_bandwidth_gbps": (float, None),   # per GPU, per direction: its own NIC(s) to other domains
                                                 # (read into inter_node_bandwidth_gbps = this x gpus_per_node)
    "matmul_efficiency": (float, 0.7),           # eta_max: fraction of peak that large training GEMMs sustain
    "latency_us": (float, 10.0),                 # per ring step of a collective / per p2p message
    "gemm_knee_gflop": (float, 20.0),            # per-GPU GEMM work (GFLOP) at which efficiency is eta_max / 2
    "attention_efficiency": (float, 0.35),       # fraction of peak on the attention FLOPs Megatron counts (full s^2)
    "memory_bandwidth_efficiency": (float, 0.7),  # fraction of HBM bandwidth element-wise kernels reach
    "network_efficiency": (float, 0.8),          # collective bus bandwidth / link bandwidth for large messages
    "microbatch_overhead_ms": (float, 1.0),      # fixed cost per micro-batch per stage chunk (dispatch, p2p sync)
    "step_overhead_ms": (float, 0.0),            # fixed cost per iteration (engine step, optimizer dispatch, loss sync)
    "memory_reserved_gb": (float, 3.0),          # context, communication buffers, workspaces, allocator slack
    "flash_attention": (bool, True),             # whether attention keeps no s^2 scores (and runs fused)
    "sm_count": (int, None),                     # streaming multiprocessors per GPU (none: communication kernels'
                                                 # SMs not counted against the compute they overlap)
    "tp_overlap_gemm_cost": (bool, None),        # the GEMM curve is a kernel measurement that does not carry what
                                                 # Transformer Engine's TP overlap costs the GEMMs it hides under, so
                                                 # the model charges it (tuner.perfmodel.tp_overlap; needs sm_count)
    "host_link_gbps": (float, None),             # per GPU, per direction, to host memory (PCIe / NVLink-C2C): CPU
                                                 # activation offloading's copies (none: HOST_LINK_GBPS)
    "host_d2h_gbps": (float, None),              # per GPU, GPU -> host, measured with every GPU of the node copying
                                                 # at once (nvbandwidth all_to_host_memcpy_ce; none: host_link_gbps)
    "host_h2d_gbps": (float, None),              # per GPU, host -> GPU, the same way (host_to_all_memcpy_ce)
    "nic_shares_host_link": (bool, None),        # the GPU's NIC sits behind the same PCIe link as its host copies
                                                 # (HGX: GPU PIX NIC), so GPUDirect traffic shares it (none: false)
    "host_memory_gb": (float, None),             # the node's host memory per GPU: what CPU activation offloading may
                                                 # hold at most (none: not checked)
    "device": (str, None),                       # "cpu": the "GPUs" are CPU cores (local, local-slurm, a file
                                                 # `tuner calibrate` wrote on CPUs); none: GPUs. The local runner
                                                 # trains on what this says (tuner.runners.local.device_for)
    "framework": (str, "megatron-deepspeed"),    # the training stack run here by default (tuner.frameworks):
                                                 # --framework overrides it per study
    "group_bandwidth_gbps": (dict, None),        # {"2": 200.0, ...} per-GPU bandwidth of an aligned intra-node block
    "slurm": (dict, None),                       # the [slurm] table used by the Slurm runner
    "operations": (dict, None),                  # the [operations] table (tuner.goodput: node MTBF, file system
                                                 # bandwidth, restart, node power); absent keys: cited defaults
}
#: Keys of older cluster files and stored studies, read and dropped by ClusterSpec.from_dict: comm_overlap
#: (now the framework's overlaps: true meant Megatron-Core) and memory_headroom (the margin is now a fit
#: probability from the framework's measured memory error).
RETIRED_CLUSTER_KEYS = ("comm_overlap", "memory_headroom")
#: A GPU's link to host memory where a cluster file states none: PCIe Gen5 x16, 32 GT/s x 16 lanes with 128b/130b
#: encoding = 63 GB/s per direction (PCI-SIG, PCI Express Base Specification 5.0: 32 GT/s a lane), the 64 GB/s a
#: direction usually quoted: a PEAK, what offloading's copies get only where a file states no measured host_d2h_gbps /
#: host_h2d_gbps (every GPU of the node copying at once: 44.8 / 55.2 on an 8x H800 HGX node, h100.toml). An older
#: GPU's PCIe Gen4 gives half.
HOST_LINK_GBPS = 64.0
#: Keys stored only when a file states them (so a study stored before they existed reads back the same).
OPTIONAL_KEYS = ("operations", "sm_count", "host_link_gbps", "host_memory_gb", "host_d2h_gbps", "host_h2d_gbps",
                 "nic_shares_host_link", "tp_overlap_gemm_cost", "device")
DEVICES = ("cpu", "gpu")
#: GB of 1e9 bytes in one GiB: the model's unit (tuner.perfmodel.memory.GB) per 2^30 bytes.
GB_PER_GIB = 2 ** 30 / 1e9


def _capacity_in_gb(data: dict, where: str) -> dict:
    """`data` with a memory_gib capacity read into memory_gb (GB of 1e9 bytes, the unit every prediction is in);
    a file gives one of the two."""
    if data.get("memory_gib") is None:
        return {k: v for k, v in data.items() if k != "memory_gib"}
    if data.get("memory_gb") is not None:
        raise SpecError(f"{where}: give the GPU's capacity once: memory_gib (GiB, as cudaMemGetInfo / rocm-smi "
                        f"state it) or memory_gb (GB of 1e9 bytes), not both")
    gib = check_keys("cluster", where, {"memory_gib": data["memory_gib"]}, {"memory_gib": (float, None)})["memory_gib"]
    return {**{k: v for k, v in data.items() if k != "memory_gib"}, "memory_gb": gib * GB_PER_GIB}


def cluster_framework(cluster: dict) -> str:
    """A cluster file's (or stored cluster's) framework; one written before frameworks: the stack its
    comm_overlap described."""
    if cluster.get("framework") is not None:
        return cluster["framework"]
    return "megatron-core" if cluster.get("comm_overlap") else "megatron-deepspeed"


@dataclass(frozen=True)
class ClusterSpec:
    name: str
    gpus_per_node: int
    peak_tflops: float
    memory_gb: float
    hbm_bandwidth_gbps: float
    intra_node_bandwidth_gbps: float
    inter_node_bandwidth_gbps: float
    matmul_efficiency: float = 0.7
    latency_us: float = 10.0
    gemm_knee_gflop: float = 20.0
    attention_efficiency: float = 0.35
    memory_bandwidth_efficiency: float = 0.7
    network_efficiency: float = 0.8
    microbatch_overhead_ms: float = 1.0
    step_overhead_ms: float = 0.0
    memory_reserved_gb: float = 3.0
    flash_attention: bool = True
    framework: str = "megatron-deepspeed"
    group_bandwidth_gbps: dict | None = None
    slurm: dict | None = None
    peak_tflops_fp8: float | None = None
    scale_up_domain_gpus: int | None = None
    scale_up_bandwidth_gbps: float | None = None
    peak_tflops_fp4: float | None = None
    block_scaled: bool = False
    software: str = "cuda"
    matmul_efficiency_fp8: float | None = None
    matmul_efficiency_fp4: float | None = None
    operations: dict | None = None           # tuner.goodput.OPERATION_KEYS; stored only when given
    sm_count: int | None = None              # SMs per GPU; stored only when given
    host_link_gbps: float | None = None      # GB/s per GPU per direction to the host; stored only when given
    host_memory_gb: float | None = None      # host memory per GPU (GB); stored only when given
    host_d2h_gbps: float | None = None       # measured GPU -> host GB/s per GPU, all GPUs at once; stored when given
    host_h2d_gbps: float | None = None       # measured host -> GPU GB/s per GPU, all GPUs at once; stored when given
    nic_shares_host_link: bool | None = None  # GPUDirect traffic on the host copies' PCIe link; stored when given
    tp_overlap_gemm_cost: bool | None = None  # charge the TP overlap's own GEMM cost (tp_overlap); stored when given
    device: str | None = None                # "cpu" for CPU cores as GPUs; none: GPUs; stored when given

    @property
    def domain_gpus(self) -> int:
        """GPUs in one scale-up (NVLink / Infinity Fabric) domain: the node unless the cluster says more."""
        return self.scale_up_domain_gpus or self.gpus_per_node

    @property
    def domain_bandwidth(self) -> float:
        """Per-GPU bandwidth (GB/s, per direction) of a group that spans nodes inside one domain."""
        return self.scale_up_bandwidth_gbps or self.intra_node_bandwidth_gbps

    @property
    def host_link(self) -> float:
        """GB/s per GPU, per direction, between its memory and the host's (HOST_LINK_GBPS where the file gives none)."""
        return self.host_link_gbps or HOST_LINK_GBPS

    @property
    def host_d2h(self) -> float:
        """GB/s per GPU from its memory to the host's while every GPU of the node copies so (CPU activation offloading's
        forward): the file's measured host_d2h_gbps, else the link's peak (host_link)."""
        return self.host_d2h_gbps or self.host_link

    @property
    def host_h2d(self) -> float:
        """GB/s per GPU from the host's memory to its own while every GPU of the node copies so (the reloads in the
        backward): the file's measured host_h2d_gbps, else the link's peak (host_link)."""
        return self.host_h2d_gbps or self.host_link

    @property
    def nic_bandwidth(self) -> float:
        """Scale-out bandwidth per GPU (GB/s, per direction): the node's injection shared by its GPUs."""
        return self.inter_node_bandwidth_gbps / self.gpus_per_node

    def for_nodes(self, nodes: int) -> "ClusterSpec":
        """The cluster as a job of `nodes` nodes gets it (tuner.scaleup.segment: the racks of an NVL72 domain)."""
        seg = segment(self.domain_gpus // self.gpus_per_node, nodes)
        import dataclasses
        return self if seg * self.gpus_per_node == self.domain_gpus else dataclasses.replace(
            self, scale_up_domain_gpus=seg * self.gpus_per_node)

    @property
    def segment_nodes(self) -> int:
        """Nodes of one scale-up domain (1 when the domain is the node): Slurm's --segment."""
        return self.domain_gpus // self.gpus_per_node

    def intra_group_bandwidth(self, size: int) -> float:
        """Per-GPU bandwidth (GB/s) of a collective group of `size` GPUs inside one node."""
        table = self.group_bandwidth_gbps or {}
        if str(size) in table:
            return float(table[str(size)])
        return self.intra_node_bandwidth_gbps

    def as_dict(self) -> dict:
        """Every key; the scale-up domain's only when set, so a one-node-domain cluster is stored as before."""
        return {k: v for k, v in asdict(self).items() if not (k in DOMAIN_KEYS and v in (None, False, "cuda"))
                and not (k in OPTIONAL_KEYS and v is None)}

    @classmethod
    def from_dict(cls, data: dict, where: str = "cluster") -> "ClusterSpec":
        framework = cluster_framework(data)          # before the retired keys are dropped
        data = {**{k: v for k, v in data.items() if k not in RETIRED_CLUSTER_KEYS}, "framework": framework}
        d = check_keys("cluster", where, _capacity_in_gb(data, where), CLUSTER_KEYS)
        d.pop("memory_gib")
        check_domain(d, where)
        check_operations(d["operations"], where)
        if d["device"] not in (None, *DEVICES):
            raise SpecError(f"{where}: cluster key 'device' must be one of {', '.join(map(repr, DEVICES))}, "
                            f"got {str(d['device'])[:200]!r}")
        if d["framework"] not in FRAMEWORK_NAMES:
            raise SpecError(f"{where}: cluster key 'framework' must be one of {', '.join(FRAMEWORK_NAMES)}, "
                            f"got {d['framework'][:200]!r}")
        for k, v in (d["group_bandwidth_gbps"] or {}).items():
            if not (k.isdigit() and isinstance(v, (int, float)) and v > 0):
                raise SpecError(f"{where}: group_bandwidth_gbps entries are \"<group size>\" = <GB/s>, got {k} = {v!r}")
        for k in ("matmul_efficiency", "attention_efficiency", "memory_bandwidth_efficiency", "network_efficiency",
                  "matmul_efficiency_fp8", "matmul_efficiency_fp4"):
            if d[k] is not None and d[k] > 1:
                raise SpecError(f"{where}: {k} is a fraction of peak and must be <= 1, got {d[k]}")
        return _check_nic_sharing(cls(**d), where)


def _check_nic_sharing(spec: ClusterSpec, where: str) -> ClusterSpec:
    """nic_shares_host_link needs a host link the NIC alone does not fill: the offload copies get what the NIC leaves
    of it (tuner.perfmodel.offload.shared_rates), so a NIC at or above the link would leave them nothing."""
    nic = spec.nic_bandwidth * spec.network_efficiency
    if spec.nic_shares_host_link and nic >= spec.host_link:
        raise SpecError(f"{where}: nic_shares_host_link is set but the NIC's {nic:.1f} GB/s per GPU fills the host link "
                        f"({spec.host_link:.1f} GB/s): state host_link_gbps as the PCIe link the NIC and the copies "
                        f"share, or drop nic_shares_host_link")
    return spec


def load_cluster(name: str) -> ClusterSpec:
    path = find_spec_file("clusters", name)
    return ClusterSpec.from_dict(read_toml(path), str(path))
