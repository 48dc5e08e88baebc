"""The `transformers` model a user would otherwise run, in two `bench compare` variants:

  reference       decoded the way the LLaDA2 reference `generate` decodes: no cache, the whole sequence
                  recomputed at every step under the block-causal mask (`TransformersBlockDiffusion`)
  transformers-kv the SDAR reference scheme: the committed blocks' K/V in transformers' cache, each denoising step
                  a forward of the current block only, and a separate commit forward that appends a finished block
                  before the next one starts (`SdarCachedTransformers`)

Both give transformers' Qwen3 / Qwen3-MoE model our model's call signature (dense attention inputs only), so
`testing.reference_decode.reference_generate` drives them unchanged; the weights are the benchmark model's own,
copied under transformers' names. Knows nothing of timing.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from diffuserve.model.interface import DiffusionModel
from diffuserve.model.layers.attention import DenseAttentionInputs
from diffuserve.model.loader import load_model, read_model_config
from diffuserve.model.step_inputs import StepInputs

if TYPE_CHECKING:  # transformers is imported only when a reference is built
    from transformers import Qwen3ForCausalLM, Qwen3MoeForCausalLM

# config.json keys that name our checkpoint, not the transformers architecture it is built as.
_NOT_CONFIG = ("architectures", "model_type", "torch_dtype", "auto_map")


def dense(step: StepInputs) -> DenseAttentionInputs:
    """The step's dense mask: transformers' models run whole sequences, never over our paged cache."""
    assert isinstance(step.attention, DenseAttentionInputs), "transformers' stand-ins take a dense mask"
    return step.attention


class TransformersBlockDiffusion(DiffusionModel):
    """transformers' CausalLM behind our `forward(input_ids, positions, step) -> hidden` and
    `compute_logits(hidden) -> fp32 logits`."""

    def __init__(self, hf_model: Qwen3ForCausalLM | Qwen3MoeForCausalLM) -> None:
        super().__init__()
        self.hf = hf_model

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, step: StepInputs) -> torch.Tensor:
        """Hidden states after transformers' final norm (compute_logits then applies only the LM head)."""
        attn = dense(step)
        additive = torch.zeros(attn.mask.shape, dtype=self.hf.dtype).masked_fill(~attn.mask, float("-inf"))
        out = self.hf.model(input_ids=input_ids, attention_mask=additive, position_ids=positions)
        return out.last_hidden_state

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.hf.lm_head(hidden).float()


class SdarCachedTransformers(TransformersBlockDiffusion):
    """The SDAR scheme behind the same call: given the sequence up to the end of the current block, it commits
    (one forward, K/V kept) the whole blocks before that block which the cache lacks, then runs the current block
    against the cache and drops the block's K/V again. A call whose committed prefix differs from the cache's
    (a new request) starts a fresh cache. Returns hidden states only for the current block's rows; the earlier
    rows are NaN, so a caller that read them would fail the benchmark's token check instead of passing silently."""

    def __init__(self, hf_model: Qwen3ForCausalLM | Qwen3MoeForCausalLM, block_length: int) -> None:
        super().__init__(hf_model)
        self.block_length = block_length
        self.cache: Any = None
        self.cached_ids = torch.empty(0, dtype=torch.long)
        self.commit_forwards = 0

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, step: StepInputs) -> torch.Tensor:
        """input_ids/positions [1, T] (T = the end of the current block), the dense mask [1, 1, T, T]
        block-causal."""
        import transformers

        attn = dense(step)
        length = input_ids.shape[1]
        start = (length - 1) // self.block_length * self.block_length  # the current block's first position
        cached = self.cached_ids.numel()
        if self.cache is None or cached > start or not torch.equal(self.cached_ids, input_ids[0, :cached]):
            self.cache, self.cached_ids, cached = transformers.DynamicCache(config=self.hf.config), input_ids[0, :0], 0
        if cached < start:  # the commit forward: finished blocks (or the prompt) into the cache
            self._run(input_ids, positions, attn, cached, start)
            self.cached_ids, self.commit_forwards = input_ids[0, :start].clone(), self.commit_forwards + 1
        block = self._run(input_ids, positions, attn, start, length)
        self.cache.crop(start - self.cache.get_seq_length())  # denoising steps never keep their K/V
        hidden = block.new_full((1, length, block.shape[-1]), float("nan"))
        hidden[:, start:] = block
        return hidden

    def _run(
        self, input_ids: torch.Tensor, positions: torch.Tensor, attn: DenseAttentionInputs, begin: int, end: int
    ) -> torch.Tensor:
        """Rows [begin, end) over the cached keys [0, begin) and themselves -> hidden [1, end - begin, H]."""
        mask = attn.mask[..., begin:end, :end]
        additive = torch.zeros(mask.shape, dtype=self.hf.dtype).masked_fill(~mask, float("-inf"))
        out = self.hf.model(
            input_ids=input_ids[:, begin:end],
            attention_mask=additive,
            position_ids=positions[:, begin:end],
            cache=self.cache,
            use_cache=True,
        )
        return out.last_hidden_state


def load_transformers_model(
    model_dir: str | Path, dtype: str, sdar_cache_block: int | None = None
) -> TransformersBlockDiffusion:
    """Builds transformers' Qwen3MoeForCausalLM (Qwen3ForCausalLM for a dense model) from the model's
    config.json and loads the model's weights into it (strictly: a missing or extra tensor is an error).
    `sdar_cache_block`: wrap it for the SDAR scheme with that block length instead of full recompute."""
    import transformers

    from diffuserve.model.registry import family_for

    config, _ = read_model_config(model_dir)
    if config.get("shared_expert_intermediate_size") or config.get("first_k_dense_replace"):
        raise ValueError(
            "variants: the transformers reference covers Qwen3 / Qwen3-MoE shapes only (no shared "
            "expert, dense layers via mlp_only_layers); drop `reference` from --variants"
        )
    args, ours = load_model(model_dir, dtype=dtype)
    fields = {k: v for k, v in config.items() if k not in _NOT_CONFIG}
    hf_model: Qwen3ForCausalLM | Qwen3MoeForCausalLM
    if args.is_moe:
        moe_config = transformers.Qwen3MoeConfig(**fields)
        moe_config._attn_implementation = "sdpa"
        hf_model = transformers.Qwen3MoeForCausalLM(moe_config)
    else:
        dense_config = transformers.Qwen3Config(**fields)
        dense_config._attn_implementation = "sdpa"
        hf_model = transformers.Qwen3ForCausalLM(dense_config)
    state = dict(family_for(config).checkpoint_tensors(ours.state_dict(), args, per_expert=False))
    # transformers declares `to` through functools.wraps(nn.Module.to), typed as the unbound function (self first)
    hf_model = hf_model.to(ours.get_parameter("lm_head.weight").dtype)  # type: ignore[arg-type]
    hf_model.load_state_dict(state, strict=not args.tie_word_embeddings)
    if args.tie_word_embeddings:
        hf_model.tie_weights()
    if sdar_cache_block is not None:
        return SdarCachedTransformers(hf_model.eval(), sdar_cache_block)
    return TransformersBlockDiffusion(hf_model.eval())
