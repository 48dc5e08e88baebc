"""RenoiseDefaults: the knobs of renoise decoding (uniform-noise diffusion over a canvas) as the reference names
them. Standard library only, and beside sampling_params.py rather than in decoding/ or model/: a family's config
parser fills them from its generation_config.json, the renoise decoder reads them per request, and neither
package imports the other."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RenoiseDefaults:
    """The reference decoding knobs (transformers' `DiffusionGemmaGenerationConfig`), with its global defaults
    (`_get_default_generation_params`) where generation_config.json leaves one unset."""

    max_denoising_steps: int = 48
    entropy_bound: float = 0.1
    t_min: float = 0.4
    t_max: float = 0.8
    stability_threshold: int = 1
    confidence_threshold: float = 0.005
    max_new_tokens: int = 256
    eos_token_ids: tuple[int, ...] = ()
    """Only generation_config.json's: transformers' generate never reads config.json's eos_token_id."""
    pad_token_id: int | None = None
    """Replaces the tokens after a canvas's first EOS (None: they stay)."""
