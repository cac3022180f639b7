"""GPU memory of NCCL communicators outside PyTorch's caching allocator (issue 30 item 3).

A process group of more than one rank holds an NCCL communicator whose FIFO buffers NCCL allocates itself
(cudaMalloc / cuMem), so no runner's max_memory_allocated -- a measured peak -- counts them. Per channel and
peer connection NCCL keeps one buffer per protocol: Simple NCCL_BUFFSIZE = 4 MiB, LL128 120 x 640 x 8 steps x
8 bytes = 4.7 MiB, LL 8 x 512 x 8 x 16 bytes = 0.5 MiB (NVIDIA/nccl @ 5067397c src/init.cc DEFAULT_BUFFSIZE,
DEFAULT_LL128_BUFFSIZE, DEFAULT_LL_BUFFSIZE; src/include/device.h NCCL_STEPS, NCCL_LL*_); the memory grows
linearly with the channels, a ring holds two connections at any scale and it stops growing beyond two nodes
(NVIDIA/nccl#986, the maintainer's answer to #864). Measured through PyTorch on 4 A100s with NVLink, one
all-reduce per group: 544 MB for a group of two GPUs, 688 MB for a group of more (NVIDIA/nccl#964). H100 and
later run more channels (more memory), so these are the lower figures; a one-rank group connects no peer.

The model's fixed reserve (cluster memory_reserved_gb) holds the communicators of the layout a run launches;
what this module states is the difference a layout's data-parallel group makes against a measured twin of the
same layout at another dp (tuner.best.supported_fit): the communicator a group of one rank gains at two, and
the one it grows by beyond two.
"""

from __future__ import annotations

#: GB of one NCCL communicator's buffers by its number of ranks: 1 rank none, 2 ranks, more (NVIDIA/nccl#964)
COMM_GB_TWO_RANKS = 0.544
COMM_GB_MORE_RANKS = 0.688


def communicator_gb(ranks: int) -> float:
    """GB of NCCL buffers one communicator of `ranks` ranks holds on each of its GPUs (NVIDIA/nccl#964)."""
    if ranks <= 1:
        return 0.0
    return COMM_GB_TWO_RANKS if ranks == 2 else COMM_GB_MORE_RANKS


def new_dp_group_gb(twin_dp: int, dp: int) -> float:
    """What a layout's data-parallel communicator adds on a GPU at `dp` over the same layout at `twin_dp`."""
    return communicator_gb(dp) - communicator_gb(twin_dp)
