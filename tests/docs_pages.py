"""Where the documentation lives: README.md (the runbook) and the pages of the site under docs/ (mkdocs.yml).
Tests that read or run what the documentation says find its pages here."""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"


def page(name: str) -> str:
    """The text of one page of the site, e.g. page("commands/scale.md")."""
    return (DOCS / name).read_text()


def pages() -> list[Path]:
    """README.md and every Markdown page under docs/."""
    return [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]


def all_text() -> str:
    return "\n".join(p.read_text() for p in pages())


def code_blocks(text: str, lang: str = "[a-z]*") -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", text, re.S)


def slug(heading: str) -> str:
    """The anchor Python-Markdown's toc gives a heading (what mkdocs checks links against)."""
    text = re.sub(r"[`*]", "", heading)
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode()
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def anchors(text: str) -> set[str]:
    prose = re.sub(r"```.*?```", "", text, flags=re.S)
    return {slug(h) for h in re.findall(r"^#{1,6} (.+)$", prose, re.M)}


def links(text: str) -> list[str]:
    """Targets of Markdown links and images outside code (inline code and fenced blocks left out)."""
    prose = re.sub(r"`[^`\n]*`", "", re.sub(r"```.*?```", "", text, flags=re.S))
    return re.findall(r"!?\[[^\]]*\]\(([^)\s]+)\)", prose)
