"""Variant (b) of `bench compare`: the `transformers` model a user would otherwise run, decoded the way the
LLaDA2 reference `generate` decodes: no cache, the whole sequence recomputed at every step under the
block-causal mask.

Owns the adapter that gives transformers' Qwen3 / Qwen3-MoE model our model's call signature (dense attention
inputs only), so `testing.reference_decode.reference_generate` drives it unchanged; the weights are the benchmark
model's own, copied under transformers' names. Knows nothing of timing.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from diffuserve.model.layers.attention_backend import DenseAttentionInputs
from diffuserve.model.loader import load_model, read_model_config

# config.json keys that name our checkpoint, not the transformers architecture it is built as.
_NOT_CONFIG = ("architectures", "model_type", "torch_dtype", "auto_map")


class TransformersBlockDiffusion(nn.Module):
    """transformers' CausalLM behind our `forward(input_ids, positions, attn) -> hidden` and
    `compute_logits(hidden) -> fp32 logits`."""

    def __init__(self, hf_model: nn.Module) -> None:
        super().__init__()
        self.hf = hf_model

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, attn: DenseAttentionInputs) -> torch.Tensor:
        """Hidden states after transformers' final norm (compute_logits then applies only the LM head)."""
        additive = torch.zeros(attn.mask.shape, dtype=self.hf.dtype).masked_fill(~attn.mask, float("-inf"))
        out = self.hf.model(input_ids=input_ids, attention_mask=additive, position_ids=positions)
        return out.last_hidden_state

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.hf.lm_head(hidden).float()


def load_transformers_model(model_dir: str | Path, dtype: str) -> TransformersBlockDiffusion:
    """Builds transformers' Qwen3MoeForCausalLM (Qwen3ForCausalLM for a dense model) from the model's
    config.json and loads the model's weights into it (strictly: a missing or extra tensor is an error)."""
    import transformers

    from diffuserve.model.registry import family_for

    config, _ = read_model_config(model_dir)
    if config.get("shared_expert_intermediate_size") or config.get("first_k_dense_replace"):
        raise ValueError("variants: the transformers reference covers Qwen3 / Qwen3-MoE shapes only (no shared "
                         "expert, dense layers via mlp_only_layers); drop `reference` from --variants")
    args, ours = load_model(model_dir, dtype=dtype)
    fields = {k: v for k, v in config.items() if k not in _NOT_CONFIG}
    if args.is_moe:
        hf_config, cls = transformers.Qwen3MoeConfig(**fields), transformers.Qwen3MoeForCausalLM
    else:
        hf_config, cls = transformers.Qwen3Config(**fields), transformers.Qwen3ForCausalLM
    hf_config._attn_implementation = "sdpa"
    state = dict(family_for(config).checkpoint_tensors(ours.state_dict(), args, per_expert=False))
    hf_model = cls(hf_config).to(ours.lm_head.weight.dtype)
    hf_model.load_state_dict(state, strict=not args.tie_word_embeddings)
    if args.tie_word_embeddings:
        hf_model.tie_weights()
    return TransformersBlockDiffusion(hf_model.eval())
