"""The decoders' names and the built-in values of the decoding knobs: what validation, the engine's policies, the
server's schema and a family's decoding defaults name, and what a request gets when neither it nor the model's
generation_config.json sets a knob (sampling_params.py resolves them). Stdlib only."""

from __future__ import annotations

from typing import Any

MASK_DECODER_NAMES = ("threshold", "fixed", "entropy", "edit")
"""The decoders of masked blocks (SDAR, LLaDA2, Clover): each step fills some of a block's mask tokens."""
RENOISE = "renoise"
"""DiffusionGemma's decoder (decoding/renoise.py): a canvas of random tokens, every position sampled each
step, the low-entropy ones kept and the rest renoised, on a temperature schedule (t_max -> t_min)."""
VERIFIED = "verified"
"""Verified decoding (decoding/verified.py): blocks drafted in one forward, each kept only as far as the causal path
of the forward that commits it agrees (models whose causal path predicts the next token)."""
AUTO = "auto"
"""Verified decoding whose drafts the engine turns off in the steps where the batch is wide (each such step decides
every request's next token autoregressively): the same tokens either way. On a model without verified decoding,
threshold (renoise for DiffusionGemma)."""
DECODER_NAMES = (*MASK_DECODER_NAMES, RENOISE, VERIFIED, AUTO)
"""The decoders, by name: the one list that validation, the engine's policies and the server's schema use."""
DECODERS = DECODER_NAMES
"""The same tuple under its former name (server/protocol.py and tests/server import it)."""

RENOISE_DEFAULTS: dict[str, Any] = {
    "t_min": 0.4,
    "t_max": 0.8,
    "stability_threshold": 1,
    "confidence_threshold": 0.005,
}
"""The renoise knobs' built-in values (transformers' DiffusionGemmaGenerationConfig defaults)."""
PENALTY_DEFAULTS: dict[str, float] = {"presence_penalty": 0.0, "frequency_penalty": 0.0, "repetition_penalty": 1.0}
"""The penalties' neutral values (decoding/penalties.py): what a request gets when neither it nor the model's
generation_config.json sets them."""
BUILTIN_DEFAULTS: dict[str, Any] = {
    "temperature": 0.0,
    "decoder": "threshold",
    "threshold": 0.9,
    "entropy_bound": 0.35,
    "edit_threshold": 0.5,
    "max_post_edit_steps": 16,
    **RENOISE_DEFAULTS,
    **PENALTY_DEFAULTS,
}
"""Values of the knobs below that neither the request nor the model's generation config set."""


MODEL_DEFAULTED = (
    "temperature",
    "decoder",
    "threshold",
    "steps",
    "entropy_bound",
    "edit_threshold",
    "max_post_edit_steps",
    "t_min",
    "t_max",
    "stability_threshold",
    "confidence_threshold",
    *PENALTY_DEFAULTS,
)
"""Knobs whose None is filled from the model's generation config."""
STEPS_CAPPED_BY_MAX_TOKENS = "steps_capped_by_max_tokens"
"""A family decoding default that is no request field: when true, a request's denoising steps per block are capped at
its max_tokens (LLaDA2's `generate`: `steps = min(steps, gen_length // minimal_topk)`, minimal_topk 1), so an answer
shorter than a block accepts more tokens per step."""
