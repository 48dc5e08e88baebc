"""Tiny seeded checkpoints that carry a model's official Python files, registered in config.json's `auto_map` as
the released checkpoints register them, for `diffuserve verify --trust-remote-code` against that code.

The files are read from a folder the caller names (the project's `../shared/reference-code/` layout: sdar/,
llada2-dfactory/ and dmoe/, see OFFICIAL; of dMoE, the plain LLaDA2 files it ships, not its block-expert ones)
and copied beside the weights at run time, with every module they import relatively (`from .parallel_plan import
...`, found by reading them), so transformers can load them; an `edit` may change a copy (a perturbation under
test). Nothing of those files is kept in the package. Knows nothing of the comparison.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from diffuserve.reference.llada2_checkpoint import write_llada2_checkpoint
from diffuserve.reference.random_checkpoint import make_config, write_random_checkpoint


@dataclass(frozen=True)
class OfficialCode:
    code_dir: str
    """The modeling files' folder, relative to the reference-code root."""
    auto_map: dict[str, str]
    generate: str | None
    """The block-diffusion loop outside the model, relative to the root (None: the model's own `generate`)."""


OFFICIAL = {
    "sdar": OfficialCode(
        "sdar/training/model/SDAR-4B-Chat",
        {"AutoConfig": "configuration_sdar.SDARConfig", "AutoModelForCausalLM": "modeling_sdar.SDARForCausalLM"},
        "sdar/generate.py",
    ),
    "llada2": OfficialCode(
        "llada2-dfactory/models/llada2_moe",
        {
            "AutoConfig": "configuration_llada2_moe.LLaDA2MoeConfig",
            "AutoModelForCausalLM": "modeling_llada2_moe.LLaDA2MoeModelLM",
        },
        None,
    ),
    "dmoe_llada2": OfficialCode(
        "dmoe/evaluations/models",
        {
            "AutoConfig": "configuration_llada2_moe.LLaDA2MoeConfig",
            "AutoModelForCausalLM": "modeling_llada2_moe.LLaDA2MoeModelLM",
        },
        None,
    ),
}

NOT_COPIED = ("auto_map", "architectures", "attn_implementation", "torch_dtype", "transformers_version", "bos_token_id")
"""Keys of a released config.json not carried into the tiny one: its names, dtype and token ids are the tiny
checkpoint's; its attention implementation (flex attention) is the training one."""
Edit = Callable[[str, str], str]
"""(file name, text) -> the text written (a perturbation; the identity for the official files as they are)."""
_RELATIVE = re.compile(r"^\s*from\s+\.(\w+)\s+import", re.MULTILINE)


def _copy_with_imports(code_dir: Path, stem: str, out: Path, edit: Edit | None) -> None:
    """`stem`.py and, recursively, the sibling modules it imports relatively."""
    target = out / f"{stem}.py"
    if target.exists():
        return
    source = code_dir / f"{stem}.py"
    if not source.is_file():
        raise FileNotFoundError(f"{code_dir}: no {source.name} (imported beside the official files)")
    text = source.read_text()
    target.write_text(edit(source.name, text) if edit is not None else text)
    for imported in _RELATIVE.findall(text):
        _copy_with_imports(code_dir, imported, out, edit)


def _write_weights(name: str, out: Path, seed: int) -> Path:
    if name in ("llada2", "dmoe_llada2"):
        return write_llada2_checkpoint(out, seed=seed, init_std=0.1)
    config = make_config("sdar-moe-tiny", num_experts=0, first_k_dense_replace=0, num_hidden_layers=3)
    return write_random_checkpoint(out, config, seed=seed, init_std=0.1)


def write_official_checkpoint(name: str, root: Path, out: Path, seed: int = 5, edit: Edit | None = None) -> Path:
    """A tiny checkpoint of `name` (a key of OFFICIAL) in `out`, with its official files from `root`."""
    code = OFFICIAL[name]
    model_dir = _write_weights(name, out, seed)
    for target in code.auto_map.values():
        _copy_with_imports(root / code.code_dir, target.split(".")[0], model_dir, edit)
    config = json.loads((model_dir / "config.json").read_text())
    released = root / code.code_dir / "config.json"
    if released.is_file():  # the release's own flags (fuse_cross_entropy, block_size, ...) where ours has none
        flags = {k: v for k, v in json.loads(released.read_text()).items() if k not in NOT_COPIED}
        config = {**flags, **config}
    config["auto_map"] = code.auto_map
    (model_dir / "config.json").write_text(json.dumps(config, indent=2))
    return model_dir


def official_generate(name: str, root: Path, out: Path, edit: Edit | None = None) -> Path | None:
    """The model's official block-diffusion loop file, copied into `out` (edited if `edit`), or None."""
    code = OFFICIAL[name]
    if code.generate is None:
        return None
    source = root / code.generate
    target = out / source.name
    if edit is None:
        shutil.copy(source, target)
    else:
        target.write_text(edit(source.name, source.read_text()))
    return target
