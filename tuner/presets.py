"""Where spec files are: preset names, shipped presets and TOML reading.

A spec is named by a preset name (`gpt-175b`, alias `175b`; `frontier`) or by a path to a TOML file.
Names are looked up first in ./workloads/{models,clusters}/ of the working directory (so a file written
by `tuner calibrate` wins), then in the presets shipped inside the package: the repository's top-level
workloads/ and search_spaces/, which pyproject.toml maps onto the package `tuner._presets` (no copies),
read through importlib.resources so that editable and wheel installs both find them.
"""

from __future__ import annotations

import difflib
import tomllib
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path

from tuner.errors import SpecError, UnknownName

PRESET_PACKAGE = "tuner._presets"   # workloads/ and search_spaces/ at the repository root (pyproject package-dir)
PRESET_KINDS = ("models", "clusters", "search_spaces")
MODEL_ALIASES = {"1.4b": "gpt-1.4b", "22b": "gpt-22b", "175b": "gpt-175b", "1t": "gpt-1t"}


def read_toml(path: Path | Traversable | str) -> dict:
    try:
        with (Path(path) if isinstance(path, str) else path).open("rb") as f:
            return tomllib.load(f)
    except tomllib.TOMLDecodeError as exc:
        raise SpecError(f"{path}: malformed TOML: {exc}") from None
    except UnicodeDecodeError as exc:
        raise SpecError(f"{path}: not UTF-8 text (byte {exc.start}): TOML files must be UTF-8") from None
    except OSError as exc:
        raise SpecError(f"{path}: cannot read: {exc.strerror}") from None


def preset_dir(kind: str) -> Traversable:
    """The folder of the shipped presets of `kind` ('models', 'clusters' or 'search_spaces'), through
    importlib.resources (a file-system path in editable and wheel installs)."""
    if kind not in PRESET_KINDS:
        raise ValueError(f"unknown preset kind {kind!r}; one of {', '.join(PRESET_KINDS)}")
    if kind == "search_spaces":
        return _preset_package("search_spaces")
    return _preset_package("workloads") / kind


def _preset_package(sub: str) -> Traversable:
    try:
        return resources.files(f"{PRESET_PACKAGE}.{sub}")
    except ModuleNotFoundError:
        # a source checkout imported without being pip-installed (or installed before the presets moved
        # to the repository root, whose editable finder does not map them): the folder beside the package
        src = Path(__file__).resolve().parents[1] / sub
        if (src / "__init__.py").is_file():
            return src
        raise


def shipped_presets(kind: str) -> dict[str, Traversable]:
    """name -> file of every shipped preset of `kind`."""
    return {t.name[:-len(".toml")]: t for t in preset_dir(kind).iterdir() if t.name.endswith(".toml") and t.is_file()}


def shipped_preset_at(path: Path | str) -> str | None:
    """'cluster preset NAME' (or model, search space) when `path` is a shipped preset file, both paths
    resolved (links and '..' followed; in the repository root ./workloads/clusters/local.toml is one),
    else None. What `tuner calibrate` refuses to write over."""
    target = Path(path).resolve()
    for kind in PRESET_KINDS:
        for name, t in shipped_presets(kind).items():
            if isinstance(t, Path) and t.resolve() == target:   # only a file-system preset can be written over
                return f"{kind[:-1].replace('_', ' ')} preset '{name}'"
    return None


def presets(kind: str) -> list[str]:
    """Names of the shipped and local presets of `kind` ('models' or 'clusters')."""
    names = set(shipped_presets(kind))
    names |= {p.stem for p in (Path("workloads") / kind).glob("*.toml")}
    return sorted(names)


def find_spec_file(kind: str, name: str) -> Path | Traversable:
    if name.endswith(".toml") or "/" in name:
        p = Path(name)
        if not p.is_file():
            raise SpecError(f"{kind[:-1]} file {name} does not exist")
        return p
    name = MODEL_ALIASES.get(name.lower(), name) if kind == "models" else name
    bases = (Path("workloads") / kind, preset_dir(kind))
    for base in bases:
        p = base / f"{name}.toml"
        if p.is_file():
            return p
    for base in bases:                          # any case: llama3-70B, H100
        if base.is_dir():
            for p in base.iterdir():
                if p.name.lower() == f"{name.lower()}.toml" and p.is_file():
                    return p
    aliases = f" (aliases: {', '.join(MODEL_ALIASES)})" if kind == "models" else ""
    close = difflib.get_close_matches(name.lower(), [*presets(kind), *(MODEL_ALIASES if kind == "models" else ())],
                                      n=3, cutoff=0.6)
    guess = f"did you mean {' or '.join(close)}? " if close else ""
    raise UnknownName(f"unknown {kind[:-1]} '{name}'; {guess}presets: {', '.join(presets(kind))}{aliases}; "
                      "or give a path to a TOML file")
