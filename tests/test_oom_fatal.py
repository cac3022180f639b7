"""An out-of-memory sentence that was logged, not raised, does not make a trial an OOM (review of 7682d74 / 2bb2e33):
since those commits the runners read the whole stderr / Slurm log, and any PyTorch out-of-memory sentence anywhere in
it made a crash, or a run killed at its --trial-timeout, an `oom`. Inductor's max-autotune catches the OOM of a
candidate kernel, logs it and ignores that choice (torch/_inductor/select_algorithm.py, "Runtime error during
autotuning: ... Ignoring this choice.", the log format as pytorch/pytorch#170130 shows it -- there for a misaligned
address, here for an OOM, which the same `except RuntimeError` catches: torch.OutOfMemoryError is a RuntimeError);
the run goes on. What says the run failed of it is an out-of-memory error line (as Python prints an exception it
raised); a logged sentence still gives the figure where such a line, or the tail, says OOM."""

from __future__ import annotations

import sys

from tests.test_oom_runners import QWEN, WATCHDOG
from tests.test_runners import spec
from tuner.runners.command import CommandRunner, oom_lines
from tuner.runners.slurm_jobs import Job
from tuner.runners.slurm_results import job_result
from tuner.trial import Status, oom_capacity_gb

SENTENCE = QWEN[len("torch.OutOfMemoryError: "):QWEN.index(" If reserved")]
GLOG = "[rank0]:E1210 22:26:07.784000 1306684 .venv/lib/python3.12/site-packages/torch/_inductor/select_algorithm.py:2691] [8/0] "
AUTOTUNE = "".join(GLOG + line + "\n" for line in ("Runtime error during autotuning:", SENTENCE, "Ignoring this choice."))
ITERATIONS = "".join(f"[rank0]: iteration {i:>6}/  500000 | elapsed time per iteration (ms): 2841.3 | lm loss: 7.3E+00 |\n"
                     for i in range(1, 60))
RESERVE = 3.0


def test_an_oom_the_autotuner_logged_and_ignored_is_not_the_failure(tmp_path):
    log = AUTOTUNE + ITERATIONS + "[rank0]: ValueError: the data loader ran out of samples\n"
    assert oom_lines_of(tmp_path, log) == (SENTENCE, None)
    script = f"import sys; sys.stderr.write({log!r}); sys.exit(1)"
    r = CommandRunner([sys.executable, "-c", script], results_dir=tmp_path / "a").run(spec(number=1))
    assert r.status == Status.FAILED and "ValueError: the data loader" in r.message, r.message[:300]
    job = Job(job_id="81", trial_dir=tmp_path, state="FAILED")
    (tmp_path / "slurm-81.out").write_text(log)
    r = job_result(spec(number=2), job, template="harness", trial_timeout=None, warmup=1, peak_tflops=383.0)
    assert r.status == Status.FAILED


def test_a_slow_run_that_logged_an_ignored_oom_times_out(tmp_path):
    log = AUTOTUNE + ITERATIONS
    script = f"import sys, time; sys.stderr.write({log!r}); sys.stderr.flush(); time.sleep(30)"
    r = CommandRunner([sys.executable, "-c", script], trial_timeout=0.6, kill_grace=0.2, poll_interval=0.05,
                      results_dir=tmp_path / "a").run(spec(number=3))
    assert r.status == Status.TIMEOUT, r.message[:300]
    job = Job(job_id="82", trial_dir=tmp_path, state="CANCELLED", reason="timeout")
    (tmp_path / "slurm-82.out").write_text(log)
    r = job_result(spec(number=4), job, template="harness", trial_timeout=600, warmup=1, peak_tflops=383.0)
    assert r.status == Status.TIMEOUT


def test_a_raised_oom_behind_any_prefix_is_still_one(tmp_path):
    # Open MPI's mpirun --tag-output puts "[jobid,rank]<stderr>:" before each line: no launcher prefix tuner knows
    log = "[1,3]<stderr>:" + QWEN + "\n" + "".join(WATCHDOG.format(r=r) + "\n" for r in range(8)) * 40
    assert oom_lines_of(tmp_path, log) == (QWEN, QWEN)
    script = f"import sys; sys.stderr.write({log!r}); sys.exit(1)"
    r = CommandRunner([sys.executable, "-c", script], results_dir=tmp_path / "a").run(spec(number=5))
    assert r.status == Status.OOM and oom_capacity_gb(r.message, RESERVE) == oom_capacity_gb(QWEN, RESERVE)
    # a logged sentence gives its figure where the run did fail of an OOM (the tail says so)
    log = AUTOTUNE + "RuntimeError: CUDA error: out of memory\n"
    script = f"import sys; sys.stderr.write({log!r}); sys.exit(1)"
    r = CommandRunner([sys.executable, "-c", script], results_dir=tmp_path / "b").run(spec(number=6))
    assert r.status == Status.OOM and oom_capacity_gb(r.message, RESERVE) == oom_capacity_gb(QWEN, RESERVE)


def oom_lines_of(tmp_path, text: str):
    path = tmp_path / "stderr.txt"
    path.write_text(text)
    return oom_lines(path)


def test_a_job_at_slurms_own_time_limit_after_a_rank_ran_out_is_an_oom(tmp_path):
    # the cluster file's time_limit (sbatch --time) ends the job the other ranks kept waiting in a collective, as the
    # runner's --trial-timeout does (2bb2e33 read the log for the latter only)
    log = "[rank3]: " + QWEN + "\n" + "".join(WATCHDOG.format(r=r) + "\n" for r in range(8))
    job = Job(job_id="83", trial_dir=tmp_path, state="TIMEOUT")
    (tmp_path / "slurm-83.out").write_text(log)
    r = job_result(spec(number=7), job, template="harness", trial_timeout=None, warmup=1, peak_tflops=383.0)
    assert r.status == Status.OOM and oom_capacity_gb(r.message, RESERVE) == oom_capacity_gb(QWEN, RESERVE)
    (tmp_path / "slurm-83.out").write_text(AUTOTUNE + ITERATIONS)
    r = job_result(spec(number=8), job, template="harness", trial_timeout=None, warmup=1, peak_tflops=383.0)
    assert r.status == Status.TIMEOUT and r.message.startswith("Slurm state TIMEOUT; ")
