"""`tuner calibrate`: measure this machine and write a cluster file."""

from __future__ import annotations

import shlex
import textwrap

import click

from tuner.cli import cli


@cli.command()
@click.option("--out", default=None,
              help="Cluster file to write (default: workloads/clusters/<name>.toml under this directory, "
                   "which `--cluster <name>` finds); never a shipped preset.")
@click.option("--gpus", type=click.IntRange(min=1), default=2, show_default=True,
              help="Ranks to measure with (CPU processes, or GPUs when CUDA is present).")
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True,
              help="Measure CPU processes or CUDA GPUs (auto: CUDA when --gpus devices are visible).")
@click.option("--name", default=None,
              help="The cluster's name in the file (default: this host's name, sanitised).")
@click.option("--quick", is_flag=True, help="Fewer sizes and repetitions (a rougher, faster measurement).")
@click.option("--force", is_flag=True, help="Overwrite an existing file (never a shipped preset).")
@click.option("--trial-timeout", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Seconds each harness run that measures the overheads may take (default 90); the first one "
                   "builds DeepSpeed's CPU op on a fresh machine.")
def calibrate(out, gpus, device, name, quick, force, trial_timeout):
    """Measure matmul TFLOPS, memory and collective bandwidth; write a cluster TOML.

    Example: tuner calibrate --gpus 2     (writes workloads/clusters/<host>.toml; prints the --cluster to use)
    """
    from tuner.calibrate import OVERHEAD_TIMEOUT_S, calibrate as run_calibration, check_target, resolve_target
    from tuner.errors import MissingExtra
    target, name = resolve_target(out, name)
    check_target(target, force)          # refused before anything is measured (or torch is needed)
    try:
        import torch  # noqa: F401
    except ImportError:
        raise MissingExtra("torch", "deepspeed") from None
    got = run_calibration(target, gpus=gpus, force=force, device=device, name=name, quick=quick,
                          trial_timeout=trial_timeout or OVERHEAD_TIMEOUT_S)
    c = got["cluster"]
    click.echo(f"wrote {got['path']} in {got['seconds']:.0f} s: peak {c['peak_tflops']:.4g} TFLOPS per rank, "
               f"matmul efficiency {c['matmul_efficiency']:.2f}, memory bandwidth {c['hbm_bandwidth_gbps']:.3g} GB/s, "
               f"all-reduce bus bandwidth {c['intra_node_bandwidth_gbps']:.3g} GB/s over {gpus} ranks")
    click.echo(f"use it with --cluster {shlex.quote(got['cluster_option'])}, e.g. tuner search --model tiny "
               f"--cluster {shlex.quote(got['cluster_option'])} --runner local --gpus {gpus} --budget 6")
    failed = (got["measurements"].get("overhead") or {}).get("error")
    if failed:
        why = textwrap.shorten(failed, 300, placeholder=" ...")
        click.echo(f"warning: the harness runs that measure the overheads failed, so microbatch_overhead_ms and "
                   f"step_overhead_ms in {got['path']} are tuner's defaults, not measured ({why}); fix that and "
                   "rerun with --force" + (" (a run that timed out, such as a first one building DeepSpeed's CPU op "
                                           "on a busy machine: add --trial-timeout 600)" if ": timeout" in failed
                                          else ""), err=True)
