"""Checkpoint directories that carry a modeling module of the test's own, registered through config.json's
`auto_map` as released checkpoints register theirs: a subclass of transformers' Qwen3.5-MoE (a Clover-shaped
checkpoint) or Qwen3-MoE (an SDAR-MoE-shaped one, whose model_type stays qwen3_moe), optionally perturbed the
way a release could differ from what the engine implements (one layer's norm epsilon, one layer's shared-expert
gate left out)."""

from __future__ import annotations

import json
from pathlib import Path

CONFIG_MODULE = """
from transformers import {config_class}


class TestConfig({config_class}):
    model_type = "{model_type}"
"""

MODEL_MODULE = '''
import torch
from transformers import {model_class}

from .{config_module} import TestConfig


def _ungated_shared_expert(self, hidden_states):
    """Qwen3.5-MoE's sparse block with the shared expert's sigmoid gate left out."""
    batch, length, hidden = hidden_states.shape
    flat = hidden_states.view(-1, hidden)
    _, weights, experts = self.gate(flat)
    return (self.experts(flat, experts, weights) + self.shared_expert(flat)).reshape(batch, length, hidden)


class TestForCausalLM({model_class}):
    config_class = TestConfig

    def __init__(self, config):
        super().__init__(config)
        perturb = {perturb!r}
        layer = perturb.get("layer", 0)
        if layer >= len(self.model.layers):  # built with fewer layers (verify --layers): nothing to perturb
            return
        if perturb.get("norm_eps") is not None:
            norm = self.model.layers[layer].input_layernorm
            setattr(norm, "eps" if hasattr(norm, "eps") else "variance_epsilon", perturb["norm_eps"])
        if perturb.get("ungated_shared_expert"):
            mlp = self.model.layers[layer].mlp
            mlp.forward = _ungated_shared_expert.__get__(mlp)
'''

BASES = {
    "clover_moe": ("Qwen3_5MoeForCausalLM", "Qwen3_5MoeTextConfig"),
    "qwen3_moe": ("Qwen3MoeForCausalLM", "Qwen3MoeConfig"),
}


def add_remote_code(model_dir: Path, model_type: str, **perturb) -> Path:
    """Writes the modules (named after the directory, so that no two test directories share a module name) and
    registers them in config.json's auto_map."""
    (model_class, config_class), stem = BASES[model_type], model_dir.name.replace("-", "_")
    config_module, model_module = f"configuration_{stem}", f"modeling_{stem}"
    (model_dir / f"{config_module}.py").write_text(
        CONFIG_MODULE.format(config_class=config_class, model_type=model_type)
    )
    code = MODEL_MODULE.format(model_class=model_class, config_module=config_module, perturb=perturb)
    (model_dir / f"{model_module}.py").write_text(code)
    config = json.loads((model_dir / "config.json").read_text())
    config["auto_map"] = {
        "AutoConfig": f"{config_module}.TestConfig",
        "AutoModelForCausalLM": f"{model_module}.TestForCausalLM",
    }
    (model_dir / "config.json").write_text(json.dumps(config, indent=2))
    return model_dir
