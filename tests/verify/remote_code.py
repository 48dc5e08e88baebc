"""Checkpoint directories that carry a modeling module of the test's own, registered through config.json's
`auto_map` as released checkpoints register theirs: a subclass of transformers' Qwen3.5-MoE (a Clover-shaped
checkpoint) or Qwen3-MoE (an SDAR-MoE-shaped one, whose model_type stays qwen3_moe), optionally perturbed the
way a release could differ from what the engine implements (one layer's norm epsilon, one layer's shared-expert
gate left out), or reading its attention mask as SDAR's code does (as booleans, True = attend)."""

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

    def forward(self, input_ids=None, attention_mask=None, **kwargs):
        if {perturb!r}.get("reads_bool_mask") and attention_mask is not None:
            # SDAR's convention: the mask is read as booleans (True = attend), whatever its dtype
            attend = attention_mask.bool()
            attention_mask = torch.zeros(attend.shape, dtype=self.dtype).masked_fill(~attend, float("-inf"))
        return super().forward(input_ids=input_ids, attention_mask=attention_mask, **kwargs)
'''

BLOCK_GENERATE = '''

    @torch.no_grad()
    def generate(self, inputs, block_length=4, gen_length=4, steps=4, threshold=0.9, temperature=0.0, mask_id=None,
                 eos_id=None):
        """LLaDA2's block-diffusion loop, restated: blocks on the absolute grid, each step the whole prefix under
        the block-causal mask, accept the masked positions whose greedy confidence (softmax over the whole
        vocabulary) is > threshold, or else the schedule's count of most confident ones."""
        prompt = inputs.shape[1]
        total = -(-(prompt + gen_length) // block_length) * block_length
        x = torch.full((1, total), mask_id, dtype=torch.long)
        x[:, :prompt] = inputs
        grid = torch.arange(total) // block_length
        bias = torch.zeros(total, total).masked_fill(grid[:, None] < grid[None, :], float("-inf"))[None, None]
        schedule = [block_length // steps + (1 if j < block_length % steps else 0) for j in range(steps)]
        for start in range(prompt // block_length * block_length, total, block_length):
            end = start + block_length
            for count in schedule:
                active = x[0, start:end] == mask_id
                if not active.any():
                    break
                positions = torch.arange(end)[None]
                out = self(input_ids=x[:, :end], attention_mask=bias[..., :end, :end], position_ids=positions)
                confidence, tokens = out.logits[0, {rows}].float().softmax(-1).max(-1)
                confidence = torch.where(active, confidence, float("-inf"))
                pick = confidence > threshold
                if pick.sum() < count:
                    pick = torch.zeros_like(active)
                    pick[confidence.topk(min(count, int(active.sum()))).indices] = True
                x[0, start:end][pick] = tokens[pick]
        return x[:, prompt : prompt + gen_length]
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
    block_generate = perturb.pop("block_generate", None)  # None, "faithful" or "ar_shift"
    code = MODEL_MODULE.format(model_class=model_class, config_module=config_module, perturb=perturb)
    if block_generate is not None:
        # the perturbed loop predicts position p from row p - 1 (the AR shift) instead of from its own row
        code += BLOCK_GENERATE.replace("{rows}", "start:end" if block_generate == "faithful" else "start - 1 : end - 1")
    (model_dir / f"{model_module}.py").write_text(code)
    config = json.loads((model_dir / "config.json").read_text())
    config["auto_map"] = {
        "AutoConfig": f"{config_module}.TestConfig",
        "AutoModelForCausalLM": f"{model_module}.TestForCausalLM",
    }
    (model_dir / "config.json").write_text(json.dumps(config, indent=2))
    return model_dir
