"""The documentation: every relative link in README.md, BENCHMARKS.md and docs/ resolves (to a
file, and to a heading where it names one), the generated reference pages are current, and the
README stays a front door."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

from tests.conftest import ROOT

PAGES = (ROOT / "README.md", ROOT / "BENCHMARKS.md", *sorted((ROOT / "docs").glob("*.md")))
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.M | re.S)
HEADING = re.compile(r"^#{1,6} +(.+?) *#*$", re.M)
README_MAX_LINES = 250


def slug(heading: str) -> str:
    """A heading's anchor as GitHub writes it: lower case, punctuation dropped, spaces as -."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    return {slug(h) for h in HEADING.findall(FENCE.sub("", page.read_text(encoding="utf-8")))}


def broken_links(page: Path) -> tuple[list[str], int]:
    """The relative links of ``page`` (outside code blocks) that do not resolve, and how many
    relative links it has."""
    broken, checked = [], 0
    for target in LINK.findall(FENCE.sub("", page.read_text(encoding="utf-8"))):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
            continue
        checked += 1
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        if not resolved.exists():
            broken.append(f"{target}: no such file")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            broken.append(f"{target}: no heading #{anchor}")
    return broken, checked


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_resolves(page):
    broken, _ = broken_links(page)
    assert not broken, f"{page.relative_to(ROOT)}: {broken}"


def test_the_docs_link_to_each_other():
    """The README and the docs index reach every reference page."""
    linked = {target.partition("#")[0]
              for page in (ROOT / "README.md", ROOT / "docs" / "README.md")
              for target in LINK.findall(page.read_text(encoding="utf-8"))}
    pages = {p.name for p in (ROOT / "docs").glob("*.md")} - {"README.md"}
    assert pages <= {Path(target).name for target in linked}


def test_the_link_check_finds_a_missing_file_and_heading(tmp_path):
    (tmp_path / "a.md").write_text("# Title\n\n## Some heading (`--opt`)\n")
    page = tmp_path / "b.md"
    page.write_text("[ok](a.md#some-heading---opt) [top](#b) [gone](c.md) [bad](a.md#nope)\n"
                    "```\n[in code](d.md)\n```\n[web](https://example.com)\n\n# B\n")
    broken, checked = broken_links(page)
    assert checked == 4
    assert broken == ["c.md: no such file", "a.md#nope: no heading #nope"]


def _generator(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_reason_table_is_generated_from_the_vocabulary():
    generator = _generator("gen_reason_table")
    assert generator.reason_table() in generator.DOC.read_text(encoding="utf-8")


def test_the_readme_is_a_front_door():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) < README_MAX_LINES
    assert "| option |" not in readme  # the options reference is docs/options.md
