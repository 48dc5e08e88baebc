"""The planner is pure Python: importing it (and running it) never loads torch."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PLANNER_MODULES = (
    "diffuserve.planner",
    "diffuserve.cli.plan",
    "diffuserve.planner.calibrate",
    "diffuserve.planner.chart",
    "diffuserve.planner.report",
)


def _python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_planner_modules_never_import_torch():
    """The planner's own imports, with the parent package stubbed so only planner code runs."""
    code = (
        "import importlib, sys, types\n"
        "package = types.ModuleType('diffuserve'); package.__path__ = ['diffuserve']\n"
        "sys.modules['diffuserve'] = package\n"
        f"for name in {PLANNER_MODULES!r}: importlib.import_module(name)\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
    )
    result = _python(code)
    assert result.returncode == 0, result.stderr


def test_import_diffuserve_planner_does_not_import_torch():
    """As users import it: `import diffuserve.planner` must not pull torch in through `diffuserve/__init__`."""
    result = _python("import sys, diffuserve.planner; print('torch' in sys.modules)")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False", "importing diffuserve.planner loaded torch (see diffuserve/__init__.py)"
