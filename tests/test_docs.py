"""The README is a front door of at most 300 lines, and every relative link and heading anchor in
the README and the manual (docs/*.md, and the READMEs of deploy/ and benchmarks/) resolves."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = sorted(
    [
        ROOT / "README.md",
        *(ROOT / "docs").glob("*.md"),
        *(ROOT / d / "README.md" for d in ("deploy", "benchmarks")),
    ],
    key=lambda p: str(p),
)
FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
CODE_SPAN = re.compile(r"(`+)(?!`).*?(?<!`)\1", re.S)
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$", re.M)


def _prose(text: str) -> str:
    """The text outside fenced blocks and inline code, where links are links."""
    return CODE_SPAN.sub("", FENCE.sub("", text))


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, inline markup and punctuation dropped (hyphens
    and underscores kept), spaces made hyphens."""
    text = re.sub(r"`([^`]*)`", r"\1", heading)
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link: its text
    text = re.sub(r"[*_]{2}([^*_]+)[*_]{2}", r"\1", text)
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> list[str]:
    return [slug(h) for _, h in HEADING.findall(FENCE.sub("", page.read_text()))]


def test_the_readme_is_a_front_door_of_at_most_300_lines() -> None:
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 300, f"README.md has {len(lines)} lines; the manual belongs in docs/"


def test_the_readme_keeps_its_test_command() -> None:
    """CI runs "the README's test command" (.ci/run): it must be there to read."""
    readme = (ROOT / "README.md").read_text()
    assert "\npython -m pytest\n" in readme
    assert "python -m pytest" in (ROOT / ".ci" / "run").read_text()


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_heading_of_a_page_has_its_own_anchor(page: Path) -> None:
    found = anchors(page)
    assert len(found) == len(set(found)), sorted(a for a in found if found.count(a) > 1)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_and_anchor_resolves(page: Path) -> None:
    broken = []
    for target in LINK.findall(_prose(page.read_text())):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        if not resolved.exists():
            broken.append(f"{target}: no such file")
            continue
        if anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            broken.append(f"{target}: no heading with anchor #{anchor}")
        elif anchor and resolved.suffix != ".md":
            broken.append(f"{target}: an anchor into a file that is not Markdown")
    assert not broken, f"{page.name}: " + "; ".join(broken)


def test_the_checker_sees_links_anchors_and_broken_ones(tmp_path: Path) -> None:
    """The checks above would pass on a checker that found nothing: it finds these."""
    page = tmp_path / "page.md"
    page.write_text(
        "# A page's `title`: here\n\n[ok](#a-pages-title-here) [gone](#nope) "
        "[file](missing.md) `[code](ignored.md)`\n\n```\n[fenced](ignored.md)\n```\n"
    )
    assert anchors(page) == ["a-pages-title-here"]
    assert LINK.findall(_prose(page.read_text())) == ["#a-pages-title-here", "#nope", "missing.md"]
    with pytest.raises(AssertionError, match="#nope.*missing.md: no such file"):
        test_every_relative_link_and_anchor_resolves(page)
    assert slug("`partitioned_job`") == "partitioned_job"
    assert slug("Your application's resources") == "your-applications-resources"
    assert slug("The longer soak: `dbcluster chaos`") == "the-longer-soak-dbcluster-chaos"
