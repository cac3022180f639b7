"""The megatron Slurm template reads its job's log by blocks (reliability task D, item 4): slurm_results read the whole
log into memory (read_text) to parse Megatron's iteration lines, and for a failed job scanned that text again for an
OOM -- a job's log can be GBs (NCCL_DEBUG=INFO, a progress bar). It now keeps only the lines it parses (iterations,
memory reports) and the out-of-memory lines, read a block at a time as tuner.runners.failure_log does for every log."""

from __future__ import annotations

import tracemalloc

from tests.test_oom_runners import QWEN, SUMMARY
from tests.test_runners import FIXTURES, spec
from tuner.runners import megatron
from tuner.runners.slurm_jobs import Job
from tuner.runners.slurm_results import job_result
from tuner.trial import Status, oom_capacity_gb

NOISE_MB = 48
NCCL = "frontier00042:81234:81502 [3] NCCL INFO Channel 07/0 : 3[3] -> 4[4] via P2P/IPC comm 0x9f1c0 nRanks 8\n"
MEGATRON = (FIXTURES / "megatron_log.txt").read_text()


def write_log(path, head: str, tail: str) -> None:
    block = NCCL * ((1 << 20) // len(NCCL) + 1)
    with open(path, "w") as f:
        f.write(head)
        for _ in range(NOISE_MB):
            f.write(block[:1 << 20])
        f.write(tail)


def peak_mb(fn):
    tracemalloc.start()
    try:
        out = fn()
        return out, tracemalloc.get_traced_memory()[1] / 2 ** 20
    finally:
        tracemalloc.stop()


def test_a_failed_megatron_job_is_read_by_blocks(tmp_path):
    first = MEGATRON[:MEGATRON.index(" iteration        2/")]     # the warm-up iteration only
    write_log(tmp_path / "slurm-71.out", first, "[rank3]: " + QWEN + "\n" + SUMMARY)
    job = Job(job_id="71", trial_dir=tmp_path, state="FAILED")
    r, peak = peak_mb(lambda: job_result(spec(number=1), job, template="megatron", trial_timeout=None, warmup=1,
                                         peak_tflops=383.0))
    assert r.status == Status.OOM and oom_capacity_gb(r.message, 3.0) == oom_capacity_gb(QWEN, 3.0)
    assert peak < 24, f"{peak:.0f} MB held for a {NOISE_MB} MB log"


def test_a_finished_megatron_job_parses_the_same_from_blocks(tmp_path):
    cut = MEGATRON.index(" iteration        5/")
    write_log(tmp_path / "slurm-72.out", MEGATRON[:cut], MEGATRON[cut:])
    job = Job(job_id="72", trial_dir=tmp_path, state="COMPLETED")
    r, peak = peak_mb(lambda: job_result(spec(number=2), job, template="megatron", trial_timeout=None, warmup=1,
                                         peak_tflops=383.0))
    want = megatron.parse_log(MEGATRON, spec().workload.model, spec().workload.gpus, recompute=False,
                              global_batch=spec().workload.global_batch, warmup=1)
    assert r.status == Status.OK and r.samples_per_second == want.samples_per_second
    assert r.peak_memory_gb == want.peak_memory_gb and r.peak_reserved_gb == want.peak_reserved_gb
    assert f"median of {want.iterations} iterations" in r.message
    assert peak < 24, f"{peak:.0f} MB held for a {NOISE_MB} MB log"
