"""What the naive reference decode knows of a model, found out on its own: the model to call, the block grid,
the mask and EOS ids, the context limit, and the decoding defaults a request that sets none gets.

Independent of the engine on purpose: the defaults, the max-token cap and the stop ids are restated here from
their documentation (docs/models/, the SamplingParams field docs), not imported, so that a changed engine
default or cap shows up as a parity failure instead of being copied into the oracle. The only thing shared with
the engine is the model (its forward and `compute_logits`) and how a model directory is read (model/loader).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from diffuserve.model.interface import DiffusionModel
from diffuserve.model.layers.moe.layer import set_moe_backend
from diffuserve.model.loader import load_args, load_model, read_model_config
from diffuserve.sampling_params import SamplingParams

BUILTIN_DEFAULTS: dict[str, Any] = {
    "temperature": 0.0,
    "decoder": "threshold",
    "threshold": 0.9,
    "entropy_bound": 0.35,
    "edit_threshold": 0.5,
    "max_post_edit_steps": 16,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
    "repetition_penalty": 1.0,
}
"""Documented defaults of the decoding knobs (`steps` unset means block_length steps: one token a step)."""
FAMILY_DEFAULTS: dict[str, dict[str, Any]] = {
    "LLaDA2MoeModelLM": {"decoder": "threshold", "threshold": 0.95, "temperature": 0.0},
}
"""Per architecture, the reference `generate`'s decoding (LLaDA2: threshold 0.95, greedy, top-1 fallback)."""
STEPS_CAPPED_BY_GEN_LENGTH = ("LLaDA2MoeModelLM",)
"""Architectures whose `generate` starts with `steps = min(steps, gen_length // minimal_topk)` (minimal_topk 1)."""
KNOBS = (
    "temperature",
    "decoder",
    "threshold",
    "steps",
    "entropy_bound",
    "edit_threshold",
    "max_post_edit_steps",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
)
"""The knobs a None in SamplingParams leaves to the model (generation_config.json overrides the family's)."""
CORESET_KEYS = (
    "block_expert_coreset",
    "expert_coreset_size",
    "block_coreset_size",
    "coreset_size",
    "num_coreset_experts",
)
"""config.json's names of the block expert coreset size, in the order docs/models/coreset.md gives them."""
DEFAULT_MAX_MODEL_LEN = 32768
"""Without a configured limit the context is the model's max_position_embeddings, at most this."""
GREEDY_BELOW = 1e-5
"""Temperatures below this decode greedily (vLLM's rule)."""


@dataclass(frozen=True)
class ReferenceModel:
    model: DiffusionModel
    """forward(input_ids [1, T], positions [1, T], DenseAttentionInputs) -> hidden [1, T, H]; compute_logits."""
    block_length: int
    mask_token_id: int
    eos_token_ids: tuple[int, ...]
    max_model_len: int
    defaults: Mapping[str, Any]
    """Decoding knobs by SamplingParams name: built-in, then the family's, then generation_config.json."""
    steps_capped_by_gen_length: bool = False
    block_expert_coreset: int = 0
    """C of block expert coreset routing (reference_coreset.py) while a block is denoised; 0 = per-token."""
    core_threshold: float | None = None
    """dMoE's block-expert routing (reference_dmoe.py) with this threshold in every forward; None = off."""

    def resolve(self, params: SamplingParams) -> SamplingParams:
        """`params` with every None knob filled from the model's defaults."""
        filled = {k: self.defaults[k] for k in KNOBS if getattr(params, k) is None and k in self.defaults}
        return dataclasses.replace(params, **filled)

    def max_tokens(self, num_prompt: int, params: SamplingParams) -> int:
        """Generated tokens at most: max_tokens, capped by the room left in max_model_len."""
        room = self.max_model_len - num_prompt
        if room < 1:
            raise ValueError(f"prompt: {num_prompt} tokens leave no room within max_model_len {self.max_model_len}")
        return min(params.max_tokens or room, room)

    def stop_ids(self, params: SamplingParams) -> frozenset[int]:
        """stop_token_ids, plus the model's EOS ids unless ignore_eos."""
        eos = () if params.ignore_eos else self.eos_token_ids
        return frozenset(params.stop_token_ids) | frozenset(eos)


def is_greedy(params: SamplingParams) -> bool:
    return params.temperature is None or params.temperature < GREEDY_BELOW


def post_edit_budget(params: SamplingParams) -> int:
    """Steps a block may take once its masks are gone: max_post_edit_steps for decoder=edit, else none."""
    return (params.max_post_edit_steps or 0) if params.decoder == "edit" else 0


def load_reference(
    model_dir: str | Path,
    model: DiffusionModel | None = None,
    block_length: int | None = None,
    max_model_len: int | None = None,
    dtype: str = "auto",
    block_expert_coreset: int | None = None,
    core_threshold: float | None = None,
) -> ReferenceModel:
    """The reference for a model directory: loads its own copy of the model (or drives `model`, e.g. the
    transformers one of `bench compare`). `block_length` / `max_model_len` / `block_expert_coreset` as the engine
    was configured (the coreset by default from config.json); `core_threshold`: dMoE's routing (by default
    config.json's `core_threshold`)."""
    config, generation = read_model_config(model_dir)
    if model is None:
        args, model = load_model(model_dir, dtype=dtype)
        set_moe_backend(model, "loop")  # the oracle computes experts one by one; the engine's fast paths may not
    else:
        args = load_args(model_dir)[1]
    architecture = (config.get("architectures") or [""])[0]
    from_file = {k: generation[k] for k in KNOBS if generation.get(k) is not None}
    defaults = {**BUILTIN_DEFAULTS, **FAMILY_DEFAULTS.get(architecture, {}), **from_file}
    limit = max_model_len or min(args.max_position_embeddings, DEFAULT_MAX_MODEL_LEN)
    return ReferenceModel(
        model.eval(),
        block_length or args.block_length,
        args.mask_token_id,
        tuple(args.eos_token_ids),
        limit,
        defaults,
        architecture in STEPS_CAPPED_BY_GEN_LENGTH,
        _coreset(config) if block_expert_coreset is None else block_expert_coreset,
        config.get("core_threshold") if core_threshold is None else core_threshold,
    )


def _coreset(config: dict) -> int:
    """The first of CORESET_KEYS that config.json (or its text_config) sets, else 0."""
    for scope in (config, config.get("text_config") or {}):
        for key in CORESET_KEYS:
            if scope.get(key) is not None:
                return int(scope[key])
    return 0
