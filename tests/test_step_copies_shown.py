"""Where DeepSpeed's optimizer-step gradient copies are the working-buffer entry (memory.step_copy_bytes keeps their
excess over the activations in the breakdown's zero3_buffers key), what a user reads names them `step_copies`:
tuner predict's memory line and the reason a layout does not fit. A ZeRO-3 layout and the other stacks keep
`zero3_buffers`; a pipeline (pp > 1, DeepSpeed's pipeline engine, read since issue 30 round 33) names its step's copies
too; the JSON breakdown keeps its key."""

from __future__ import annotations

import json

from click.testing import CliRunner

from tuner.cli import cli

H200_MDS = ["--cluster", "h200", "--nodes", "1", "--framework", "megatron-deepspeed", "--tp", "1"]


def _predict(*args: str) -> str:
    r = CliRunner().invoke(cli, ["predict", *args])
    assert r.exit_code == 0, r.output
    return r.output


def _memory_line(out: str) -> str:
    return next(line for line in out.splitlines() if line.strip().startswith("memory (GB):"))


def test_zero_0_names_the_step_copies_in_the_breakdown_and_the_reason():
    # MPT 7B at ZeRO 0 on an H200 node (each GPU holds what the one-GPU harness rows of
    # benchmarks/data/harness_measured_h200.jsonl held: out of memory, as predicted): its 52 GB beyond the
    # activations are DeepSpeed's fp32 gradient copies, not ZeRO-3 buffers
    out = _predict("--model", "mpt-7b", *H200_MDS, "--pp", "1", "--micro-batch", "1", "--zero-stage", "0",
                   "--recompute", "full", "--global-batch", "32")
    line = _memory_line(out)
    assert "step_copies 52.1" in line and "zero3_buffers" not in line, line
    # Llama 3 8B at ZeRO 0 needs more than the GPU has: the reason names its largest consumers
    out = _predict("--model", "llama3-8b", *H200_MDS, "--pp", "1", "--micro-batch", "1", "--zero-stage", "0",
                   "--recompute", "full", "--global-batch", "32")
    reason = next(line for line in out.splitlines() if "largest:" in line)
    assert "step_copies" in reason and "zero3_buffers" not in reason, reason


def test_zero_3_keeps_zero3_buffers_and_a_pipeline_names_its_step_copies():
    for zero, pp, name in ((3, "1", "zero3_buffers"), (1, "2", "step_copies")):
        out = _predict("--model", "mpt-7b", *H200_MDS, "--pp", pp, "--micro-batch", "1", "--zero-stage", str(zero),
                       "--recompute", "full", "--global-batch", "32")
        line = _memory_line(out)
        other = "step_copies" if name == "zero3_buffers" else "zero3_buffers"
        assert name in line and other not in line, (zero, pp, line)
    out = _predict("--model", "llama3-8b", "--cluster", "h100", "--nodes", "1", "--framework", "megatron-core",
                   "--tp", "1", "--pp", "1", "--micro-batch", "1", "--zero-stage", "0")
    assert "zero3_buffers" in _memory_line(out)


def test_json_keeps_the_key():
    out = _predict("--model", "mpt-7b", *H200_MDS, "--pp", "1", "--micro-batch", "1", "--zero-stage", "0",
                   "--recompute", "full", "--global-batch", "32", "--format", "json")
    memory = json.loads(out)["breakdown"]["memory_gb"]
    assert "step_copies" not in memory and memory["zero3_buffers"] > 50
