"""The documentation stays a map: every relative link in README.md, docs/ and benchmarks/
resolves (the file, and the heading an anchor names), README.md and the scoreboard stay
short, and every script in benchmarks/ is either in its README's table or an experiment."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# The dated journal is kept as it was written, for history; the map is everything else.
PAGES = sorted(
    [ROOT / "README.md", ROOT / "benchmarks" / "README.md", ROOT / "benchmarks" / "RESULTS.md"]
    + [p for p in (ROOT / "docs").glob("*.md")]
)
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")


def _prose(text: str) -> str:
    """The text outside fenced code blocks and inline code, where links are links."""
    kept, fenced = [], False
    for line in text.split("\n"):
        if line.startswith("```"):
            fenced = not fenced
            continue
        if not fenced:
            kept.append(re.sub(r"`[^`]*`", "", line))
    return "\n".join(kept)


def _anchors(page: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces as hyphens."""
    anchors = set()
    fenced = False
    for line in page.read_text().split("\n"):
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and re.match(r"#{1,6} ", line):
            title = line.lstrip("#").strip().lower()
            anchors.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return anchors


def _links(page: Path) -> list[str]:
    return [t for t in LINK.findall(_prose(page.read_text())) if not re.match(r"\w+:", t)]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page: Path) -> None:
    broken = []
    for target in _links(page):
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        if not resolved.exists():
            broken.append(f"{target}: no such file")
        elif anchor and resolved.suffix == ".md" and anchor not in _anchors(resolved):
            broken.append(f"{target}: no heading with that anchor")
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)


def test_the_checker_sees_a_broken_link(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("# Title\n\n[ok](#title) [gone](missing.md) [bad](#nowhere) `[code](x.md)`\n")
    assert _links(page) == ["#title", "missing.md", "#nowhere"]
    assert _anchors(page) == {"title"}


def test_the_readme_links_into_every_docs_page() -> None:
    linked = {Path(t.partition("#")[0]).name for t in _links(ROOT / "README.md")}
    pages = {p.name for p in (ROOT / "docs").glob("*.md")}
    assert pages <= linked, f"docs pages the README does not link: {sorted(pages - linked)}"


@pytest.mark.parametrize("name", ["README.md", "benchmarks/RESULTS.md"])
def test_the_map_stays_short(name: str) -> None:
    lines = (ROOT / name).read_text().count("\n")
    assert lines <= 300, f"{name} has {lines} lines: details belong in docs/ or the journal"


def test_every_benchmark_script_is_listed_or_an_experiment() -> None:
    table = (ROOT / "benchmarks" / "README.md").read_text().split("## Experiments")[0]
    listed = set(re.findall(r"^\| `([\w.]+)`", table, re.MULTILINE))
    scripts = {p.name for p in (ROOT / "benchmarks").iterdir() if p.suffix in (".py", ".sh")}
    assert scripts - listed == set(), "add them to benchmarks/README.md or move to experiments/"
    assert listed <= scripts, f"listed but missing: {sorted(listed - scripts)}"
