"""The family x option matrix (diffuserve/reference/option_matrix.py): each cell gives the family's independent
reference tokens under its option(s), or is refused before any step with one line naming the option; no cell
fails inside a step. The fast cells run here; the others (worker processes, compilation, the pairs of the families
besides sdar_moe and clover_moe) are marked slow and skipped unless DIFFUSERVE_FULL_MATRIX=1: scripts/
option_matrix.py runs them all and its run fills the table in docs/internals/testing.md, which the last test checks."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from diffuserve.reference.matrix_families import FAMILIES
from diffuserve.reference.option_matrix import Cell, cells, run_cell

CELLS = cells()


@pytest.fixture(scope="module")
def family_dirs(tmp_path_factory) -> Callable[[str], Path]:
    """family -> its checkpoint directory, written on first use (a run of some cells writes only theirs)."""
    root = tmp_path_factory.mktemp("matrix")
    written: dict[str, Path] = {}

    def get(family: str) -> Path:
        if family not in written:
            written[family] = FAMILIES[family].write(root / family)
        return written[family]

    return get


FULL = os.environ.get("DIFFUSERVE_FULL_MATRIX") == "1"
"""Run every cell here too (the script's cells: worker processes, compilation, the other families' pairs)."""


def _marks(cell: Cell) -> list:
    marks = []
    if cell.slow:
        marks += [pytest.mark.slow, pytest.mark.skipif(not FULL, reason="scripts/option_matrix.py runs it")]
    if cell.family == "diffusion_gemma":
        marks.append(pytest.mark.hf)
    return marks


@pytest.mark.parametrize("cell", [pytest.param(c, id=c.id, marks=_marks(c)) for c in CELLS])
def test_cell_matches_its_reference_or_is_refused(cell: Cell, family_dirs):
    if cell.family == "diffusion_gemma":
        pytest.importorskip("transformers")
    result = run_cell(cell, family_dirs(cell.family))
    assert not result.outcome.startswith("FAIL"), result.outcome


def test_the_table_in_the_docs_is_of_this_matrix():
    """docs/internals/testing.md's table comes from docs/results/option-matrix.json (scripts/render_docs.py): a run
    of every cell as the matrix is defined now, none failed (rerun scripts/option_matrix.py after changing it)."""
    recorded = json.loads((Path(__file__).parents[1] / "docs/results/option-matrix.json").read_text())["result"]
    assert [(c["family"], tuple(c["options"])) for c in recorded["cells"]] == [(c.family, c.options) for c in CELLS]
    assert recorded["failed"] == 0 and not [c for c in recorded["cells"] if c["outcome"].startswith("FAIL")]
