"""Every file path a docstring of the package names exists: a path moved or renamed in the code must be moved in
the docstrings that cite it. A path is looked up from the repository root, the package, the package's model
families, and the citing module's own folder and the folders above it; only the paths of other projects' sources,
listed here with whose they are, are not ours to check."""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "diffuserve"
PATH = re.compile(r"\b([A-Za-z_][\w.-]*(?:/[\w.-]+)+\.(?:py|md|json|sh|html|js|css))\b")
OTHER_PROJECTS = {
    "flashinfer/prefill.py": "FlashInfer's own source (model/layers/attention_backends/flashinfer.py cites it)",
}


def _docstrings(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    nodes = [tree, *(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef))]
    return [doc for doc in (ast.get_docstring(n) for n in nodes) if doc]


def _exists(cited: str, module: Path) -> bool:
    bases = [REPO, PACKAGE, PACKAGE / "model" / "families", *module.parents]
    return any((base / cited).exists() for base in bases if REPO in (base, *base.parents))


def test_every_path_a_docstring_names_exists():
    missing = []
    for module in sorted(PACKAGE.rglob("*.py")):
        for doc in _docstrings(module):
            for cited in PATH.findall(doc):
                if cited.startswith(("http", "www.")) or cited in OTHER_PROJECTS:
                    continue
                if not _exists(cited, module):
                    missing.append(f"{module.relative_to(REPO)}: {cited}")
    assert not missing, "docstrings cite paths that do not exist:\n" + "\n".join(missing)
