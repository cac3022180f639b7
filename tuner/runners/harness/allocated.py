"""A CPU rank's peak of tensor bytes: what `torch.cuda.max_memory_allocated` is on a GPU, read on CPU ranks.

PyTorch's CPU allocator keeps no peak counter; its profiler does see every tensor allocation and free of the thread
that profiles, with the bytes allocated at that moment (`profile_memory=True`: the events' `total_allocated`). That
count is the allocator's, process-wide and kept across profiler sessions: it adds what is allocated, and subtracts
what is freed, only while a profiler records memory on the allocating thread, so a second session in one process
starts from what the first left (a 40 MB tensor allocated in one session and freed after it is still counted in the
next: torch 2.13). The harness starts one session per process, before the model is built, and stops it after the
first step -- the engine's optimizer states, the first step's activations, gradients and optimizer-step copies -- so
the timed steps run unprofiled; at ZeRO 3 the first step is DeepSpeed's trace step (no prefetch, every gathered
parameter released at once: partitioned_param_coordinator.py), so later steps' larger working set is not in it.
Tensors allocated on threads the profiler does not follow are not counted (a 200 MB tensor made on a Python
`threading.Thread` while it runs: 0); the harness makes none (the autograd engine runs a CPU backward on the calling
thread; gloo's temporaries were counted: a 2-rank all_reduce, all_gather_into_tensor and reduce_scatter_tensor of
100 MB fp32 read 0.50 GB against the 0.35 GB of tensors made). Allocations made before the start (the process
group's) are not counted, as a GPU's allocator never counts the host's. The process's resident set
(RSS: interpreter, libraries, glibc's cached pages) is what the trial reported before; it stays in the result as
`host_rss_gb`.
"""

from __future__ import annotations

import resource


class CpuAllocated:
    """Start (`start`) and stop (`stop_gb`: the peak in GB of 1e9 bytes) the profiler that counts tensor bytes."""

    def __init__(self) -> None:
        self._prof = None

    def start(self) -> None:
        from torch.profiler import ProfilerActivity, profile
        self._prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
        self._prof.__enter__()

    def stop_gb(self) -> float | None:
        """The peak of tensor bytes allocated while profiled, in GB; None when it was never started."""
        if self._prof is None:
            return None
        prof, self._prof = self._prof, None
        prof.__exit__(None, None, None)
        return peak_allocated(prof.profiler.kineto_results.experimental_event_tree()) / 1e9


def peak_allocated(roots) -> int:
    """The largest `total_allocated` of the allocation events under the profiler's event tree `roots` (bytes)."""
    from torch._C._profiler import _EventType
    peak, stack = 0, list(roots)
    while stack:
        node = stack.pop()
        if node.tag == _EventType.Allocation:
            peak = max(peak, int(node.extra_fields.total_allocated))
        stack.extend(node.children)
    return peak


def host_rss_gb() -> float:
    """The process's peak resident set (ru_maxrss, KiB) in GB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9
