"""A model family is one folder (model/families/<name>/), and nothing generic depends on one:

- no module of the engine, the decoders, the worker, the core or the shared layers imports a family or names one
  in code (an identifier, an attribute, a string): prose may cite a family as the source of a rule, code may not;
- `import diffuserve`, the offline API, the engine and the CLI's entry point load no family module (the planner
  loads the one torch-free config parser it plans hybrid models with);
- running an SDAR checkpoint loads the sdar family and no other (the registry imports a family only when a
  checkpoint names it);
- every family folder registers itself through one record (`family.py: FAMILY`), found by the registry's name,
  and a family defined outside the package is served once the registry's table names it (the one shared edit).
"""

from __future__ import annotations

import ast
import dataclasses
import json
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest

import diffuserve
from diffuserve import LLM, SamplingParams
from diffuserve.model import registry
from diffuserve.model.families.sdar.model import SDARForBlockDiffusion
from diffuserve.model.layers.mlp import SwiGLU
from diffuserve.reference.random_checkpoint import make_config, write_random_checkpoint

PACKAGE = Path(diffuserve.__file__).parent
GENERIC = ("engine", "decoding", "worker", "core", "model/layers")
FAMILY_WORD = re.compile(r"clover|gemma|llada|sdar|qwen", re.IGNORECASE)
FAMILIES = sorted(p.name for p in (PACKAGE / "model" / "families").iterdir() if (p / "family.py").exists())


def _docstrings(tree: ast.AST) -> set[int]:
    """ids of the string constants that are docstrings (module, class, function) or attribute docstrings."""
    ids = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list):
            for statement in body:
                if isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant):
                    ids.add(id(statement.value))
    return ids


def family_names_in_code(path: Path) -> list[str]:
    """Every import, identifier, attribute or (non-docstring) string in `path` that names a family."""
    tree = ast.parse(path.read_text(), str(path))
    prose = _docstrings(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and "families" in node.module.split("."):
            found.append(f"imports {node.module}")
        words = []
        if isinstance(node, ast.Import | ast.ImportFrom):
            words = [alias.asname or alias.name for alias in node.names] + [getattr(node, "module", "") or ""]
        elif isinstance(node, ast.Name):
            words = [node.id]
        elif isinstance(node, ast.Attribute):
            words = [node.attr]
        elif isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            words = [node.name]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in prose:
            words = [node.value]
        found += [f"line {node.lineno}: {w!r}" for w in words if FAMILY_WORD.search(w)]
    return found


def test_the_checker_sees_a_family_in_code_but_not_in_prose(tmp_path):
    path = tmp_path / "m.py"
    path.write_text('"""As the SDAR reference does."""\nx = 1  # clover\n')
    assert family_names_in_code(path) == []
    path.write_text("from diffuserve.model.families.clover_moe.model import X\nmode = 'llada2'\n")
    assert len(family_names_in_code(path)) == 3


@pytest.mark.parametrize("folder", GENERIC)
def test_no_generic_module_names_a_family(folder):
    offenders = {}
    for path in sorted((PACKAGE / folder).rglob("*.py")):
        if FAMILY_WORD.search(path.stem):
            offenders[str(path.relative_to(PACKAGE))] = ["the file is named after a family"]
        elif found := family_names_in_code(path):
            offenders[str(path.relative_to(PACKAGE))] = found
    assert offenders == {}


def _families_loaded(code: str) -> list[str]:
    script = code + "\nimport sys, json\nprint(json.dumps(sorted({m.split('.')[3] for m in sys.modules"
    script += " if m.startswith('diffuserve.model.families.')})))"
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_the_public_api_and_the_engine_load_no_family():
    assert (
        _families_loaded("import diffuserve, diffuserve.llm, diffuserve.engine.llm_engine, diffuserve.cli.main") == []
    )


def test_the_planner_loads_only_the_torch_free_config_parser_it_plans_with():
    """The planner (and the server's plan API through it) reads Clover's config.json spellings to plan hybrid
    models: that parser only, never a model module."""
    script = "import sys, diffuserve.planner.plan\nprint(sorted(m for m in sys.modules if '.families.' in m))"
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    family = "diffuserve.model.families.clover_moe"
    assert result.stdout.strip() == str([family, f"{family}.config"])  # the family's (empty) package, its parser


def test_an_sdar_checkpoint_loads_only_the_sdar_family(tiny_model_dir):
    code = (
        "from diffuserve import LLM, SamplingParams\n"
        f"llm = LLM({str(tiny_model_dir)!r})\n"
        "llm.generate({'prompt_token_ids': [5, 6, 7]}, SamplingParams(max_tokens=4))"
    )
    assert json.loads((tiny_model_dir / "config.json").read_text())["architectures"][0].startswith("SDAR")
    assert _families_loaded(code) == ["sdar"]


def test_every_family_folder_is_registered_by_its_record():
    assert sorted(set(registry.ARCHITECTURES.values())) == FAMILIES
    for name in FAMILIES:
        assert registry.load_family(name).name == name


class DenseOnly(SDARForBlockDiffusion):
    """A family of the test's own: every layer a dense SwiGLU, whatever the config says of experts."""

    def make_mlp(self, args, layer_id):
        return SwiGLU(args.hidden_size, args.intermediate_size)


def test_a_family_defined_outside_the_package_needs_only_its_record_and_the_registry_table(tmp_path, monkeypatch):
    """Adding a family edits no shared file except the registry's table: a family whose folder (here a module
    object standing in for `model/families/dense_only/`) holds its record is served once one architecture name
    points at it. On a dense checkpoint it is the sdar model's math, so it gives the sdar family's tokens."""
    config = make_config("sdar-moe-tiny", num_experts=0, intermediate_size=96, block_length=4)
    sdar_dir = write_random_checkpoint(tmp_path / "sdar", config, seed=3)
    sdar = registry.load_family("sdar")
    folder = types.ModuleType("diffuserve.model.families.dense_only")
    record = types.ModuleType("diffuserve.model.families.dense_only.family")
    record.FAMILY = dataclasses.replace(sdar, name="dense_only", model_cls=DenseOnly)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, folder.__name__, folder)
    monkeypatch.setitem(sys.modules, record.__name__, record)
    monkeypatch.setitem(registry.ARCHITECTURES, "DenseOnlyLM", "dense_only")
    toy_dir = write_random_checkpoint(tmp_path / "toy", {**config, "architectures": ["DenseOnlyLM"]}, seed=3)
    prompts = [{"prompt_token_ids": [5, 6, 7]}, {"prompt_token_ids": list(range(10, 25))}]
    params = SamplingParams(max_tokens=8, ignore_eos=True)
    toy = LLM(str(toy_dir))
    assert isinstance(toy.engine.runner.model, DenseOnly)
    got = [o.outputs[0].token_ids for o in toy.generate(prompts, params)]
    expected = [o.outputs[0].token_ids for o in LLM(str(sdar_dir)).generate(prompts, params)]
    assert got == expected and all(len(t) == 8 for t in got)
