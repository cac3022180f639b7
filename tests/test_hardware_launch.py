"""Issue 26: the precisions of Blackwell and MI300-series (mxfp8, nvfp4, fp8 on ROCm) in the model and in
`launch`, the ROCm launch environment, and runnable launch files for a GB200 NVL72 rack and an MI300X cluster."""

from __future__ import annotations

import subprocess
import tomllib

import pytest

from tests.test_launch_frameworks import MCORE_FLAGS, TORCHTITAN_KEYS
from tuner.errors import UsageError
from tuner.layout import Layout, why_invalid
from tuner.perfmodel import predict
from tuner.render import rocm
from tuner.render.launch import launch_files
from tuner.specs import make_workload

# The flags and keys this issue adds, each checked in the framework's source (tuner/precision.py cites the
# lines): Megatron-LM @ d98e8a64ddf3 megatron/core/transformer/transformer_config.py; torchtitan @ 238fa9953e4a
# torchtitan/config/job_config.py and components/quantization/mx.py.
NEW_MCORE_FLAGS = {"--fp8-recipe": "TC:594 ('mxfp8')", "--fp4-format": "TC:674 ('e2m1')",
                   "--fp4-recipe": "TC:679 ('nvfp4')"}
NEW_TORCHTITAN_KEYS = {"quantize.linear.mx.recipe_name": "MXLinear:777", "quantize.linear.mx.filter_fqns": "MXLinear:784",
                       "quantize.grouped_mm.mx.fqns": "MXGroupedMM:802"}
MOCK = {"mock_data": True}


def _flags(files: dict) -> set[str]:
    return {a for a in files["megatron_args.txt"].split() if a.startswith("--")}


def _keys(doc: dict, prefix: str = "") -> set[str]:
    out = set()
    for k, v in doc.items():
        out |= _keys(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}"}
    return out


def _runs_as_written(files: dict, tmp_path) -> None:
    """The script parses as bash and names only files written beside it."""
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    subprocess.run(["bash", "-n", str(tmp_path / "launch.sbatch")], check=True)
    assert str(tmp_path) not in files["launch.sbatch"]


# ---- a GB200 NVL72 rack ----------------------------------------------------------------------------------
def test_launch_writes_runnable_files_for_an_nvl72_rack(tmp_path):
    w = make_workload("llama3-70b", 18, "gb200", 576, precision="mxfp8")
    lay = Layout(tp=8, sequence_parallel=True, pp=1, dp=9, micro_batch=1, recompute="selective")
    files = launch_files(lay, w, framework="megatron-core", train_iters=100, **MOCK)
    sb = files["launch.sbatch"]
    for line in ("#SBATCH --nodes=18", "#SBATCH --ntasks-per-node=4", "#SBATCH --gpus-per-node=4",
                 "#SBATCH --segment=18", "srun --nodes=18 --ntasks-per-node=4 --gpus-per-node=4"):
        assert line in sb, line
    args = files["megatron_args.txt"].split()
    i = args.index("--fp8-recipe")
    assert args[i - 2:i + 2] == ["--fp8-format", "e4m3", "--fp8-recipe", "mxfp8"]
    assert "--tp-comm-overlap" in args            # tp 8 spans two trays, inside the rack's NVLink domain
    assert _flags(files) <= set(MCORE_FLAGS) | set(NEW_MCORE_FLAGS)
    assert '"mxfp8": true' in files["layout.json"]
    _runs_as_written(files, tmp_path)


def test_a_full_rack_with_a_batch_dp_cannot_divide_names_the_global_batch_that_runs():
    """72 GPUs = 8 x 9: with tp, cp, pp powers of two, dp carries the 9, so the default 512 has no layout; the
    refusal names the nearest batch that has (504 = 7 x 72), and that batch plans on the rack."""
    from tuner.space import load_space, valid_layouts
    w = make_workload("llama3-70b", 18, "gb200")
    with pytest.raises(UsageError) as err:
        valid_layouts(load_space(), w)
    assert str(err.value).endswith("pass --global-batch 504 (a multiple of 72, so dp can divide it)")
    assert valid_layouts(load_space(), make_workload("llama3-70b", 18, "gb200", 504))


def test_a_job_of_several_racks_asks_slurm_for_segments_of_a_rack():
    w = make_workload("llama3-70b", 64, "gb200", precision="nvfp4")
    lay = Layout(tp=2, sequence_parallel=True, pp=4, virtual_pipeline=5, dp=32, micro_batch=1, recompute="none")
    files = launch_files(lay, w, framework="megatron-core", train_iters=100, **MOCK)
    assert "#SBATCH --segment=16" in files["launch.sbatch"]         # 64 trays = 4 racks x 16
    args = files["megatron_args.txt"].split()
    i = args.index("--fp4-format")
    assert args[i:i + 4] == ["--fp4-format", "e2m1", "--fp4-recipe", "nvfp4"] and "--fp8-format" not in args
    one_node = make_workload("llama3-8b", 1, "h100", precision="fp8")
    plain = launch_files(Layout(tp=1, pp=1, dp=8, micro_batch=1), one_node, framework="megatron-core",
                         train_iters=10, **MOCK)["launch.sbatch"]
    assert "--segment" not in plain                                   # a node is its own NVLink domain


def test_torchtitan_runs_mxfp8_with_tp_1_and_is_refused_beyond():
    w = make_workload("llama3-8b", 2, "gb200", precision="mxfp8", framework="torchtitan")
    job = tomllib.loads(launch_files(Layout(tp=1, pp=1, dp=8, micro_batch=1, zero_stage=3), w,
                                     framework="torchtitan", train_iters=10, **MOCK)["torchtitan.toml"])
    assert job["model"]["converters"] == ["quantize.linear.mx"]
    assert job["quantize"]["linear"]["mx"] == {"recipe_name": "mxfp8_cublas", "filter_fqns": ["output"]}
    assert job["compile"]["enable"] is True
    assert _keys(job) <= set(TORCHTITAN_KEYS) | set(NEW_TORCHTITAN_KEYS)
    tp2 = Layout(tp=2, sequence_parallel=True, pp=1, dp=4, micro_batch=1, zero_stage=3)
    assert "TP not yet supported with torch.compile for mxfp8" in why_invalid(tp2, w)


# ---- an MI300X cluster (ROCm) ----------------------------------------------------------------------------
def test_launch_writes_runnable_files_for_an_mi300x_cluster(tmp_path):
    w = make_workload("llama3-70b", 4, "mi300x", precision="fp8")
    lay = Layout(tp=8, sequence_parallel=True, pp=1, dp=4, micro_batch=1, recompute="full")
    files = launch_files(lay, w, framework="megatron-core", train_iters=100, **MOCK)
    sb = files["launch.sbatch"]
    for line in ("export HSA_NO_SCRATCH_RECLAIM=1", "export NVTE_CK_IS_V3_ATOMIC_FP32=1",
                 "export NCCL_IB_GID_INDEX=3", "export CUDA_DEVICE_MAX_CONNECTIONS=1",
                 "#SBATCH --ntasks-per-node=8", "#SBATCH --gpus-per-node=8", "# ROCm: AMD Instinct gfx942",
                 "NCCL_IB_HCA"):
        assert line in sb, line
    args = files["megatron_args.txt"].split()
    assert "--tp-comm-overlap" not in args        # off on ROCm, as AMD's Primus runs it (and the model credits none)
    assert args[args.index("--fp8-format") + 1] == "hybrid"
    assert "--segment" not in sb
    assert _flags(files) <= set(MCORE_FLAGS)
    _runs_as_written(files, tmp_path)


def test_torchtitan_on_mi300x_gets_the_rocm_environment(tmp_path):
    w = make_workload("llama3-8b", 2, "mi300x", framework="torchtitan")
    files = launch_files(Layout(tp=1, pp=1, dp=16, micro_batch=1, zero_stage=3), w, framework="torchtitan",
                         train_iters=10, **MOCK)
    assert "export HSA_NO_SCRATCH_RECLAIM=1" in files["launch.sbatch"]
    assert _keys(tomllib.loads(files["torchtitan.toml"])) <= set(TORCHTITAN_KEYS)
    _runs_as_written(files, tmp_path)


def test_gfx950_and_one_node_need_fewer_rocm_variables():
    assert rocm.launch_env(make_workload("llama3-8b", 2, "mi355x")) == {"NCCL_IB_GID_INDEX": "3"}
    assert rocm.launch_env(make_workload("llama3-8b", 1, "mi300x")) == rocm.GFX942
    assert rocm.launch_env(make_workload("llama3-8b", 2, "h100")) == {}


# ---- precisions in the model -----------------------------------------------------------------------------
def test_block_scaled_precisions_run_at_their_rates_and_mfu_stays_on_the_bf16_peak():
    lay = Layout(tp=2, sequence_parallel=True, pp=4, virtual_pipeline=5, dp=8, micro_batch=1, recompute="none")
    pr = {p: predict(lay, make_workload("llama3-70b", 16, "gb200", precision=p)) for p in
          ("bf16", "fp8", "mxfp8", "nvfp4")}
    assert pr["nvfp4"].step_time_s < pr["mxfp8"].step_time_s < pr["bf16"].step_time_s
    assert pr["fp8"].step_time_s < pr["mxfp8"].step_time_s   # MXFP8 quantises along both dimensions: more casts
    for p in pr.values():    # MFU = model FLOPs / (step x GPUs x bf16 peak): the same ratio to speed
        assert p.mfu / pr["bf16"].mfu == pytest.approx(pr["bf16"].step_time_s / p.step_time_s, rel=1e-9)


def test_mi300x_fp8_gemms_run_at_their_own_measured_fraction():
    """MI300X's eta_max (AMD's MAF on MI325X's TAF basis: 0.432 for both, mi300x.toml); FP8 GEMMs read
    matmul_efficiency_fp8, BF16 ones matmul_efficiency."""
    import dataclasses
    from tuner.perfmodel.compute import gemm_efficiency
    c = make_workload("llama3-70b", 1, "mi300x").cluster
    assert gemm_efficiency(c, 1e6, "fp8") == pytest.approx(0.432, rel=1e-3)
    assert gemm_efficiency(c, 1e6, False) == pytest.approx(0.432, rel=1e-3)
    apart = dataclasses.replace(c, matmul_efficiency_fp8=0.30)
    assert gemm_efficiency(apart, 1e6, "fp8") == pytest.approx(0.30, rel=1e-3)
    assert gemm_efficiency(apart, 1e6, False) == pytest.approx(0.432, rel=1e-3)


@pytest.mark.parametrize("cluster, precision, framework, says", [
    ("mi300x", "mxfp8", None, "block_scaled"), ("mi355x", "nvfp4", None, "MXFP4"),
    ("b200", "nvfp4", "torchtitan", "--framework megatron-core"), ("frontier", "fp8", None, "peak_tflops_fp8"),
    ("b200", "mxfp8", "megatron-deepspeed", "--framework megatron-core or torchtitan")])
def test_a_precision_the_machine_or_stack_lacks_is_refused_in_one_line(tuner, cluster, precision, framework, says):
    with pytest.raises(UsageError, match=says.replace("-", r"\-")):
        make_workload("llama3-8b", 1, cluster, precision=precision, framework=framework)
    code, _, err = tuner("plan", "--model", "llama3-8b", "--cluster", cluster, "--nodes", "1", "--precision", precision,
                         *(["--framework", framework] if framework else []))
    assert code == 2 and says in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_the_readme_machines_examples_run(tuner, tmp_path, monkeypatch):
    import re
    import shlex
    from tests.docs_pages import page
    section = page("hardware.md")                                   # once the README's "### Machines"
    block = re.findall(r"```bash\n(.*?)```", section, re.S)[0]
    commands = [line for line in block.splitlines() if line.startswith("tuner ")]
    assert len(commands) >= 4
    monkeypatch.chdir(tmp_path)
    for line in commands:
        code, out, err = tuner(*shlex.split(line)[1:])
        assert code == 0, (line, err)
    assert "#SBATCH --segment=18" in (tmp_path / "launch-nvl72" / "launch.sbatch").read_text()
    assert "HSA_NO_SCRATCH_RECLAIM=1" in (tmp_path / "launch-mi300x" / "launch.sbatch").read_text()
