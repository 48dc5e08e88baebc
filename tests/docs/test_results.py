"""The result tables in the docs are generated from docs/results/ (scripts/render_docs.py): each doc must equal
its re-rendering, every table must have its region and every results file must be a traceable record."""

from __future__ import annotations

import copy
import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("render_docs", ROOT / "scripts" / "render_docs.py")
assert _spec is not None and _spec.loader is not None
render_docs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(render_docs)

DOCS = {name: (ROOT / "docs" / name).read_text() for name in render_docs.DOCS}
RESULTS = sorted(render_docs.RESULTS.glob("*.json"))
PAGES = [path.read_text() for path in (ROOT / "docs").rglob("*.md")]


@pytest.mark.parametrize("doc", sorted(DOCS))
def test_doc_tables_equal_their_results(doc):
    assert render_docs.render(DOCS[doc]) == DOCS[doc], (
        f"docs/{doc} differs from docs/results: run `python scripts/render_docs.py` (never edit a table by hand)"
    )


def test_a_changed_result_changes_the_doc():
    """The comparison above can fail: one value changed in a results file shows in its table."""
    original = render_docs.load_results("eval")
    changed = copy.deepcopy(original)
    changed["result"]["results"][0]["accuracy"] = 0.5

    def load(name: str) -> dict:
        return changed if name == "eval" else render_docs.load_results(name)

    rendered = render_docs.render(DOCS["models/bundled.md"], load)
    assert rendered != DOCS["models/bundled.md"] and "| 50.0 % |" in rendered


def test_every_table_has_one_region_and_every_region_a_table():
    regions = [m.group(2) for text in DOCS.values() for m in render_docs.REGION.finditer(text)]
    assert sorted(regions) == sorted(render_docs.TABLES)
    with pytest.raises(KeyError, match="no such table"):
        render_docs.render("<!-- results:nope -->\n<!-- /results:nope -->")


@pytest.mark.parametrize("path", RESULTS, ids=[p.stem for p in RESULTS])
def test_results_files_are_records_the_docs_cite(path):
    data = json.loads(path.read_text())
    assert isinstance(data["command"], str) and isinstance(data["result"], dict)
    assert data.get("provenance", "transcribed").startswith("transcribed"), "provenance says how it was made"
    assert any(path.name in text for text in PAGES), f"no page of docs/ cites docs/results/{path.name}"


def test_record_stores_the_last_json_line_with_its_command(tmp_path, monkeypatch):
    monkeypatch.setattr(render_docs, "RESULTS", tmp_path)
    output = tmp_path / "out.txt"
    output.write_text('table\n{"bench": "moe", "x": 1}\n{"bench": "moe", "x": 2}\n')
    path = render_docs.record("moe-new", output, ["diffuserve", "bench", "moe", "--threads", "1"])
    data = json.loads(path.read_text())
    assert (data["command"], data["result"]) == ("diffuserve bench moe --threads 1", {"bench": "moe", "x": 2})
    output.write_text("no json\n")
    with pytest.raises(SystemExit, match="holds no JSON line"):
        render_docs.record("moe-new", output, ["x"])
