"""The documentation site's strict build (mkdocs.yml, run by CI) fails on a broken link: a copy of docs/ with a link
to a missing page and one to a missing anchor is refused, naming both and nothing else (so the real docs build
clean and the failure is the breakage's)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SITE_INPUTS = ("mkdocs.yml", "CONTRIBUTING.md")
"""What the build reads besides docs/: its configuration, and the file a page includes (internals/contributing.md)."""


def test_strict_build_fails_on_a_broken_link_and_anchor(tmp_path: Path):
    pytest.importorskip("material", reason="mkdocs-material is not installed (the `docs` extra)")
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    for name in SITE_INPUTS:
        shutil.copy(ROOT / name, tmp_path / name)
    index = tmp_path / "docs" / "index.md"
    index.write_text(index.read_text() + "\n[gone](no-such-page.md) and [lost](models/index.md#no-such-heading)\n")
    build = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    warnings = [line for line in build.stderr.splitlines() if line.startswith("WARNING")]
    assert build.returncode != 0, build.stderr[-2000:]
    assert "Traceback" not in build.stderr, build.stderr[-2000:]  # refused by the link check, not crashed
    assert len(warnings) == 2, warnings
    assert re.search(r"no-such-page\.md", warnings[0] + warnings[1])
    assert re.search(r"no-such-heading", warnings[0] + warnings[1])
