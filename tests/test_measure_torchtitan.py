"""benchmarks/measure_memory_torchtitan.py and its parts (benchmarks/torchtitan_memory/) without torch: the
configuration lists the command serves per batch flag, the row it writes for a measured result, the data file
written back as TOML, and the house rule on module and function size (the measuring itself needs torchtitan's
venv: the script's docstring)."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCH))

from draw_memory_batch import split_row  # noqa: E402
from torchtitan_memory.configs import BATCHES, CONFIGS, FRESH4  # noqa: E402
from torchtitan_memory.rows import to_row, write_toml  # noqa: E402

SCRIPT = BENCH / "measure_memory_torchtitan.py"


def _result(c: dict, n_layers: int) -> dict:
    """A measured result as the worker prints it (numbers made up: the row's layout keys are what is tested)."""
    peak = {"Sharded Param": 1.5, "Unsharded Param": 0.25, "Sharded Grad": 1.5, "OptState": 3.0, "Activation": 2.0,
            "Temp": 0.125, "Total": 8.375}
    step = dict(peak=peak, phase="backward in layers.0", s2_bytes=0, s2_shape=None, seconds=1.0)
    return dict(config=c, n_layers=n_layers, n_params=123_456, steps=[step], opt_state_gib=3.0, local_param_gib=1.5,
                torchtitan="0.3.0", torch="2.13.0+cpu", seconds=2.0)


def test_list_names_each_batch_and_its_workers_configurations():
    """--list per batch flag (the worker subprocess gets the same flag, so index N names the batch's row N)."""
    def listed(*flags):
        return subprocess.run([sys.executable, str(SCRIPT), "--list", *flags], capture_output=True, text=True,
                              check=True).stdout.splitlines()

    main, fresh4 = listed(), listed("--fresh4")
    assert len(main) == len(CONFIGS) == 43 and len(fresh4) == len(FRESH4) == 36
    assert fresh4[0] == " 1: llama3-70b layers=8 s=4096 dp=64 tp=4 mb=1 recompute=none loss=chunked"
    assert listed("--fresh2", "--fresh") == listed("--fresh")       # the first flag in --fresh .. --fresh4 order


def test_a_row_states_the_layout_draw_memory_batch_splits_on():
    """to_row writes the keys published.split_key reads as draw_memory_batch.split_row states them, for every
    dense configuration of every batch."""
    for configs, _ in BATCHES.values():
        for c in configs:
            if c["model"] == "qwen3-30b-a3b":
                continue
            n_layers = c["layers"] or {"llama3-8b": 32, "llama3-70b": 80}[c["model"]]
            row, want = to_row(_result(c, n_layers)), split_row(c)
            assert {k: row[k] for k in want} == want, c
            assert row["peak_allocated_gib"] == 8.375 and row["breakdown_gib"]["parameters"] == 1.75


def test_the_data_file_reads_back_as_written(tmp_path):
    rows = [to_row(_result(c, c["layers"] or 80)) for c in CONFIGS[21:23]]
    path = tmp_path / "m.toml"
    write_toml(rows, path, ["qwen3-30b-a3b ...: AssertionError"], 12.0)
    assert tomllib.loads(path.read_text())["row"] == rows
