"""Sources cited inside the project exist (issue 12, item 14): every `reference/*.md` a module, cluster
file, benchmark or the README cites is a file of this repository, under docs/reference/."""

from __future__ import annotations

import re

from tests.docs_pages import DOCS, ROOT, anchors, code_blocks, links, page, pages

CITATION = re.compile(r"(?<![\w/])((?:docs/)?reference/[\w.-]+\.md)")


def _cited() -> dict[str, list[str]]:
    files = [*ROOT.glob("tuner/**/*.py"), *ROOT.glob("workloads/**/*.toml"), *ROOT.glob("search_spaces/*.toml"),
             *ROOT.glob("benchmarks/*.py"),
             *pages()]
    found: dict[str, list[str]] = {}
    for f in files:
        for ref in CITATION.findall(f.read_text(errors="replace")):
            found.setdefault(ref, []).append(str(f.relative_to(ROOT)))
    return found


def test_every_cited_reference_note_exists():
    cited = _cited()
    assert cited, "the performance model cites its formulas: the pattern found none"
    found = lambda ref, where: (ROOT / ref).is_file() or (ROOT / where).parent.joinpath(ref).is_file()  # docs: relative
    missing = {ref: where for ref, where in cited.items() if not all(found(ref, w) for w in where)}
    assert missing == {}, f"cited but not in the repository: {missing}"


def test_the_cited_notes_are_the_ones_the_model_uses():
    cited = _cited()
    assert "docs/reference/formulas.md" in cited and "docs/reference/frontier-paper.md" in cited
    text = (ROOT / "docs/reference/formulas.md").read_text()
    assert "24·c·B·s·L·h²·(1 + s/(6h) + V/(16·L·h))" in text        # flops.py's Megatron count
    assert "fit it from two runs" in text                              # calibrate.py's quote


def test_every_command_has_a_runnable_example_in_the_docs():
    """Every user-visible command (and `db` subcommand) appears in a code block of the README or a page of
    the docs site as `tuner NAME ...`."""
    import click

    from tuner.cli import cli
    blocks = "\n".join(b for p in pages() for b in code_blocks(p.read_text()))
    names = []
    for name, cmd in cli.commands.items():
        names += [f"{name} {sub}" for sub in cmd.commands] if isinstance(cmd, click.Group) else [name]
    missing = [n for n in names if not re.search(rf"(^|\s|\()tuner {n}\b", blocks, re.M)]
    assert missing == [], f"commands without an example in a README or docs/ code block: {missing}"


def test_every_internal_link_of_the_docs_leads_somewhere():
    """README and docs/ pages: a relative link names a file that exists, and its #anchor a heading there
    (mkdocs build --strict checks the site's pages the same way; this runs without mkdocs)."""
    broken = []
    for p in pages():
        for target in links(p.read_text()):
            if re.match(r"[a-z]+:", target):
                continue                                   # https:, mailto:
            path, _, anchor = target.partition("#")
            dest = (p.parent / path).resolve() if path else p
            if not dest.exists():
                broken.append(f"{p.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest.read_text()):
                broken.append(f"{p.relative_to(ROOT)}: {target} (no such heading)")
    assert broken == []


def test_the_site_lists_every_page_and_every_listed_page_exists():
    nav = re.findall(r"^\s*-\s+(?:[^:\n]+:\s+)?([\w/.-]+\.md)\s*$", (ROOT / "mkdocs.yml").read_text(), re.M)
    on_disk = sorted(str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md"))
    assert sorted(nav) == on_disk


def test_the_site_and_the_readme_give_the_same_set_up_commands():
    readme = code_blocks((ROOT / "README.md").read_text(), "bash")[:2]
    assert len(readme) == 2 and "pip install -e ." in readme[0] and "python -m pytest" in readme[1]
    assert code_blocks(page("index.md"), "bash")[:2] == readme


def test_the_readme_first_day_commands_run_and_print_what_it_shows(tuner):
    """The README's first-day sessions, run in order in a fresh directory: each command exits 0 and prints
    the first line the README shows for it (store paths aside)."""
    import shlex
    readme = (ROOT / "README.md").read_text()
    day = readme[readme.index("## A first day"):readme.index("## Where to read on")]
    sessions = code_blocks(day, "console")
    assert len(sessions) == 7
    same = lambda s: re.sub(r"sqlite:///\S+", "STORE", re.sub(r" in [\d.]+ m?s\b.*", "", s)).strip()
    for session in sessions:
        command, first = session.splitlines()[:2]
        code, out, err = tuner(*shlex.split(command.removeprefix("$ tuner ")))
        assert code == 0, (command, err)
        assert same(first) in [same(line) for line in (err + out).splitlines()], (command, first, out, err)


def shown_commands(*verbs: str) -> list[tuple[str, str, str]]:
    """(page, command, its comment) of every `tuner VERB ...` line in a bash block of the README or docs/
    (continued lines joined)."""
    found = []
    for p in pages():
        for block in code_blocks(p.read_text(), "bash"):
            for line in block.replace("\\\n", " ").splitlines():
                command, _, comment = line.partition(" #")
                if re.match(rf"tuner ({'|'.join(verbs)}) ", command):
                    found.append((str(p.relative_to(ROOT)), " ".join(command.split()), comment.strip()))
    return found


def test_every_predict_and_plan_example_of_the_docs_runs(tuner, monkeypatch):
    """The model's examples (predict, plan: a few seconds in all) run as shown, from the repository root:
    exit 0, or, where the example's comment shows a refusal ("# ...; use more nodes: ..."), exit 2 with
    the words the comment shows."""
    import shlex
    examples = shown_commands("predict", "plan")
    assert len(examples) >= 20
    monkeypatch.chdir(ROOT)
    for page_name, command, comment in examples:
        code, out, err = tuner(*shlex.split(command)[1:])
        if comment.startswith("..."):
            words = [w.strip(" ;") for w in comment.split("...") if w.strip(" ;")]
            assert code == 2 and all(w in err for w in words), (page_name, command, comment, err)
        else:
            assert code == 0, (page_name, command, err)
