"""The scale-up domain of a cluster (issue 26): the NVLink / Infinity Fabric domain apart from the node, as a
cluster file states it and as a job gets it. Pure.

A node (`gpus_per_node`) is what Slurm allocates (a DGX, a GB200 tray); a domain of several nodes (an NVL72
rack: 18 trays of 4) is `scale_up_domain_gpus`, and a job of N nodes gets it in equal segments, the largest
node count that divides N and fits one domain (Slurm's --segment on a block topology): 64 trays = 4 racks of
16, 36 trays = 2 racks of 18. tuner.perfmodel.comm charges groups inside the job's domain its bandwidth.
"""

from __future__ import annotations

from tuner.errors import SpecError

#: Cluster keys added with the scale-up domain and block-scaled precisions (issue 26), stored only when set
#: (ClusterSpec.as_dict), so a cluster without them is stored as before.
DOMAIN_KEYS = ("scale_up_domain_gpus", "scale_up_bandwidth_gbps", "peak_tflops_fp4", "block_scaled", "software",
               "matmul_efficiency_fp8", "matmul_efficiency_fp4")
SOFTWARE = ("cuda", "rocm")


def check_domain(d: dict, where: str) -> None:
    """The scale-up domain's keys: a domain of whole nodes; the scale-out network given per node or per
    GPU (both: they must agree), read into inter_node_bandwidth_gbps."""
    gpn, dom, per_gpu = d["gpus_per_node"], d["scale_up_domain_gpus"], d.pop("scale_out_bandwidth_gbps")
    if d["software"] not in SOFTWARE:
        raise SpecError(f"{where}: cluster key 'software' must be one of {', '.join(map(repr, SOFTWARE))}, "
                        f"got {d['software'][:200]!r}")
    if dom is not None and dom % gpn:
        raise SpecError(f"{where}: scale_up_domain_gpus {dom} must be a multiple of gpus_per_node {gpn} "
                        "(a domain holds whole nodes, e.g. 72 = 18 trays of 4 in an NVL72 rack)")
    if per_gpu is None and d["inter_node_bandwidth_gbps"] is None:
        raise SpecError(f"{where}: missing cluster key inter_node_bandwidth_gbps (per node) or "
                        "scale_out_bandwidth_gbps (per GPU)")
    if per_gpu is not None:
        node = per_gpu * gpn
        if d["inter_node_bandwidth_gbps"] is not None and abs(d["inter_node_bandwidth_gbps"] - node) > 1e-6 * node:
            raise SpecError(f"{where}: inter_node_bandwidth_gbps {d['inter_node_bandwidth_gbps']:g} (per node) and "
                            f"scale_out_bandwidth_gbps {per_gpu:g} (per GPU) x {gpn} GPUs = {node:g} disagree: give one")
        d["inter_node_bandwidth_gbps"] = node


def segment(domain_nodes: int, nodes: int) -> int:
    """Nodes per domain a job of `nodes` nodes gets: the largest count <= domain_nodes dividing `nodes`."""
    if domain_nodes <= 1 or nodes < 1:
        return max(1, domain_nodes)
    return max(k for k in range(1, min(domain_nodes, nodes) + 1) if nodes % k == 0)
