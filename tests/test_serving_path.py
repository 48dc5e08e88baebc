"""Ship the engine, not the workshop: test oracles and random-checkpoint writers live in diffuserve/reference, the
trainer in scripts/training, and nothing that serves (engine, model, server, CLI, eval) imports either. Only
`diffuserve bench` may use diffuserve.reference (its compare reference and synthetic models)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAY_IMPORT_TESTING = ("bench", "reference")
SERVING_MODULES = (
    "diffuserve",
    "diffuserve.cli.main",
    "diffuserve.llm",
    "diffuserve.engine.llm_engine",
    "diffuserve.worker.model_runner",
    "diffuserve.model.loader",
    "diffuserve.server.app",
    "diffuserve.cli.eval",
    "diffuserve.eval.harness",
)


def test_no_serving_source_names_the_workshop():
    offenders = []
    for path in sorted((ROOT / "diffuserve").rglob("*.py")):
        if path.relative_to(ROOT / "diffuserve").parts[0] in MAY_IMPORT_TESTING:
            continue
        text = path.read_text()
        if "diffuserve.reference" in text or "scripts.training" in text:
            offenders.append(str(path.relative_to(ROOT)))
    assert not offenders, f"serving code imports test or training code: {offenders}"


def test_importing_the_serving_path_loads_no_workshop_module():
    code = (
        f"import importlib, sys\nfor name in {SERVING_MODULES!r}: importlib.import_module(name)\n"
        "print(sorted(m for m in sys.modules if m.startswith(('diffuserve.reference', 'scripts'))))"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]", result.stdout


def test_serving_clover_never_loads_its_dense_reading(tmp_path):
    """Clover's whole-sequence reading (model/families/clover_moe/dense.py) is the oracles': an engine serving a
    Clover checkpoint runs without it."""
    code = (
        "import sys\n"
        "from diffuserve import LLM, SamplingParams\n"
        "from diffuserve.reference.clover_moe_checkpoint import make_clover_moe_config, write_clover_moe_checkpoint\n"
        f"path = write_clover_moe_checkpoint({str(tmp_path / 'm')!r}, make_clover_moe_config(), seed=0)\n"
        "LLM(str(path), max_model_len=64).generate([[5, 6, 7]], SamplingParams(max_tokens=4, ignore_eos=True))\n"
        "print('diffuserve.model.families.clover_moe.dense' in sys.modules)"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "False", result.stdout


def test_the_reference_decode_never_imports_the_engine():
    """The oracle shares only the model's forward with the engine (docs/internals/testing.md). Its input type,
    SamplingParams, validates with diffuserve/errors.py's RequestError, outside the engine: no engine module loads."""
    engine_side = ("diffuserve.engine", "diffuserve.decoding", "diffuserve.worker", "diffuserve.core")
    paths = sorted((ROOT / "diffuserve" / "reference").glob("reference_*.py"))
    assert paths, "no reference decode found"
    for path in paths:
        assert not any(name in path.read_text() for name in engine_side), path.name
    code = (
        "import sys, diffuserve.reference.reference_decode\n"
        f"print(sorted(m for m in sys.modules if m.startswith({engine_side!r})))"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert ast.literal_eval(result.stdout) == [], result.stdout
