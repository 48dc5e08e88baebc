"""dMoE's official modeling file (../shared/reference-code/dmoe, unmodified) loaded from its path, with the weights of
a checkpoint the test wrote, and its `generate` made deterministic.

Two stand-ins, both outside the file: transformers 5 dropped the "default" entry of ROPE_INIT_FUNCTIONS that the
file's rotary embedding looks up, so the test registers transformers 4's default rule (inv_freq over
head_dim * partial_rotary_factor dims, scale 1) under that name; and the file's sampler draws with
`torch.multinomial` even at temperature 0, so during `generate` the draw is the argmax of the probabilities
(what temperature 0 means, and what the engine does).
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from unittest import mock

import pytest
import torch
from safetensors.torch import load_file

REPO_ROOT = Path(__file__).resolve().parents[2]
DMOE_DIR = REPO_ROOT.parent / "shared" / "reference-code" / "dmoe" / "evaluations" / "models"
PACKAGE = "dmoe_official"


def _default_rope(config, device=None, seq_len=None, **_):
    dim = int(config.head_dim * config.partial_rotary_factor)
    exponents = torch.arange(0, dim, 2, dtype=torch.int64).to(device=device, dtype=torch.float) / dim
    return 1.0 / (config.rope_theta**exponents), 1.0


def official_modules() -> tuple[ModuleType, ModuleType]:
    """(modeling, configuration) of dMoE's adaptive files; skips the test where the folder is absent."""
    if not (DMOE_DIR / "modeling_llada2_moe_be_adaptive.py").is_file():
        pytest.skip(f"dMoE's official files are not at {DMOE_DIR} (../shared/reference-code is absent)")
    if PACKAGE not in sys.modules:
        spec = importlib.util.spec_from_file_location(
            PACKAGE, DMOE_DIR / "__init__.py", submodule_search_locations=[str(DMOE_DIR)]
        )
        assert spec is not None and spec.loader is not None
        package = importlib.util.module_from_spec(spec)
        sys.modules[PACKAGE] = package
        spec.loader.exec_module(package)
    return (
        importlib.import_module(f"{PACKAGE}.modeling_llada2_moe_be_adaptive"),
        importlib.import_module(f"{PACKAGE}.configuration_llada2_moe_be_adaptive"),
    )


def load_official(model_dir: Path, core_threshold: float | None = None) -> torch.nn.Module:
    """dMoE's LLaDA2MoeModelLM with `model_dir`'s config (its core_threshold unless given) and weights, fp32."""
    modeling, configuration = official_modules()
    config = json.loads((model_dir / "config.json").read_text())
    keys = {k: v for k, v in config.items() if k not in ("architectures", "model_type", "auto_map")}
    if core_threshold is not None:
        keys["core_threshold"] = core_threshold
    hf_config = configuration.LLaDA2MoeConfig(**keys)
    hf_config._attn_implementation = "eager"
    from transformers import modeling_rope_utils

    # Only while the model is built (its rotary embedding reads the rule then): registered for good, the entry
    # would change what transformers' own models do with "default" afterwards in the same process.
    rope = {"default": modeling_rope_utils.ROPE_INIT_FUNCTIONS.get("default", _default_rope)}
    with mock.patch.dict(modeling_rope_utils.ROPE_INIT_FUNCTIONS, rope):
        model = modeling.LLaDA2MoeModelLM(hf_config).eval()
    weights: dict[str, torch.Tensor] = {}
    for shard in sorted(model_dir.glob("*.safetensors")):
        weights.update(load_file(shard))
    missing, unexpected = model.load_state_dict(weights, strict=False)
    assert not missing and not unexpected, (missing, unexpected)
    return model


def official_generate(
    model: torch.nn.Module, prompt: list[int], gen_length: int, mask_id: int
) -> tuple[list[int], float]:
    """dMoE's `generate` at the evaluation script's settings (block 32, 32 steps, temperature 0, no EOS stop) with
    argmax draws -> (the answer's tokens, its average unique experts per MoE layer per denoising forward)."""

    def argmax_draw(probs: torch.Tensor, num_samples: int, *args, **kwargs) -> torch.Tensor:
        return probs.argmax(dim=-1, keepdim=True)

    with mock.patch.object(torch, "multinomial", argmax_draw):
        answer, unique = model.generate(
            torch.tensor([prompt]),
            temperature=0.0,
            block_length=32,
            steps=32,
            gen_length=gen_length,
            eos_id=-1,
            mask_id=mask_id,
        )
    return answer[0].tolist(), float(unique)
