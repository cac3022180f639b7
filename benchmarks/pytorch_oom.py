"""PyTorch's out-of-memory message, as the benchmark worlds' runners print it (benchmarks/worlds_ext/world.py,
benchmarks/indep_worlds.py): a real run's OOM says what its process had on the GPU, and tuner reads that
(tuner.trial.oom_capacity_gb); it says nothing more of the run's need."""

from __future__ import annotations

import hashlib

GIB = 2.0 ** 30 / 1e9      # GB per GiB


def oom_message(total_gb: float, usable_gb: float, need_gb: float, outside_gb: float, key: str,
                rocm: bool = False) -> str:
    """PyTorch's message (c10/cuda/CUDACachingAllocator.cpp, since 2.1; HIP on ROCm) of a run that needed `need_gb`
    on a GPU of `total_gb` whose process has `usable_gb` of it: it fails on the allocation that crosses it, with a
    sliver (< 0.5 %, drawn from `key`) of that share still free; `outside_gb` of the process's use is not PyTorch's
    (context, communicator buffers)."""
    digest = hashlib.sha256(key.encode()).digest()
    free = usable_gb * 0.005 * int.from_bytes(digest[:8], "little") / 2.0 ** 64
    in_use = usable_gb - free
    tried = free + min(need_gb - usable_gb, 1.0)          # the allocation that crosses: one tensor, at most a GB more
    unallocated = 0.05 * (in_use - outside_gb)
    api = "HIP" if rocm else "CUDA"
    return (f"torch.OutOfMemoryError: {api} out of memory. Tried to allocate {tried / GIB:.2f} GiB. "
            f"GPU 0 has a total capacity of {total_gb / GIB:.2f} GiB of which {free / GIB * 1024:.2f} "
            f"MiB is free. Including non-PyTorch memory, this process has {in_use / GIB:.2f} GiB memory in use. "
            f"Of the allocated memory {(in_use - outside_gb - unallocated) / GIB:.2f} GiB is allocated by PyTorch, "
            f"and {unallocated / GIB:.2f} GiB is reserved by PyTorch but unallocated.")
