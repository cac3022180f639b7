"""Process groups of a 3D-parallel run in Megatron rank order: TP fastest, then DP, then PP.

Rank r has coordinates tp = r % TP, dp = (r // TP) % DP, pp = r // (TP * DP); this is DeepSpeed's
PipeModelDataParallelTopology (axes pipe, data, model). The grid (DeepSpeed's PipelineParallelGrid)
builds the data-, pipe- and tensor-parallel groups and is also the `mpu` handed to
deepspeed.initialize, so gradients are averaged over the DP group only.
"""

from __future__ import annotations

from dataclasses import dataclass

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

    @property
    def first_stage(self) -> bool:
        return self.pp_rank == 0


def coordinates(rank: int, tp: int, pp: int, dp: int) -> tuple[int, int, int]:
    """(tp_rank, dp_rank, pp_rank) of a global rank in Megatron order. Pure."""
    return rank % tp, (rank // tp) % dp, rank // (tp * dp)


_STATE: Parallel | None = None


def build(tp: int, pp: int, dp: int, sequence_parallel: bool = False) -> Parallel:
    """Create the groups (collective: every rank must call it) and remember them for the model."""
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
    return _STATE


def current() -> Parallel:
    if _STATE is None:
        raise RuntimeError("tuner.runners.harness.topology.build() must run before the model is built")
    return _STATE
