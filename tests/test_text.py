"""README.md and docs/ read well raw: no prose line over 120 characters and no table row over 200
(docs/development.md). A heading's `{#anchor}` is not counted (it is not rendered); fenced code
is neither prose nor table (program output, commands) and has no limit here."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
PROSE, TABLE = 120, 200


def too_long(text: str) -> list[str]:
    """'LINE: N characters (the limit)' for every line over its limit."""
    out, fence = [], None
    for n, line in enumerate(text.splitlines(), 1):
        s = line.lstrip()
        if fence:
            if s.startswith(fence):
                fence = None
            continue
        if s.startswith(("```", "~~~")):
            fence = s[:3]
            continue
        if s.startswith("|"):
            limit = TABLE
        else:
            limit = PROSE
            if s.startswith("#"):
                line = re.sub(r"\s*\{#[\w-]+\}\s*$", "", line)
        if len(line) > limit:
            out.append(f"{n}: {len(line)} characters (limit {limit}): {line[:60]}...")
    return out


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_no_line_over_its_limit(page):
    long = too_long(page.read_text())
    assert not long, f"{page.relative_to(ROOT)}:\n" + "\n".join(long)


def test_the_rule_reads_tables_code_and_anchors():
    prose, row, code = "x" * 121, "|" + "x" * 150 + "|", "  " + "y" * 250
    text = (f"{prose}\n{row}\n```\n{code}\n```\n## {'h' * 110} {{#anchor-of-the-heading}}\n"
            f"- {'z' * 119}\n|{'w' * 200}|\n")
    assert [e.split(":")[0] for e in too_long(text)] == ["1", "7", "8"]
