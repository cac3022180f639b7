"""`tuner calibrate`: measure this machine and write a cluster file."""

from __future__ import annotations

import click

from tuner.cli import cli


@cli.command()
@click.option("--out", default="workloads/clusters/local.toml", show_default=True,
              help="Cluster file to write; `--cluster local` then uses it from this directory.")
@click.option("--gpus", type=click.IntRange(min=1), default=2, show_default=True,
              help="Ranks to measure with (CPU processes, or GPUs when CUDA is present).")
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True,
              help="Measure CPU processes or CUDA GPUs (auto: CUDA when --gpus devices are visible).")
@click.option("--name", default="local", show_default=True, help="The cluster's name in the file.")
@click.option("--quick", is_flag=True, help="Fewer sizes and repetitions (a rougher, faster measurement).")
@click.option("--force", is_flag=True, help="Overwrite an existing file.")
def calibrate(out, gpus, device, name, quick, force):
    """Measure matmul TFLOPS, memory and collective bandwidth; write a cluster TOML.

    Example: tuner calibrate --gpus 2 --out workloads/clusters/local.toml
    """
    from tuner.calibrate import calibrate as run_calibration
    from tuner.errors import MissingExtra
    try:
        import torch  # noqa: F401
    except ImportError:
        raise MissingExtra("torch", "deepspeed") from None
    got = run_calibration(out, gpus=gpus, force=force, device=device, name=name, quick=quick)
    c = got["cluster"]
    click.echo(f"wrote {got['path']} in {got['seconds']:.0f} s: peak {c['peak_tflops']:.4g} TFLOPS per rank, "
               f"matmul efficiency {c['matmul_efficiency']:.2f}, memory bandwidth {c['hbm_bandwidth_gbps']:.3g} GB/s, "
               f"all-reduce bus bandwidth {c['intra_node_bandwidth_gbps']:.3g} GB/s over {gpus} ranks")
