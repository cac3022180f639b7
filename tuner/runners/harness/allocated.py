"""A CPU rank's peak of tensor bytes: what `torch.cuda.max_memory_allocated` is on a GPU, read on CPU ranks.

PyTorch's CPU allocator keeps no peak counter; its profiler does see every tensor allocation and free of the thread
that profiles, with the bytes allocated at that moment (`profile_memory=True`: the events' `total_allocated`, counted
from the profiler's start). The harness starts it before the model is built and stops it after the first step -- the
engine's optimizer states, the first step's activations, gradients and optimizer-step copies -- so every tensor of
the trial is in the count and the timed steps run unprofiled. The bytes of other threads (none of the harness's
tensors: the autograd engine runs a CPU backward on the calling thread) and of allocations made before the start
(the process group's) are not counted, as a GPU's allocator never counts the host's. The process's resident set
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
