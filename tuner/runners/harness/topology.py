"""Process groups of a 3D-parallel run in Megatron rank order: TP fastest, then DP, then PP.

Rank r has coordinates tp = r % TP, dp = (r // TP) % DP, pp = r // (TP * DP); this is DeepSpeed's
PipeModelDataParallelTopology (axes pipe, data, model). The grid (DeepSpeed's PipelineParallelGrid)
builds the data-, pipe- and tensor-parallel groups and is also the `mpu` handed to
deepspeed.initialize, so gradients are averaged over the DP group only.

MoE layers regroup each pipeline stage's tp*dp ranks as Megatron-Core's expert grid ("MoE parallel
folding", parallel_state.initialize_model_parallel's expert RankGenerator, order tp-ep-dp-pp with tp =
etp): etp fastest, then ep, then expert-dp (edp = tp*dp / (ep*etp)). With etp = tp the EP group is made
of data-parallel ranks of the same TP rank; with etp < tp it spans TP ranks too. The expert groups are
registered with DeepSpeed (deepspeed.utils.groups) under `expert_group_name`, so the engine reduces
expert gradients over the expert-dp group only (and dense ones over the DP group).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch.distributed as dist
from deepspeed.runtime.pipe.topology import PipelineParallelGrid, PipeModelDataParallelTopology


@dataclass
class Parallel:
    """This rank's place in the grid, and the groups it talks over."""

    tp: int
    pp: int
    dp: int
    tp_rank: int
    pp_rank: int
    dp_rank: int
    tp_group: object
    dp_group: object
    topology: PipeModelDataParallelTopology
    grid: PipelineParallelGrid
    sequence_parallel: bool = False     # norms and residuals hold s/tp of the sequence (when tp > 1)
    ep: int = 1                         # expert parallel: ranks sharing one MoE layer's experts
    etp: int = 1                        # expert tensor parallel: ranks splitting each expert's FFN width
    ep_rank: int = 0
    etp_rank: int = 0
    edp_rank: int = 0
    ep_group: object = None
    etp_group: object = None
    edp_group: object = None
    expert_group_name: str = ""         # DeepSpeed's name of the expert groups (expert params' group_name)

    @property
    def first_stage(self) -> bool:
        return self.pp_rank == 0


def coordinates(rank: int, tp: int, pp: int, dp: int) -> tuple[int, int, int]:
    """(tp_rank, dp_rank, pp_rank) of a global rank in Megatron order. Pure."""
    return rank % tp, (rank // tp) % dp, rank // (tp * dp)


def expert_coordinates(rank: int, tp: int, dp: int, ep: int, etp: int) -> tuple[int, int, int]:
    """(etp_rank, ep_rank, edp_rank) of a global rank in the expert grid of its pipeline stage. Pure."""
    local = rank % (tp * dp)
    return local % etp, (local // etp) % ep, local // (etp * ep)


def expert_groups(tp: int, pp: int, dp: int, ep: int, etp: int) -> dict[str, list[list[int]]]:
    """The global ranks of every expert-parallel, expert-tensor-parallel and expert-data-parallel group,
    in Megatron-Core's expert order (etp fastest, then ep, then edp, within each pipeline stage). Pure."""
    if (tp * dp) % (ep * etp):
        raise ValueError(f"ep*etp = {ep}*{etp} must divide tp*dp = {tp * dp} (the ranks of a pipeline stage)")
    edp, stage = tp * dp // (ep * etp), tp * dp
    out: dict[str, list[list[int]]] = {"ep": [], "etp": [], "edp": []}
    for p in range(pp):
        base = p * stage
        out["etp"] += [[base + (e * ep + i) * etp + t for t in range(etp)] for e in range(edp) for i in range(ep)]
        out["ep"] += [[base + (e * ep + i) * etp + t for i in range(ep)] for e in range(edp) for t in range(etp)]
        out["edp"] += [[base + (e * ep + i) * etp + t for e in range(edp)] for i in range(ep) for t in range(etp)]
    return out


def _build_expert_groups(tp: int, pp: int, dp: int, ep: int, etp: int) -> dict:
    """Create the expert groups (collective) and register them with DeepSpeed, whose engine and ZeRO
    reduce an expert parameter's gradient over _EXPERT_DATA_PARALLEL_GROUP[param.group_name]."""
    from deepspeed.utils import groups as ds_groups

    rank, name = dist.get_rank(), f"ep_size_{ep}_etp_{etp}"
    mine: dict = {"expert_group_name": name}
    for kind, all_ranks in expert_groups(tp, pp, dp, ep, etp).items():
        for ranks in all_ranks:
            group = dist.new_group(ranks)
            if rank in ranks:
                mine[f"{kind}_group"], mine[f"{kind}_ranks"] = group, ranks
    ds_groups._EXPERT_PARALLEL_GROUP[name] = mine["ep_group"]
    ds_groups._EXPERT_PARALLEL_GROUP_RANKS[name] = mine.pop("ep_ranks")
    ds_groups._EXPERT_DATA_PARALLEL_GROUP[name] = mine["edp_group"]
    ds_groups._EXPERT_DATA_PARALLEL_GROUP_RANKS[name] = mine.pop("edp_ranks")
    mine.pop("etp_ranks")
    return mine


_STATE: Parallel | None = None


def build(tp: int, pp: int, dp: int, sequence_parallel: bool = False, ep: int = 1, etp: int = 1,
          experts: bool = False) -> Parallel:
    """Create the groups (collective: every rank must call it) and remember them for the model; with
    `experts` (an MoE model) also the expert groups of ep and etp."""
    global _STATE
    world = dist.get_world_size()
    if tp * pp * dp != world:
        raise ValueError(f"tp*pp*dp = {tp}*{pp}*{dp} = {tp * pp * dp} but the job has {world} ranks; "
                         "launch tp*pp*dp processes (--nproc_per_node)")
    topo = PipeModelDataParallelTopology(num_pp=pp, num_mp=tp, num_dp=dp)
    grid = PipelineParallelGrid(topology=topo)
    rank = dist.get_rank()
    tp_rank, dp_rank, pp_rank = coordinates(rank, tp, pp, dp)
    coord = topo.get_coord(rank)
    assert (coord.model, coord.data, coord.pipe) == (tp_rank, dp_rank, pp_rank), (coord, rank)
    _STATE = Parallel(tp=tp, pp=pp, dp=dp, tp_rank=tp_rank, pp_rank=pp_rank, dp_rank=dp_rank,
                      tp_group=grid.get_slice_parallel_group(), dp_group=grid.get_data_parallel_group(),
                      topology=topo, grid=grid, sequence_parallel=sequence_parallel)
    if experts:
        etp_rank, ep_rank, edp_rank = expert_coordinates(rank, tp, dp, ep, etp)
        _STATE = replace(_STATE, ep=ep, etp=etp, ep_rank=ep_rank, etp_rank=etp_rank, edp_rank=edp_rank,
                         **_build_expert_groups(tp, pp, dp, ep, etp))
    return _STATE


def current() -> Parallel:
    if _STATE is None:
        raise RuntimeError("tuner.runners.harness.topology.build() must run before the model is built")
    return _STATE
