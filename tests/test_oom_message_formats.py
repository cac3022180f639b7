"""PyTorch's out-of-memory message in the forms real runs print it (c10/cuda/CUDACachingAllocator.cpp): the list
of processes NVML gives in any order (this one after another, or not named at all inside a container's PID
namespace), a per-process memory fraction's "X allowed;" and CUDA / HIP graphs' private pools -- each must still
say the memory the process had (tuner.trial.oom_capacity_gb); before, none of these was read at all."""

from __future__ import annotations

import pytest

from tuner.trial import Status, failed, oom_capacity_gb

GIB = 2 ** 30 / 1e9
MIB = 2 ** 20 / 1e9
TAIL = (" If reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True "
        "to avoid fragmentation.")


def test_this_process_listed_before_another_one():
    # NVML's order: this process first, then another on the same GPU (a stale rank of an earlier trial)
    msg = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 MiB. GPU 0 has a total capacity of "
           "79.25 GiB of which 960.00 KiB is free. Including non-PyTorch memory, this process has 70.00 GiB memory in "
           "use. Process 99 has 9.24 GiB memory in use. Of the allocated memory 67.18 GiB is allocated by PyTorch, and "
           "1.55 GiB is reserved by PyTorch but unallocated." + TAIL)
    assert oom_capacity_gb(msg, 3.0) == pytest.approx(70.00 * GIB + 960 * 2 ** 10 / 1e9)


def test_a_container_names_no_process_as_this_one():
    # chatdoc-com/OCRFlux#42 (with CUDA graphs' private pools) and davefojtik/RunPod-Fooocus-API#42: NVML's pids are
    # the host's, so no line says "this process": the allocator's reserved bytes + the reserve + free stand for it
    ocrflux = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of "
               "39.39 GiB of which 9.25 MiB is free. Process 25454 has 3.86 GiB memory in use. Process 104554 has 4.29 "
               "GiB memory in use. Process 30427 has 31.20 GiB memory in use. Of the allocated memory 30.21 GiB is "
               "allocated by PyTorch, with 26.00 MiB allocated in private pools (e.g., CUDA Graphs), and 217.48 MiB is "
               "reserved by PyTorch but unallocated." + TAIL)
    assert oom_capacity_gb(ocrflux, 3.0) == pytest.approx(30.21 * GIB + 217.48 * MIB + 3.0 + 9.25 * MIB)
    runpod = ("CUDA out of memory. Tried to allocate 2.00 MiB. GPU 0 has a total capacity of 79.25 GiB of which "
              "960.00 KiB is free. Process 1074130 has 79.24 GiB memory in use. Of the allocated memory 77.18 GiB is "
              "allocated by PyTorch, and 1.55 GiB is reserved by PyTorch but unallocated.")
    assert oom_capacity_gb(runpod, 3.0) == pytest.approx(79.25 * GIB)        # never more than the GPU's total


def test_a_memory_fraction_caps_what_the_process_had():
    # ROCm/TheRock#2118 (PyTorch 2.9 on ROCm: no process line, "allowed", HIP graphs' pools)
    hip = ("torch.OutOfMemoryError: HIP out of memory. Tried to allocate 2.00 MiB. GPU 0 has a total capacity of "
           "255.98 GiB of which 244.65 GiB is free. 1.05 GiB allowed; Of the allocated memory 1017.01 MiB is allocated "
           "by PyTorch, with 17.00 MiB allocated in private pools (e.g., HIP Graphs), and 54.99 MiB is reserved by "
           "PyTorch but unallocated." + TAIL)
    assert oom_capacity_gb(hip, 3.0) == pytest.approx(1.05 * GIB + 3.0)
    # with this process's line: the fraction plus what it held outside PyTorch (in use - reserved)
    nvml = ("CUDA out of memory. Tried to allocate 2.00 MiB. GPU 0 has a total capacity of 79.25 GiB of which 40.00 "
            "GiB is free. Including non-PyTorch memory, this process has 39.00 GiB memory in use. 38.00 GiB allowed; "
            "Of the allocated memory 37.00 GiB is allocated by PyTorch, and 0.50 GiB is reserved by PyTorch but "
            "unallocated.")
    assert oom_capacity_gb(nvml, 3.0) == pytest.approx((38.00 + 39.00 - 37.50) * GIB)
    # before 2.1 (pytorch/pytorch#111729): "allowed" before the reserved bytes
    old = ("RuntimeError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 11.76 GiB total capacity; 4.70 GiB "
           "already allocated; 6.50 GiB free; 4.77 GiB allowed; 4.74 GiB reserved in total by PyTorch)")
    assert oom_capacity_gb(old, 3.0) == pytest.approx(4.77 * GIB + 3.0)


def test_a_failed_result_keeps_a_sentence_with_a_process_list():
    msg = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of "
           "39.39 GiB of which 9.25 MiB is free. Process 25454 has 3.86 GiB memory in use. Process 30427 has 31.20 GiB "
           "memory in use. Of the allocated memory 30.21 GiB is allocated by PyTorch, and 217.48 MiB is reserved by "
           "PyTorch but unallocated.")
    log = "Traceback ...\n" + msg + "\n" + "torchrun: ChildFailedError, root cause rank 3 ...\n" * 80
    r = failed(log, Status.OOM)
    assert len(r.message) <= 2000 and oom_capacity_gb(r.message, 3.0) == oom_capacity_gb(msg, 3.0) is not None
