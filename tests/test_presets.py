"""The shipped presets (issue 12, item 13): the repository's top-level workloads/ and search_spaces/,
mapped by pyproject.toml onto `tuner._presets` (no copies), read through importlib.resources, so an
editable install and a wheel both find them from any directory."""

from __future__ import annotations

import importlib.resources
import importlib.util
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from tuner.space import load_space
from tuner.presets import preset_dir, presets, shipped_preset_at, shipped_presets
from tuner.specs import load_cluster, load_model

ROOT = Path(__file__).resolve().parents[1]
MODELS = {"gpt-1.4b", "gpt-22b", "gpt-175b", "gpt-1t", "tiny", "small"}
CLUSTERS = {"frontier", "a100", "h100", "local", "local-slurm"}


def _tomls(traversable) -> set[str]:
    return {t.name for t in traversable.iterdir() if t.name.endswith(".toml")}


def test_presets_are_package_resources():
    workloads = importlib.resources.files("tuner._presets.workloads")
    assert _tomls(workloads / "models") >= {f"{m}.toml" for m in MODELS}
    assert _tomls(workloads / "clusters") >= {f"{c}.toml" for c in CLUSTERS}
    assert "default.toml" in _tomls(importlib.resources.files("tuner._presets.search_spaces"))
    assert set(shipped_presets("models")) >= MODELS and set(shipped_presets("clusters")) >= CLUSTERS
    assert str(preset_dir("clusters")) == str(workloads / "clusters")


def test_presets_load_from_an_unrelated_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)                      # no ./workloads/ or ./search_spaces/ here
    assert load_model("175b").num_layers == 96 and load_cluster("frontier").gpus_per_node == 8
    assert load_space().name == "default" and load_space("search_spaces/default.toml").name == "default"
    assert set(presets("models")) >= MODELS and set(presets("clusters")) >= CLUSTERS
    (tmp_path / "workloads" / "clusters").mkdir(parents=True)      # a local file still wins over the preset
    (tmp_path / "workloads" / "clusters" / "frontier.toml").write_text(
        (preset_dir("clusters") / "frontier.toml").read_text().replace("gpus_per_node = 8", "gpus_per_node = 4"))
    assert load_cluster("frontier").gpus_per_node == 4


def test_shipped_preset_at_resolves_paths(tmp_path, monkeypatch):
    frontier = Path(str(shipped_presets("clusters")["frontier"]))
    assert shipped_preset_at(frontier) == "cluster preset 'frontier'"
    monkeypatch.chdir(frontier.parents[2])          # where ./workloads/clusters/ IS the presets' folder
    assert shipped_preset_at("workloads/clusters/../clusters/frontier.toml") == "cluster preset 'frontier'"
    assert shipped_preset_at("search_spaces/default.toml") == "search space preset 'default'"
    link = tmp_path / "f.toml"
    link.symlink_to(frontier)
    assert shipped_preset_at(link) == "cluster preset 'frontier'"
    assert shipped_preset_at(tmp_path / "frontier.toml") is None


def test_no_preset_is_duplicated_in_the_repository():
    assert not (ROOT / "tuner" / "workloads").exists() and not (ROOT / "tuner" / "search_spaces").exists()
    assert not list((ROOT / "tuner").rglob("*.toml"))
    assert (ROOT / "workloads" / "clusters" / "frontier.toml").is_file()


def test_pyproject_ships_every_package_and_the_presets():
    """The package list is explicit (a package-dir mapping needs it): it must name every package under
    tuner/, map the presets' folders, and every package-data glob must match a file."""
    tool = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    on_disk = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "tuner").rglob("__init__.py")}
    mapped = {"tuner._presets.workloads": "workloads", "tuner._presets.search_spaces": "search_spaces"}
    assert set(tool["packages"]) == on_disk | set(mapped)
    assert tool["package-dir"] == mapped
    for package, globs in tool["package-data"].items():
        base = ROOT / mapped.get(package, package.replace(".", "/"))
        for glob in globs:
            assert list(base.glob(glob)), f"package-data {package}: {glob} matches nothing"


@pytest.mark.skipif(importlib.util.find_spec("setuptools") is None, reason="setuptools is not installed")
def test_the_wheel_carries_the_presets(tmp_path):
    """Built from a copy of the sources (no build/ in the repository), without network."""
    src = tmp_path / "src"
    src.mkdir()
    subprocess.run(["cp", "-r", *(str(ROOT / p) for p in ("pyproject.toml", "README.md", "tuner", "workloads",
                                                         "search_spaces")), str(src)], check=True)
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", str(src),
                        "-w", str(tmp_path / "w")], capture_output=True, text=True, timeout=300)
    if r.returncode and "setuptools>=" in r.stderr:
        pytest.skip(f"this setuptools cannot build from pyproject.toml: {r.stderr.strip()[-200:]}")
    assert r.returncode == 0, r.stderr
    names = set(zipfile.ZipFile(next((tmp_path / "w").glob("tuner-*.whl"))).namelist())
    assert {f"tuner/_presets/workloads/models/{m}.toml" for m in MODELS} <= names
    assert {f"tuner/_presets/workloads/clusters/{c}.toml" for c in CLUSTERS} <= names
    assert "tuner/_presets/search_spaces/default.toml" in names
    assert {"tuner/cli/__init__.py", "tuner/runners/harness/__init__.py", "tuner/store/__init__.py"} <= names
    assert not any(n.startswith(("workloads/", "search_spaces/", "tuner/workloads/")) for n in names)
