"""An OOM's PyTorch sentence reaches the stored message from every runner (task F of the OOM-message work, cceee66):
the command runner read only its stderr's 2000-byte tail and the first error line of its last 20 kB, without the
launchers' line prefixes; the Slurm runner only its log's last 8 lines; a result file's message was cut to its tail.
A real OOM's sentence is followed by other ranks' tracebacks, NCCL's watchdog and torchrun's summary.

Real text, as users posted it:
- QwenLM/Qwen3-Coder#174: "2024-11-20 14:37:16 [rank3]: torch.OutOfMemoryError: ..." (torchrun 2.2+'s rank prefix
  after the user's timestamp; NVML names a process, but not as this one: a container's PID namespace).
- huggingface/accelerate#1519: "[gpu187:1]:torch.cuda.OutOfMemoryError: ..." (accelerate's host:rank prefix,
  PyTorch before 2.1).
- hiyouga/LlamaFactory#6269: "[rank0]:[E1206 ...ProcessGroupNCCL.cpp:607] [Rank 0] Watchdog caught collective ..."
- hiyouga/LlamaFactory#6827: torchrun's "ChildFailedError" summary ("Root Cause (first observed failure)").
The "[default0]:" (torchrun --tee with the role 'default') and srun --label "0: " prefixes are put on the
Qwen3-Coder line the way those launchers write them."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.test_runners import spec
from tuner.runners.command import CommandRunner, oom_lines, root_cause
from tuner.runners.slurm_jobs import Job
from tuner.runners.slurm_results import job_result
from tuner.trial import Status, oom_capacity_gb

QWEN = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 132.00 MiB. GPU 3 has a total capacity of "
        "79.10 GiB of which 98.00 MiB is free. Process 387746 has 78.89 GiB memory in use. Of the allocated memory "
        "70.12 GiB is allocated by PyTorch, and 765.81 MiB is reserved by PyTorch but unallocated. If reserved but "
        "unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid "
        "fragmentation.  See documentation for Memory Management  "
        "(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)")
ACCELERATE = ("torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 3.00 GiB (GPU 1; 79.35 GiB total "
              "capacity; 33.66 GiB already allocated; 735.69 MiB free; 34.89 GiB reserved in total by PyTorch) If "
              "reserved memory is >> allocated memory try setting max_split_size_mb to avoid fragmentation.  See "
              "documentation for Memory Management and PYTORCH_CUDA_ALLOC_CONF")
WATCHDOG = ("[rank{r}]:[E1206 18:44:12.715298746 ProcessGroupNCCL.cpp:607] [Rank {r}] Watchdog caught collective "
            "operation timeout: WorkNCCL(SeqNum=7753, OpType=_REDUCE_SCATTER_BASE, NumelIn=544997376, "
            "NumelOut=68124672, Timeout(ms)=600000) ran for 600061 milliseconds before timing out.")
SUMMARY = """torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
/packages/LLaMA-Factory/src/llamafactory/launcher.py FAILED
------------------------------------------------------------
Failures:
  <NO_OTHER_FAILURES>
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2025-02-05_01:02:51
  host      : localhost.com
  rank      : 0 (local_rank: 0)
  exitcode  : 1 (pid: 907695)
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
============================================================
"""
RESERVE = 3.0


def crash_log(oom_line: str, after_bytes: int = 25_000) -> str:
    """A rank's OOM, then other ranks' tracebacks and NCCL's watchdog for `after_bytes`, then torchrun's summary."""
    frames = "".join(f"[rank{r}]:   File \"/opt/megatron/core/pipeline_parallel/schedules.py\", line {400 + r}, "
                     f"in forward_step\n[rank{r}]:     output_tensor = model(*inputs)\n" for r in range(8))
    rest = ""
    while len(rest) < after_bytes:
        rest += frames + "".join(WATCHDOG.format(r=r) + "\n" for r in range(8))
    return "[rank3]: Traceback (most recent call last):\n" + oom_line + "\n" + rest + SUMMARY


def test_launchers_prefixes_are_dropped_from_the_first_error_line():
    said = oom_capacity_gb(QWEN, RESERVE)
    for prefix in ("2024-11-20 14:37:16 [rank3]: ", "[rank3]: ", "[default0]:", "0: ", "worker-1: "):
        cause = root_cause("[rank3]:   File \"train.py\", line 5\n" + prefix + QWEN + "\n", None)
        assert cause == QWEN and oom_capacity_gb(cause, RESERVE) == said, prefix
    assert root_cause("[gpu187:1]:" + ACCELERATE) == ACCELERATE[:500]
    assert root_cause("RuntimeError: CUDA error: out of memory") == "RuntimeError: CUDA error: out of memory"
    assert root_cause(SUMMARY) == ""                       # the launcher's summary is not the cause


def test_the_command_runner_keeps_the_sentence_of_an_oom_far_before_the_end(tmp_path):
    log = crash_log("2024-11-20 14:37:16 [rank3]: " + QWEN)
    assert len(log) - log.index(QWEN) > 20_000           # out of both tails the runner read
    src = tmp_path / "stderr.txt"
    src.write_text(log)
    script = f"import sys; sys.stderr.write(open({str(src)!r}).read()); sys.exit(1)"
    r = CommandRunner([sys.executable, "-c", script], results_dir=tmp_path / "results").run(spec(number=1))
    assert r.status == Status.OOM, r.message[:300]
    assert len(r.message) <= 2000 and oom_capacity_gb(r.message, RESERVE) == oom_capacity_gb(QWEN, RESERVE)
    assert oom_lines(src) == (QWEN, QWEN)


def test_an_oom_result_keeps_the_sentence_from_its_message_or_its_stderr(tmp_path):
    long = QWEN + " | " + "x" * 3000                      # a result's message longer than what is kept
    script = ("import json, os, sys; sys.stderr.write(sys.argv[2]); "
              "open(os.environ['TUNER_RESULT_JSON'], 'w').write(sys.argv[1])")
    cmd = CommandRunner([sys.executable, "-c", script, json.dumps({"status": "oom", "message": long}), ""],
                        results_dir=tmp_path / "a")
    r = cmd.run(spec(number=2))
    assert r.status == Status.OOM and len(r.message) <= 2000
    assert oom_capacity_gb(r.message, RESERVE) == oom_capacity_gb(QWEN, RESERVE)
    bare = CommandRunner([sys.executable, "-c", script, json.dumps({"status": "oom"}), crash_log("[rank3]: " + QWEN)],
                         results_dir=tmp_path / "b")
    r = bare.run(spec(number=3))
    assert r.status == Status.OOM and oom_capacity_gb(r.message, RESERVE) == oom_capacity_gb(QWEN, RESERVE)


@pytest.mark.parametrize("template", ["harness", "megatron"])
def test_the_slurm_runner_keeps_the_sentence_its_log_printed_before_the_summary(tmp_path, template):
    job = Job(job_id="77", trial_dir=tmp_path, state="FAILED")
    (tmp_path / "slurm-77.out").write_text(crash_log("0: " + QWEN, after_bytes=5_000))
    r = job_result(spec(number=4), job, template=template, trial_timeout=None, warmup=1, peak_tflops=383.0)
    assert r.status == Status.OOM and oom_capacity_gb(r.message, RESERVE) == oom_capacity_gb(QWEN, RESERVE)
    job = Job(job_id="78", trial_dir=tmp_path, state="OUT_OF_MEMORY")
    (tmp_path / "slurm-78.out").write_text(crash_log("[gpu187:1]:" + ACCELERATE, after_bytes=5_000))
    r = job_result(spec(number=5), job, template=template, trial_timeout=None, warmup=1, peak_tflops=383.0)
    assert r.status == Status.OOM and oom_capacity_gb(r.message, RESERVE) == oom_capacity_gb(ACCELERATE, RESERVE)


def test_a_log_without_an_oom_stays_a_failure(tmp_path):
    src = tmp_path / "stderr.txt"
    src.write_text("".join(WATCHDOG.format(r=r) + "\n" for r in range(8)) + SUMMARY)
    assert oom_lines(src) == (None, None) and oom_lines(tmp_path / "missing") == (None, None)
    job = Job(job_id="79", trial_dir=tmp_path, state="FAILED")
    Path(tmp_path / "slurm-79.out").write_text(src.read_text())
    r = job_result(spec(number=6), job, template="harness", trial_timeout=None, warmup=1, peak_tflops=383.0)
    assert r.status == Status.FAILED


def test_a_trial_killed_at_its_timeout_after_a_rank_ran_out_is_an_oom(tmp_path):
    # srun starts one process per rank and does not stop the others when one fails (no --kill-on-bad-exit): they
    # wait on the OOM'd rank in a collective until NCCL's timeout, longer than the trial's
    log = "[rank3]: " + QWEN + "\n" + "".join(WATCHDOG.format(r=r) + "\n" for r in range(8))
    script = f"import sys, time; sys.stderr.write({log!r}); sys.stderr.flush(); time.sleep(30)"
    r = CommandRunner([sys.executable, "-c", script], trial_timeout=0.6, kill_grace=0.2, poll_interval=0.05,
                      results_dir=tmp_path / "results").run(spec(number=7))
    assert r.status == Status.OOM and oom_capacity_gb(r.message, RESERVE) == oom_capacity_gb(QWEN, RESERVE)
    job = Job(job_id="80", trial_dir=tmp_path, state="CANCELLED", reason="timeout")
    (tmp_path / "slurm-80.out").write_text(log)
    r = job_result(spec(number=8), job, template="megatron", trial_timeout=600, warmup=1, peak_tflops=383.0)
    assert r.status == Status.OOM and oom_capacity_gb(r.message, RESERVE) == oom_capacity_gb(QWEN, RESERVE)
    (tmp_path / "slurm-80.out").write_text("".join(WATCHDOG.format(r=r) + "\n" for r in range(8)))
    (tmp_path / "result.json").write_text(json.dumps({"status": "oom", "message": "OutOfMemoryError: " + QWEN}))
    r = job_result(spec(number=8), job, template="harness", trial_timeout=600, warmup=1, peak_tflops=383.0)
    assert r.status == Status.OOM and "--trial-timeout" in r.message and oom_capacity_gb(r.message, RESERVE)
    (tmp_path / "result.json").unlink()
    r = job_result(spec(number=8), job, template="harness", trial_timeout=600, warmup=1, peak_tflops=383.0)
    assert r.status == Status.TIMEOUT                       # no OOM anywhere: the layout was just slow
