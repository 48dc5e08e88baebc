"""The reference of the autoregressive Clover engine tests: transformers' Qwen3_5MoeForCausalLM on a tiny Clover
checkpoint, greedy, recomputing the whole sequence for every token (no cache, no engine code); the mask token is
never an output, as in the engine's autoregressive reading."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import torch

from diffuserve.model.families.clover_moe.gdn_preview import DIFFUSION_TENSORS

OURS_ONLY = ("architectures", "model_type", "torch_dtype", "block_length", "mask_token_id", "text_config")


def greedy_by_recompute(model_dir: Path, prompts: Sequence[list[int]], max_tokens: Sequence[int]) -> list[list[int]]:
    """Each prompt's first max_tokens[i] greedy tokens."""
    import transformers

    config = json.loads((model_dir / "config.json").read_text())
    fields = {**{k: v for k, v in config.items() if k not in OURS_ONLY}, **config.get("text_config", {})}
    model, info = transformers.Qwen3_5MoeForCausalLM.from_pretrained(
        model_dir, config=transformers.Qwen3_5MoeTextConfig(**fields), dtype=torch.float32, output_loading_info=True
    )
    assert all(k.rsplit(".", 1)[-1] in DIFFUSION_TENSORS for k in info["unexpected_keys"])
    outputs = []
    for prompt, count in zip(prompts, max_tokens, strict=True):
        ids = list(prompt)
        with torch.no_grad():
            for _ in range(count):
                logits = model.eval()(input_ids=torch.tensor([ids])).logits[0, -1]
                logits[config["mask_token_id"]] = float("-inf")
                ids.append(int(logits.argmax()))
        outputs.append(ids[len(prompt) :])
    return outputs
