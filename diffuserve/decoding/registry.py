"""The decoder registry: a request's sampling parameters -> its `Decoder`, resolved once per request, with every
check of whether that decoder fits the model and the request's other options (the one place these rules live).

    the model reads blocks causally (no block-diffusion tensors)    -> the autoregressive rule, whatever was asked
    the model's blocks are renoise canvases                          -> renoise (the only decoder that fits them)
    otherwise                                                        -> the mask decoder the request names
    verified, on a model whose causal path predicts the next token   -> the verified decoder (refused otherwise),
                                                                        drafting in one forward, or by the
                                                                        threshold policy when `steps` > 1
    auto                                                             -> verified where it fits (its drafts
                                                                        switched per step by the scheduler),
                                                                        else threshold (renoise on canvases)
    with structured_outputs                                          -> that decoder, grammar-constrained
    with a presence, frequency or repetition penalty                 -> that decoder, its rows penalised first

One instance of each decoder serves every request resolved to it (their per-request state is keyed by id).
"""

from __future__ import annotations

import torch

from diffuserve.decoding.autoregressive import NextTokenDecoder
from diffuserve.decoding.constrained import GrammarConstrained
from diffuserve.decoding.grammar_walk import StructuredDecoding
from diffuserve.decoding.mask import MaskDecoder
from diffuserve.decoding.mask_policies import MASK_POLICIES
from diffuserve.decoding.penalties import Penalized, PenaltyCounts
from diffuserve.decoding.protocol import Decoder
from diffuserve.decoding.renoise import RenoiseDecoder
from diffuserve.decoding.verified import VerifiedDecoder
from diffuserve.errors import RequestError, UnsupportedParameter
from diffuserve.model.interface import StepRules
from diffuserve.sampling_defaults import AUTO, RENOISE
from diffuserve.sampling_params import ResolvedSamplingParams

MULTI_STEP_VERIFIED = "verified, multi-step drafts"
"""The key of the verified decoder that drafts by the threshold policy over `steps` > 1 forwards."""


class DecoderRegistry:
    def __init__(
        self,
        rules: StepRules,
        block_length: int,
        device: torch.device,
        vocab_size: int,
        structured: StructuredDecoding | None = None,
    ) -> None:
        self.rules, self.structured = rules, structured
        self.penalty_counts = PenaltyCounts()
        self._plain: dict[str, Decoder] = {
            name: MaskDecoder(name, policy, block_length) for name, policy in MASK_POLICIES.items()
        }
        self._plain["autoregressive"] = NextTokenDecoder(block_length)
        self._plain["renoise"] = RenoiseDecoder(block_length, vocab_size, device)
        self._plain["verified"] = VerifiedDecoder(block_length)
        self._plain[MULTI_STEP_VERIFIED] = VerifiedDecoder(block_length, one_forward=False)
        self._plain[AUTO] = VerifiedDecoder(block_length, name=AUTO)
        self._constrained = {
            name: GrammarConstrained(decoder, structured, block_length)
            for name, decoder in self._plain.items()
            if structured is not None and name != "renoise"
        }
        # One penalty wrapper per decoder, shared by its penalised requests (the counts are per request): the
        # step decodes them together (Penalized.decode_blocks).
        self._penalized = {
            id(decoder): Penalized(decoder, self.penalty_counts)
            for decoder in (*self._plain.values(), *self._constrained.values())
        }

    def resolve(self, params: ResolvedSamplingParams) -> Decoder:
        """The decoder of a request with `params`; a RequestError naming the field if it cannot be decoded."""
        if params.is_auto and not (self.rules.prediction_shift and not self.rules.autoregressive):
            params = params.replace(decoder=RENOISE if self.rules.renoise_canvas else "threshold")  # no drafts here
        name = "autoregressive" if self.rules.autoregressive else params.decoder
        if name == "verified" and (params.steps or 1) > 1:
            name = MULTI_STEP_VERIFIED
        self._check_fits(params)
        if params.structured_outputs is None:
            decoder = self._plain[name]
        else:
            self._check_structured(params)
            decoder = self._constrained[name]
        return self._penalized[id(decoder)] if params.has_penalties else decoder

    def decoders(self) -> list[Decoder]:
        """Every decoder instance (to release a request from whichever holds state for it)."""
        return [*self._plain.values(), *self._constrained.values(), *self._penalized.values()]

    def _check_fits(self, params: ResolvedSamplingParams) -> None:
        """Renoise canvases take the renoise decoder only, masked blocks every other; renoise samples each position
        from its whole tempered distribution (its schedule, t_max -> t_min), so top_p and top_k do not apply."""
        if self.rules.renoise_canvas and not params.is_renoise:
            raise UnsupportedParameter(
                "decoder",
                f"{params.decoder} fills mask tokens, and this model's blocks are renoise canvases (random tokens, no "
                "mask token); use renoise or leave it unset",
            )
        if params.is_editing and self.rules.autoregressive:
            raise UnsupportedParameter(
                "decoder",
                "edit rewrites decided tokens of a block, and this model decodes autoregressively (a checkpoint "
                "without block-diffusion tensors: one final token per forward); use threshold, fixed or entropy",
            )
        if params.is_renoise and not self.rules.renoise_canvas:
            raise UnsupportedParameter(
                "decoder",
                "renoise decodes random-token canvases, and this model's blocks are masked; use threshold, fixed, "
                "entropy or edit",
            )
        if params.is_verified and not self.rules.autoregressive:
            self._check_verified(params)
        if params.is_renoise and (params.top_p < 1 or params.top_k > 0):
            name, value = ("top_p", params.top_p) if params.top_p < 1 else ("top_k", params.top_k)
            raise UnsupportedParameter(
                name,
                f"got {value}; the renoise decoder samples every canvas position from its whole tempered "
                "distribution (temperatures t_max -> t_min), so it has no nucleus or top-k filter; remove the field",
            )

    def _check_verified(self, params: ResolvedSamplingParams) -> None:
        """Verification reads the commit forward's causal rows as next-token predictions: only a model whose
        position p is predicted from row p - 1 (StepRules.prediction_shift) has them."""
        if not self.rules.prediction_shift:
            raise UnsupportedParameter(
                "decoder",
                "verified checks drafts against the causal path's next-token predictions, and this model predicts "
                "each masked position from its own row (no AR shift), so its causal rows predict nothing to check; "
                "use threshold, fixed, entropy or edit",
            )

    def _check_structured(self, params: ResolvedSamplingParams) -> None:
        """RequestError unless the engine can constrain this request (a tokenizer, a non-editing, non-renoise
        decoder, a grammar that compiles)."""
        if params.is_renoise:
            raise UnsupportedParameter(
                "structured_outputs",
                "the renoise decoder rewrites every position of a canvas at every step (random tokens until the "
                "canvas ends), so a grammar cannot be kept left to right as in a masked block; remove the field",
            )
        if self.structured is None:
            raise RequestError(
                "structured_outputs", "this model directory has no tokenizer to compile grammars with; remove the field"
            )
        if params.is_editing:
            raise RequestError(
                "decoder",
                "edit cannot be combined with structured_outputs (an edited token could "
                "leave the grammar); choose threshold, fixed or entropy",
            )
        assert params.structured_outputs is not None
        self.structured.check(params.structured_outputs)
