"""The house rule, for the library and the benchmarks alike: a module <= 400 lines, a function <= 60
(benchmarks/measure_memory_mcore.py was 1,200 lines with a 210-line _patch(), measure_memory_torchtitan.py 764 with
a 127-line measure(), published.py 512, tuner/perfmodel/memory.py 401, before this session's splits)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MODULES = sorted([*(ROOT / "tuner").rglob("*.py"), *(ROOT / "benchmarks").rglob("*.py")])


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(ROOT)))
def test_modules_and_functions_keep_the_house_size(path):
    text = path.read_text()
    assert len(text.splitlines()) <= 400, path.name
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            assert node.end_lineno - node.lineno + 1 <= 60, (path.name, node.name)


def test_the_rule_covers_the_measurement_packages():
    names = {p.relative_to(ROOT).as_posix() for p in MODULES}
    assert {"benchmarks/measure_memory_mcore.py", "benchmarks/measure_memory_torchtitan.py",
            "benchmarks/mcore_memory/step.py", "benchmarks/torchtitan_memory/step.py",
            "tuner/perfmodel/memory.py"} <= names
