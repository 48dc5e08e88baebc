"""Docs speak to users: no heading of a page (docs/, the README, CONTRIBUTING.md) names an issue or a work item;
history goes to CHANGELOG.md."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGES = [*sorted((ROOT / "docs").rglob("*.md")), ROOT / "README.md", ROOT / "CONTRIBUTING.md"]
HEADING = re.compile(r"^#{1,6} (.*)$", re.MULTILINE)
FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)
"""A fenced code block: its lines starting with # are comments, not headings."""
NAMES_AN_ISSUE = re.compile(r"\bissues?\b|#\d+|\bwave \d+|\bstop \d+", re.IGNORECASE)


def test_no_heading_names_an_issue():
    offenders = [
        f"{page.relative_to(ROOT)}: {heading}"
        for page in PAGES
        for heading in HEADING.findall(FENCE.sub("", page.read_text()))
        if NAMES_AN_ISSUE.search(heading)
    ]
    assert not offenders, offenders


def test_the_rule_sees_a_heading_that_names_one():
    assert NAMES_AN_ISSUE.search("Concurrency sweep (issue 33)") and NAMES_AN_ISSUE.search("Fix for #41")
    assert not NAMES_AN_ISSUE.search("Prefill budget: steady inter-token latency while prompts arrive")
