"""benchmarks/data/hardware_published.toml and benchmarks/hardware_accuracy.py (issue 26): every row names its
source and a shipped cluster, the split covers it, and the benchmark reports every row."""

from __future__ import annotations

import importlib.util
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "benchmarks" / "data" / "hardware_published.toml"


def _bench():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    spec = importlib.util.spec_from_file_location("hardware_accuracy", ROOT / "benchmarks" / "hardware_accuracy.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_every_row_names_its_source_a_preset_and_a_layout():
    from tuner.precision import PRECISIONS
    from tuner.presets import shipped_presets
    rows = tomllib.loads(DATA.read_text())["row"]
    assert len(rows) >= 100
    for r in rows:
        assert " @ " in r["source"] or "arXiv" in r["source"], r["source"]
        assert r["cluster"] in shipped_presets("clusters") and r["precision"] in PRECISIONS
        assert r["gpus"] % (r["tp"] * r["cp"] * r["pp"]) == 0 and r["tokens_per_s_per_gpu"] > 0
        assert r["note"]


def test_the_benchmark_reports_every_configuration_and_each_family(capsys):
    bench = _bench()
    summary = bench.main()
    out = capsys.readouterr().out
    rows = bench.published.hardware()
    assert sum(line.startswith("  ") and "x  " in line for line in out.splitlines()) == len(rows)
    for fam in ("b200", "gb200", "b300", "gb300", "mi325x", "mi355x", "mi350x", "mi300x"):
        n = sum(r["cluster"] == fam for r in rows)
        assert len(summary[fam]["all"]) + summary[fam]["refused"] == n > 0
    assert "AMD Instinct" in out and "unvalidated" in out


def test_held_out_hardware_rows_are_in_the_committed_split():
    bench = _bench()
    lines = set((ROOT / "benchmarks" / "data" / "held_out.txt").read_text().splitlines())
    ho = [r for r in bench.published.hardware() if bench.published.held_out(r)]
    assert ho and all(bench.published.split_key(r) in lines for r in ho)


def test_every_row_is_predicted_with_its_recipes_pipeline_split():
    """No row is refused: DeepSeek-V3's 61 layers are cut as NVIDIA's recipes cut them (Megatron-Bridge
    _get_deepseek_v3_pipeline_layout: pp 8 as 8 | 8 x 6 | 5, 16 chunks as 4 | 4 x 14 | 1, MTP and loss last)."""
    from tuner.pipeline_split import chunk_sizes
    bench = _bench()
    for r in bench.published.hardware():
        e = bench.evaluate(r)
        assert e["refused"] is None, (r["cluster"], r["model"], e["refused"])
    assert chunk_sizes(61, 8, 1, "light-last") == (8,) * 7 + (5,)
    assert chunk_sizes(61, 2, 8, "light-last") == chunk_sizes(61, 16, 1, "light-last") == (4,) * 15 + (1,)
