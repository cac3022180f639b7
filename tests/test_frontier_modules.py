"""Frontier's launch loads the ROCm its framework needs (reliability task D, item 2): frontier.toml's [slurm] modules
load rocm/5.7.0 -- the Frontier study's stack, Megatron-DeepSpeed on ROCm 5.x -- and every launch loaded it, also a
Megatron-Core or torchtitan one, whose stack (ROCm Transformer Engine, today's PyTorch ROCm wheels) is built for ROCm 6
or newer. A [slurm] table's `framework_modules` names the modules of each other framework's runs; OLCF's Frontier user
guide (olcf/olcf-user-docs, systems/frontier_user_guide.rst, 2025-02-18 and 2026-04-07 entries) makes CPE/24.11 with
ROCm/6.2.4 the default modules and asks users on ROCm/5.x to move to a ROCm 6 or 7 stack."""

from __future__ import annotations

import pytest

from tests.test_frontier_rocm import DATA, SP_LAYOUT
from tuner.errors import UsageError
from tuner.layout import Layout
from tuner.render.launch import launch_files
from tuner.render.sbatch import validate_slurm
from tuner.specs import load_cluster, make_workload


def modules(script: str) -> list[str]:
    return [line.split(" ", 2)[2] for line in script.splitlines() if line.startswith("module load ")]


def test_frontier_loads_rocm_6_for_megatron_core_and_torchtitan_and_the_studys_rocm_for_megatron_deepspeed():
    w = make_workload("175b", 4, "frontier")
    mds = launch_files(SP_LAYOUT, w, train_iters=10, **DATA)["launch.sbatch"]
    assert modules(mds) == ["PrgEnv-gnu", "rocm/5.7.0", "craype-accel-amd-gfx90a"]       # the study's stack
    mcore = launch_files(SP_LAYOUT, w, framework="megatron-core", train_iters=10, mock_data=True)["launch.sbatch"]
    assert modules(mcore) == ["PrgEnv-gnu", "rocm/6.2.4", "craype-accel-amd-gfx90a"]
    tt = launch_files(Layout(tp=8, sequence_parallel=True, pp=2, dp=2, micro_batch=1, zero_stage=3),
                      make_workload("llama3-70b", 4, "frontier"), framework="torchtitan", train_iters=10,
                      mock_data=True)["launch.sbatch"]
    assert modules(tt) == ["PrgEnv-gnu", "rocm/6.2.4", "craype-accel-amd-gfx90a"]
    assert "ROCm 6" in mcore and "ROCm 6" in tt                # the note says why
    assert "Transformer Engine" in mcore and "Transformer Engine" not in tt    # torchtitan uses none (review, task R)


def test_framework_modules_name_known_frameworks_and_lists():
    table = dict(load_cluster("frontier").slurm)
    assert validate_slurm(table)["framework_modules"]["megatron-core"][1] == "rocm/6.2.4"
    with pytest.raises(UsageError, match="framework_modules.*'megatron-lm'.*megatron-core, torchtitan"):
        validate_slurm({**table, "framework_modules": {"megatron-lm": ["rocm/6.2.4"]}})
    with pytest.raises(UsageError, match="framework_modules.*list of strings"):
        validate_slurm({**table, "framework_modules": {"torchtitan": "rocm/6.2.4"}})
    assert validate_slurm({"modules": ["cuda"]})["framework_modules"] == {}      # none: `modules` for every framework


def test_an_empty_framework_module_list_loads_nothing_and_the_note_says_so():
    """`framework_modules = { megatron-core = [] }` (the job's environment brings its own ROCm) loads no module, and
    the launch note says that, not "load a rocm/6.x module" (found at the session's end: it said to load one)."""
    import dataclasses
    c = load_cluster("frontier")
    c = dataclasses.replace(c, slurm={**c.slurm, "framework_modules": {"megatron-core": []}})
    w = dataclasses.replace(make_workload("175b", 4, "frontier"), cluster=c)
    script = launch_files(SP_LAYOUT, w, framework="megatron-core", train_iters=10, mock_data=True)["launch.sbatch"]
    assert modules(script) == []
    assert "load no module for it" in script and "load a rocm/6.x" not in script
