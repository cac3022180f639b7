"""Sources cited inside the project exist (issue 12, item 14): every `reference/*.md` a module, cluster
file, benchmark or the README cites is a file of this repository, under docs/reference/."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CITATION = re.compile(r"(?<![\w/])((?:docs/)?reference/[\w.-]+\.md)")


def _cited() -> dict[str, list[str]]:
    files = [*ROOT.glob("tuner/**/*.py"), *ROOT.glob("workloads/**/*.toml"), *ROOT.glob("search_spaces/*.toml"),
             *ROOT.glob("benchmarks/*.py"),
             *ROOT.glob("docs/**/*.md"), ROOT / "README.md"]
    found: dict[str, list[str]] = {}
    for f in files:
        for ref in CITATION.findall(f.read_text(errors="replace")):
            found.setdefault(ref, []).append(str(f.relative_to(ROOT)))
    return found


def test_every_cited_reference_note_exists():
    cited = _cited()
    assert cited, "the performance model cites its formulas: the pattern found none"
    missing = {ref: where for ref, where in cited.items() if not (ROOT / ref).is_file()}
    assert missing == {}, f"cited but not in the repository: {missing}"


def test_the_cited_notes_are_the_ones_the_model_uses():
    cited = _cited()
    assert "docs/reference/formulas.md" in cited and "docs/reference/frontier-paper.md" in cited
    text = (ROOT / "docs/reference/formulas.md").read_text()
    assert "24·c·B·s·L·h²·(1 + s/(6h) + V/(16·L·h))" in text        # flops.py's Megatron count
    assert "fit it from two runs" in text                              # calibrate.py's quote


def test_every_command_has_a_runnable_example_in_the_readme():
    """Every user-visible command (and `db` subcommand) appears in a README code block as `tuner NAME ...`."""
    import click

    from tuner.cli import cli
    readme = (ROOT / "README.md").read_text()
    blocks = "\n".join(re.findall(r"```[a-z]*\n(.*?)```", readme, re.S))
    names = []
    for name, cmd in cli.commands.items():
        names += [f"{name} {sub}" for sub in cmd.commands] if isinstance(cmd, click.Group) else [name]
    missing = [n for n in names if not re.search(rf"(^|\s|\()tuner {n}\b", blocks, re.M)]
    assert missing == [], f"commands without an example in a README code block: {missing}"
