"""A framework's launch variables win over the cluster's [slurm] env table (task G): Frontier's table exports
CUDA_DEVICE_MAX_CONNECTIONS=1 (the Megatron-DeepSpeed study's setting), which Megatron-FSDP refuses at start-up at any
tp and cp (Megatron-LM megatron/training/arguments.py lines 1166-1167 at d98e8a64dd: "FSDP requires
CUDA_DEVICE_MAX_CONNECTIONS > 1 or unset"). The scripts' variable lines are run in bash, started with the variable at
1 as a submitting shell may pass it on, and the value the ranks would see is read back."""

from __future__ import annotations

import subprocess

import pytest

from tuner.layout import Layout
from tuner.render.launch import launch_files
from tuner.render.sbatch import render_sbatch
from tuner.specs import make_workload
from tuner.trial import TrialSpec

MOCK = {"mock_data": True, "train_iters": 10}
VAR = "CUDA_DEVICE_MAX_CONNECTIONS"


def seen_by_ranks(script: str) -> str:
    """The variable's value after the script's export/unset lines (bash, started with it at 1); "<unset>" if none."""
    lines = [x for x in script.splitlines() if x.startswith(("export ", "unset ")) and "MASTER_" not in x]
    out = subprocess.run(["bash", "-c", "\n".join([*lines, f'printf %s "${{{VAR}-<unset>}}"'])],
                         env={"PATH": "/usr/bin:/bin", VAR: "1"}, capture_output=True, text=True, check=True)
    return out.stdout


def frontier_mcore(layout: Layout) -> str:
    w = make_workload("22b", 2, "frontier")
    return launch_files(layout, w, framework="megatron-core", **MOCK)["launch.sbatch"]


@pytest.mark.parametrize("tp, sp", [(1, False), (2, True)])
def test_frontier_megatron_fsdp_launch_does_not_leave_one_cuda_connection(tp, sp):
    """The 22B Megatron-Core pick on 2 Frontier nodes (tp1-pp1-dp16-mb4-z3) and a tp 2 twin: Megatron-LM asserts at
    any tp under Megatron-FSDP (the tp 2 case only warns about sequence parallelism, arguments.py line 1456)."""
    script = frontier_mcore(Layout(tp=tp, sequence_parallel=sp, pp=1, dp=16 // tp, micro_batch=4, zero_stage=3))
    assert "--use-megatron-fsdp" in script
    assert seen_by_ranks(script) == "<unset>"
    assert f"export {VAR}=1" not in script
    assert f"# [slurm] env sets {VAR}=1; the framework needs it unset" in script


def test_frontier_tensor_parallel_launch_without_fsdp_keeps_the_one_connection_once():
    script = frontier_mcore(Layout(tp=2, sequence_parallel=True, pp=4, dp=2, micro_batch=2, zero_stage=1))
    assert seen_by_ranks(script) == "1" and script.count(VAR) == 1


def test_frontier_megatron_deepspeed_keeps_the_tables_one_connection():
    """Megatron-DeepSpeed asks for 1 (sequence parallelism) and never refuses it (arguments.py lines 402-411 at
    4efb479d5317): the study's table value stays, at ZeRO-3 too."""
    w = make_workload("22b", 2, "frontier")
    for lay in (Layout(tp=2, sequence_parallel=True, pp=4, dp=2, micro_batch=2, zero_stage=1),
                Layout(tp=1, pp=1, dp=16, micro_batch=4, zero_stage=3)):
        script = launch_files(lay, w, data_path="/d/pile", tokenizer="gpt2", train_iters=10)["launch.sbatch"]
        assert seen_by_ranks(script) == "1" and script.count(VAR) == 1


def test_the_framework_value_replaces_the_tables_and_unset_holds_without_a_table_value():
    w = make_workload("22b", 2, "frontier")
    spec = TrialSpec(study="s", number=0, layout=Layout(tp=1, pp=1, dp=16, micro_batch=4), workload=w)
    table = {"tasks_per_node": 8, "env": {VAR: "1", "NCCL_CROSS_NIC": "1"}}
    eight = render_sbatch(spec, table, template="command", command=["true"], env={VAR: "8"}, launch="j")
    assert seen_by_ranks(eight) == "8" and f"export {VAR}=1" not in eight and "export NCCL_CROSS_NIC=1" in eight
    bare = render_sbatch(spec, {"tasks_per_node": 8}, template="command", command=["true"], env={VAR: None},
                         launch="j")
    assert seen_by_ranks(bare) == "<unset>" and "# [slurm] env sets" not in bare
