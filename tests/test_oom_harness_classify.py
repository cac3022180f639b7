"""The bundled harness's rank writes `oom` only for its device's memory (review of the OOM work, task I): NCCL's
ncclSystemError -- a system or library call NCCL made failed -- whose last error is the host's ENOMEM was `oom`
(tuner.trial.looks_oom matches "Cannot allocate memory"), so an RDMA set-up failure (the locked-memory limit) was
stored as the layout's OOM and never retried. Texts: PyTorch's DistBackendError as vllm-project/vllm#14537 and
NVIDIA/nccl#1410 quote it ("NCCL error in: ..., unhandled system error ... ncclSystemError: System call (e.g. socket,
malloc) or external library call failed or device error. \\nLast error:\\n..."), the last error as NCCL WARNs it in
deepseek-ai/DeepEP#143 ("Call to ibv_create_cq failed with error Cannot allocate memory")."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from tuner.runners.harness.train import classify  # noqa: E402

SYSTEM = ("NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp:317, unhandled system error (run with NCCL_DEBUG=INFO "
          "for details), NCCL version 2.21.5\nncclSystemError: System call (e.g. socket, malloc) or external library call "
          "failed or device error. \nLast error:\nCall to ibv_create_cq failed with error Cannot allocate memory")
CUDA = ("NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp:275, unhandled cuda error (run with NCCL_DEBUG=INFO "
        "for details), NCCL version 2.20.5\nncclUnhandledCudaError: Call to CUDA function failed.\nLast error:\n"
        "Cuda failure 2 'out of memory'")


def test_nccls_host_enomem_is_a_failure_and_its_cuda_oom_an_oom():
    backend_error = getattr(torch.distributed, "DistBackendError", RuntimeError)
    assert classify(backend_error(SYSTEM)) == "failed"
    assert classify(backend_error(CUDA)) == "oom"
    assert classify(OSError(12, "Cannot allocate memory")) == "oom"      # the CPU harness's address-space cap: as before


@pytest.mark.parametrize("text", ["error return without exception set",
                                  "<function _find_and_load at 0x7f490da37ce0> returned NULL without setting an exception"])
def test_a_lost_exception_under_the_address_space_cap_is_an_oom(monkeypatch, text):
    """A CI run of the CPU harness's OOM trial (TUNER_MEMORY_LIMIT_GB's address-space cap) failed in an import with
    CPython's second wording of a C function that returned NULL without an exception; it was stored as `failed`.
    Under the cap both wordings are the rank running out of memory; without it, a failure."""
    import resource
    monkeypatch.setattr(resource, "getrlimit", lambda which: (2 << 30, resource.RLIM_INFINITY))
    assert classify(SystemError(text)) == "oom"
    monkeypatch.setattr(resource, "getrlimit", lambda which: (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    assert classify(SystemError(text)) == "failed"
