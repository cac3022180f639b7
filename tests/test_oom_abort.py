"""A rank that runs out of device memory inside C++ aborts without a Python traceback (reliability task D, item 1):
c10's CUDA / HIP check throws a c10::Error nobody catches ("terminate called after throwing an instance of
'c10::Error'  what():  CUDA error: out of memory"), or NCCL's watchdog rethrows the sticky CUDA error ("Process group
watchdog thread terminated with exception: CUDA error: out of memory"). It writes no result; the other ranks'
DistBackendError and torchrun's ChildFailedError summary are printed after it, so the tail shows no OOM, and the trial
was stored `failed`. It is the layout's OOM -- without a figure for the usable capacity (no "total capacity" sentence).
"CUDA error: an illegal memory access was encountered" and "unspecified launch failure" stay failures.

Real text, as users posted it:
- rwth-i6/returnn#1482 (PyTorch 2.1, 4 GPUs, CUDA OOM under DDP): "terminate called after throwing an instance of
  'c10::Error'\\n  what():  CUDA error: out of memory\\nCUDA kernel errors might be asynchronously reported ...
  Exception raised from c10_cuda_check_implementation at ../c10/cuda/CUDAException.cpp:44".
- InternLM/lmdeploy#3258: "terminate called after throwing an instance of 'c10::DistBackendError'\\n  what():  [PG ID
  0 PG GUID 0(default_pg) Rank 2] Process group watchdog thread terminated with exception: CUDA error: an illegal
  memory access was encountered" and InternLM/lmdeploy#3048 "[rank0]:[E117 11:40:54.259889664
  ProcessGroupNCCL.cpp:1595] [PG ID 0 PG GUID 0(default_pg) Rank 0] Process group watchdog thread terminated with
  exception: ..." -- the watchdog's text for any sticky CUDA error (cudaGetErrorString: "out of memory" for
  cudaErrorMemoryAllocation); hiyouga/LlamaFactory#8871 for "unspecified launch failure".
- huggingface/autotrain-advanced#737 (ROCm): "HIP kernel errors might be asynchronously reported ... For debugging
  consider passing AMD_SERIALIZE_KERNEL=3" after "RuntimeError: HIP error: ..." (hipGetErrorString(hipErrorOutOfMemory)
  is "out of memory")."""

from __future__ import annotations

import sys

import pytest

from tests.test_oom_runners import SUMMARY
from tests.test_runners import spec
from tuner.oom_evidence import said_capacities
from tuner.runners.command import CommandRunner, oom_lines
from tuner.runners.slurm_jobs import Job
from tuner.runners.slurm_results import job_result
from tuner.trial import Status, oom_capacity_gb

FRAMES = ("Exception raised from c10_cuda_check_implementation at ../c10/cuda/CUDAException.cpp:44 (most recent call "
          "first):\nframe #0: c10::Error::Error(c10::SourceLocation, std::string) + 0x57 (0x7fda36535617 in "
          "/opt/venv/lib/python3.11/site-packages/torch/lib/libc10.so)\n")
CUDA_HINT = ("CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below might "
             "be incorrect.\nFor debugging consider passing CUDA_LAUNCH_BLOCKING=1.\nCompile with `TORCH_USE_CUDA_DSA` "
             "to enable device-side assertions.\n\n")
HIP_HINT = ("HIP kernel errors might be asynchronously reported at some other API call, so the stacktrace below might be "
            "incorrect.\nFor debugging consider passing AMD_SERIALIZE_KERNEL=3\nCompile with `TORCH_USE_HIP_DSA` to "
            "enable device-side assertions.\n\n")
PG = "[PG ID 0 PG GUID 0(default_pg) Rank 3] Process group watchdog thread terminated with exception: "


def c10_abort(error: str, hint: str = CUDA_HINT) -> str:
    return f"terminate called after throwing an instance of 'c10::Error'\n  what():  {error}\n{hint}{FRAMES}"


def watchdog_abort(error: str) -> str:
    return (f"[rank3]:[E117 11:40:54.259889664 ProcessGroupNCCL.cpp:1595] {PG}{error}\n{CUDA_HINT}{FRAMES}"
            f"terminate called after throwing an instance of 'c10::DistBackendError'\n  what():  {PG}{error}\n"
            f"{CUDA_HINT}{FRAMES}")


def others_after(abort: str) -> str:
    """The aborted rank's text, then the other ranks' DistBackendError tracebacks and torchrun's summary (> 2 kB)."""
    rest = "".join(f"[rank{r}]: Traceback (most recent call last):\n[rank{r}]:   File \"/opt/megatron/core/"
                   f"pipeline_parallel/schedules.py\", line 40{r}, in forward_step\n[rank{r}]: torch.distributed."
                   f"DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:3356, remote "
                   f"process exited or there was a network error, NCCL version 2.21.5\n" for r in (0, 1, 2, 4, 5, 6, 7))
    return abort + rest * 3 + SUMMARY.replace("exitcode  : 1", "exitcode  : -6")


OOMS = {"c10": c10_abort("CUDA error: out of memory"), "watchdog": watchdog_abort("CUDA error: out of memory"),
        "hip": c10_abort("HIP error: out of memory", HIP_HINT)}
NOT_OOMS = {"illegal": watchdog_abort("CUDA error: an illegal memory access was encountered"),
            "launch": watchdog_abort("CUDA error: unspecified launch failure"),
            "hip-illegal": c10_abort("HIP error: an illegal memory access was encountered", HIP_HINT)}


def run_command(tmp_path, log: str, number: int):
    script = f"import sys; sys.stderr.write({log!r}); sys.exit(1)"
    return CommandRunner([sys.executable, "-c", script], results_dir=tmp_path / "r").run(spec(number=number))


def run_slurm(tmp_path, log: str, number: int, template: str = "harness"):
    job = Job(job_id=str(900 + number), trial_dir=tmp_path, state="FAILED")
    (tmp_path / f"slurm-{job.job_id}.out").write_text(log)
    return job_result(spec(number=number), job, template=template, trial_timeout=None, warmup=1, peak_tflops=383.0)


@pytest.mark.parametrize("kind", sorted(OOMS))
def test_a_cpp_abort_out_of_device_memory_is_an_oom_without_a_capacity(tmp_path, kind):
    log = others_after(OOMS[kind])
    assert "out of memory" not in log[-2000:]          # the tail the runner keeps says nothing of it
    said, first = oom_lines(_file(tmp_path, log), host=False)
    assert said is None and first and "error: out of memory" in first
    for r in (run_command(tmp_path, log, 1), run_slurm(tmp_path, log, 2)):
        assert r.status == Status.OOM, r.message[:300]
        assert "error: out of memory" in r.message and oom_capacity_gb(r.message, 3.0) is None
        assert said_capacities([_record(r)], spec().workload) == []     # says nothing of the usable capacity


@pytest.mark.parametrize("kind", sorted(NOT_OOMS))
def test_other_sticky_device_errors_stay_failures(tmp_path, kind):
    log = others_after(NOT_OOMS[kind])
    assert oom_lines(_file(tmp_path, log), host=False) == (None, None)
    assert run_command(tmp_path, log, 3).status == Status.FAILED
    assert run_slurm(tmp_path, log, 4).status == Status.FAILED


# The same error's text printed by code that caught it and went on (review of f7907d5): Inductor's max-autotune logs a
# candidate kernel's error and ignores that choice (the format of tests/test_oom_fatal.py's AUTOTUNE; str() of a c10
# CUDA error is its "CUDA error: ..." text and the hint), a script retries at a smaller batch. The run then failed of
# something else, or ran past its time limit: neither is the layout's OOM.
GLOG = "[rank0]:E1210 22:26:07.784000 1306684 torch/_inductor/select_algorithm.py:2691] [8/0] "
LOGGED = {"autotune": GLOG + "Runtime error during autotuning: \nCUDA error: out of memory\n" + CUDA_HINT
          + ". \nIgnoring this choice.\n",
          "retry": "[rank0]: CUDA error: out of memory, retrying with smaller batch\n"}
ITERATIONS = "".join(f"[rank0]: iteration {i:>6}/  500000 | elapsed time per iteration (ms): 2841.3 |\n" for i in range(1, 40))


@pytest.mark.parametrize("kind", sorted(LOGGED))
def test_an_abort_text_a_run_printed_and_went_on_from_is_not_its_failure(tmp_path, kind):
    log = LOGGED[kind] + ITERATIONS + "[rank0]: ValueError: the data loader ran out of samples\n"
    assert oom_lines(_file(tmp_path, log), host=False) == (None, None)
    r = run_command(tmp_path, log, 5)
    assert r.status == Status.FAILED and "ValueError: the data loader" in r.message, r.message[:300]
    assert run_slurm(tmp_path, log, 6).status == Status.FAILED
    job = Job(job_id="907", trial_dir=tmp_path, state="CANCELLED", reason="timeout")
    (tmp_path / "slurm-907.out").write_text(LOGGED[kind] + ITERATIONS)
    r = job_result(spec(number=7), job, template="harness", trial_timeout=600, warmup=1, peak_tflops=383.0)
    assert r.status == Status.TIMEOUT, r.message[:300]


def _file(tmp_path, text: str):
    path = tmp_path / "log.txt"
    path.write_text(text)
    return path


def _record(result):
    from types import SimpleNamespace
    return SimpleNamespace(status=result.status, message=result.message, cluster="test", study="s", runner="command")
