"""benchmarks/measure_memory_mcore.py and its parts (benchmarks/mcore_memory/) without torch: the configuration lists
the command serves per batch flag, the row it writes for a measured result, the data file written back as TOML, and
the house rule on module and function size (the measuring itself needs megatron-core's venv: the script's
docstring)."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCH))

from draw_memory_batch import mcore_split_row  # noqa: E402
from mcore_memory.configs import CONFIGS, FRESH, FRESH2, FRESH3, FRESH4, FRESH5, PIPELINE  # noqa: E402
from mcore_memory.rows import _presets, _row, write_toml  # noqa: E402

SCRIPT = BENCH / "measure_memory_mcore.py"


def _result() -> dict:
    """A measured result as measure() returns it (numbers made up: the row's layout keys are what is tested)."""
    cats = dict(parameters=2 ** 30, gradients=2 ** 31, optimizer=3 * 2 ** 30, activations=2 ** 29, temp=2 ** 28,
                other=0, total=7 * 2 ** 30)
    return dict(peak=cats, fb_peak=cats, after_init=cats, n_params=123_456, fwd=2, bwd=2, max_in_flight=1, p2p_ops=0,
                schedule="forward_backward_no_pipelining", seconds=1.0, cast=[])


def test_list_names_each_batch_and_its_configurations():
    def listed(*flags):
        return subprocess.run([sys.executable, str(SCRIPT), "--list", *flags], capture_output=True, text=True,
                              check=True).stdout.splitlines()

    for flag, configs in (("", CONFIGS), ("--fresh", FRESH), ("--fresh2", FRESH2), ("--fresh3", FRESH3),
                          ("--fresh4", FRESH4), ("--fresh5", FRESH5), ("--pipeline", PIPELINE)):
        lines = listed(*([flag] if flag else []))
        assert len(lines) == len(configs) and lines[-1].startswith(f"{len(configs) - 1} {configs[-1]['shape']} ")
    assert listed("--fresh5", "--only", "3,1")[0].startswith(f"3 {FRESH5[3]['shape']} {FRESH5[3]['num_layers']} ")


def test_a_row_states_the_layout_draw_memory_batch_splits_on():
    """_row writes the keys published.split_key reads as draw_memory_batch.mcore_split_row states them, for every
    dense pp-stage configuration of the drawn batches."""
    presets = _presets()
    for c in FRESH3 + FRESH4 + FRESH5:
        row, want = _row(c, _result(), "0.16.1", presets), mcore_split_row(c)
        assert {k: row[k] for k in want} == want, c
        assert row["peak_allocated_gib"] == 7.0 and row["breakdown_gib"]["gradients"] == 2.0


def test_the_data_file_reads_back_as_written(tmp_path):
    presets = _presets()
    rows = [_row(c, _result(), "0.16.1", presets) for c in CONFIGS[35:37] + PIPELINE[:1]]
    path = tmp_path / "m.toml"
    write_toml(rows, path, "0.16.1")
    assert tomllib.loads(path.read_text())["row"] == rows
