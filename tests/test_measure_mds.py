"""benchmarks/measure_memory_mds.py and its parts (benchmarks/mds_memory/) without Megatron-DeepSpeed: the configuration
lists and their side of the held-out split, the row written for a measured result and the committed data files
(the measuring itself needs a Megatron-DeepSpeed checkout: the script's docstring)."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCH))

from mds_memory.configs import CONFIGS, DEFAULT_OUT, FRESH, FRESH_OUT, rank_of  # noqa: E402
from mds_memory.rows import launch_files, split_row, to_row, write_toml  # noqa: E402
from published import clean, held_out, split_key  # noqa: E402

SCRIPT = BENCH / "measure_memory_mds.py"
VERSIONS = {"torch": "2.13.0", "deepspeed": "0.19.8"}


def _result(argv) -> dict:
    """A measured result as step.py prints it (numbers made up: the row's keys are what is tested)."""
    return dict(peak=7 * 2 ** 30, fb_peak=6 * 2 ** 30, between=3 * 2 ** 30, n_params=123_456,
                engine="PipelineEngine with DeepSpeedZeroOptimizer", seconds=1.0, argv=argv)


def test_list_names_each_batch_and_its_configurations():
    def listed(*flags):
        return subprocess.run([sys.executable, str(SCRIPT), "--list", *flags], capture_output=True, text=True,
                              check=True).stdout.splitlines()

    assert len(listed()) == len(CONFIGS) == 24 and len(listed("--fresh")) == len(FRESH) == 24
    assert listed("--fresh", "--only", "3")[0].startswith(f"3 {FRESH[3]['model']} tp{FRESH[3]['tp']} ")


def test_the_choice_reads_only_the_two_thirds_and_fresh_is_the_held_out_third():
    """CONFIGS (what the memory choice read) lies outside the held-out third, FRESH inside it and seen by no choice."""
    assert not any(held_out(split_row(c)) for c in CONFIGS)
    assert all(held_out(split_row(c)) for c in FRESH)
    assert not {split_key(split_row(c)) for c in CONFIGS} & {split_key(split_row(c)) for c in FRESH}
    assert all(clean(dict(split_row(c), peak_allocated_gib=1.0), "memory") for c in FRESH)     # as measured rows


def test_a_row_is_what_tuner_launch_writes_and_reads_back(tmp_path):
    c = next(c for c in CONFIGS if c["pp"] > 1 and c["stage"])
    argv, ds_config = launch_files(c, "ds_config.json")
    assert argv[argv.index("--pipeline-model-parallel-size") + 1] == str(c["pp"])
    assert argv[argv.index("--zero-stage") + 1] == str(c["zero_stage"]) and "--no-pipeline-parallel" not in argv
    assert ds_config["zero_optimization"]["stage"] == c["zero_stage"]
    row = to_row(c, _result(argv), VERSIONS)
    assert {k: row[k] for k in split_row(c)} == split_row(c) and row["peak_allocated_gib"] == 7.0
    assert f"rank {rank_of(c)} of {row['gpus']}" in row["note"] and "the optimizer step" in row["note"]
    path = tmp_path / "m.toml"
    write_toml([row], path)
    assert tomllib.loads(path.read_text())["row"] == [row]


def test_the_committed_rows_are_the_lists_gpt_configurations():
    """Every committed row is a configuration of its list; the Llama ones are absent (f4157bea cannot run them)."""
    for path, configs in ((DEFAULT_OUT, CONFIGS), (FRESH_OUT, FRESH)):
        rows = tomllib.loads(path.read_text())["row"]
        keys = {split_key(split_row(c)) + f"|{c['stage']}" for c in configs}
        assert rows and all(split_key(r) + f"|{r['stage']}" in keys for r in rows)
        assert all(r["model"].startswith("gpt-") for r in rows)
        assert {r["model"] for r in rows} >= {"gpt-22b", "gpt-175b"} and all(r["peak_allocated_gib"] > 1 for r in rows)
