"""Per-request decoding knobs, under vLLM's names, plus the block-diffusion ones (decoder, threshold, ...).

`SamplingParams` is what a caller asks for: `None` means "the model's default" (its generation_config.json, else
the value documented on the field). `SamplingParams.with_defaults` resolves it into `ResolvedSamplingParams`,
what a request is decoded with: every default applied, max_tokens capped to the engine's limit, the stop ids
(EOS unless ignore_eos, plus stop_token_ids) gathered. Validation raises `RequestError` (a ValueError) naming the
field, the value and the allowed range. The decoders' names and the knobs' built-in values are
sampling_defaults.py's; knows nothing of tensors or the engine.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from diffuserve.errors import RequestError
from diffuserve.sampling_defaults import (
    AUTO,
    BUILTIN_DEFAULTS,
    DECODER_NAMES,
    MODEL_DEFAULTED,
    PENALTY_DEFAULTS,
    RENOISE,
    RENOISE_DEFAULTS,
    STEPS_CAPPED_BY_MAX_TOKENS,
    VERIFIED,
)
from diffuserve.structured_outputs import StructuredOutputsParams

GREEDY_BELOW = 1e-5
MAX_LOGPROBS = 20
"""The most top alternatives a request may ask for per token (`logprobs`, `prompt_logprobs`), as vLLM's default
`max_logprobs`."""


class RequestOutputKind(enum.IntEnum):
    """Which outputs a request's caller gets from the engine's steps (vLLM's names and values)."""

    CUMULATIVE = 0
    """After every step that ran it, its whole output so far (what a stream shows)."""
    FINAL_ONLY = 2
    """Its finished output only: no text is made while it runs (but where a stop string may end it) and no
    intermediate output is built. `LLM.generate` asks for it."""


@dataclass(frozen=True)
class SamplingParams:
    n: int = 1
    """Completions per prompt (each its own request; seeded ones use seed, seed + 1, ...)."""
    temperature: float | None = None
    """0 = argmax (default, as the block-diffusion references decode)."""
    top_p: float = 1.0
    top_k: int = 0
    """0 or -1 = no top-k filtering."""
    seed: int | None = None
    max_tokens: int | None = 16
    """Generated tokens at most; None = up to the engine's max_model_len. 0: nothing is generated (the prompt is
    only prefilled, and scored with prompt_logprobs)."""
    min_tokens: int = 0
    """Stop tokens are suppressed (their logits set to -inf) before this many generated tokens."""
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    decoder: str | None = None
    """threshold (SDAR/LLaDA2 confidence threshold with a top-k fallback), fixed (a fixed number of tokens per
    step), entropy (EB-sampler entropy bound), edit (LLaDA2.1: threshold, plus rewriting accepted tokens while
    their block is open), renoise (DiffusionGemma's canvases, the only decoder of such a model) or verified
    (drafts kept only where the causal path agrees: the model's autoregressive output; Clover) or auto (verified,
    autoregressive in the steps where the batch is too wide for drafts to pay; elsewhere threshold). Default:
    the model's (threshold, or renoise for DiffusionGemma)."""
    threshold: float | None = None
    """Confidence a proposal must exceed (strict >) to be accepted; default 0.9 (LLaDA2 models: 0.95)."""
    steps: int | None = None
    """Denoising steps per block of the fallback / fixed schedule: each step accepts at least
    block_length // steps tokens (remainder to the first steps). Default: block_length (one token a step).
    decoder=renoise: the most steps a canvas takes (`max_denoising_steps`; default the model's, else 48).
    decoder=verified: the forwards a draft may take: 1 by default (every position at once); more drafts by the
    threshold policy on that schedule."""
    entropy_bound: float | None = None
    """EB-sampler gamma for decoder=entropy (default 0.35) and decoder=renoise (default the model's, else 0.1)."""
    edit_threshold: float | None = None
    """decoder=edit: an accepted, generated token of the open block is rewritten when the newly proposed token
    differs and its confidence exceeds this (strict >); default 0.5 (diffusers' LLaDA2.1 quality mode)."""
    max_post_edit_steps: int | None = None
    """decoder=edit: denoising steps a block may still take once its masks are gone (it is final as soon as one
    changes nothing); default 16. Other decoders finish a block when its masks are gone."""
    t_min: float | None = None
    """decoder=renoise: the temperature schedule's low end (the last step is at t_min + (t_max - t_min) / steps);
    default 0.4."""
    t_max: float | None = None
    """decoder=renoise: the first step's temperature; default 0.8."""
    stability_threshold: int | None = None
    """decoder=renoise: a canvas may stop once its argmax repeated that of this many previous steps; default 1."""
    confidence_threshold: float | None = None
    """decoder=renoise: ... and the mean entropy (nats) of its tempered distributions is below this; default 0.005."""
    structured_outputs: StructuredOutputsParams | None = None
    """Constrain the output to a JSON schema, regex, choice list or grammar
    (docs/decoding/structured-output.md): every committed token sequence is then a valid prefix of it."""
    logprobs: int | None = None
    """Per generated token, its log-probability and this many top alternatives (0 .. MAX_LOGPROBS), under the
    distribution the decoder accepted it from (docs/serving/logprobs.md, "Logprobs"); None = none computed."""
    prompt_logprobs: int | None = None
    """Score the prompt: each prompt token's log-probability under the block chain rule
    (docs/serving/logprobs.md; the first token has none) with this many top alternatives (0 .. MAX_LOGPROBS);
    None = not scored."""
    output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE
    """CUMULATIVE: an output after every step that ran the request; FINAL_ONLY: its finished output only."""
    record_denoising: bool = False
    """Keep every denoising step's writes (which output positions it decided, and their tokens), for the
    outputs to carry (`CompletionOutput.denoising_steps`; the server's `stream_options.include_denoising`)."""
    presence_penalty: float | None = None
    """OpenAI's: subtracted from the logit of every token the response already holds, in [-2, 2]; counted over
    the request's committed output tokens (decoding/penalties.py). Default: the model's, else 0."""
    frequency_penalty: float | None = None
    """OpenAI's: times the token's count in the response, subtracted from its logit, in [-2, 2]. Default 0."""
    repetition_penalty: float | None = None
    """transformers' / vLLM's: the logit of a token the response holds is divided by it when positive, multiplied
    when not, > 0 (1 = off). Default: the model's, else 1."""
    penalize_prompt: bool = False
    """The penalties also count the prompt's tokens (as transformers' and vLLM's repetition_penalty do); default
    False: the response's tokens only, as the release's decoding record asks."""

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", [self.stop])  # normalise before freezing is observable
        _check(self.n >= 1, "n", self.n, ">= 1")
        _check(self.temperature is None or self.temperature >= 0, "temperature", self.temperature, ">= 0")
        _check(0 < self.top_p <= 1, "top_p", self.top_p, "in (0, 1]")
        _check(self.top_k >= -1, "top_k", self.top_k, ">= -1 (0 or -1 disable it)")
        _check(self.max_tokens is None or self.max_tokens >= 0, "max_tokens", self.max_tokens, ">= 0")
        _check(self.min_tokens >= 0, "min_tokens", self.min_tokens, ">= 0")
        _check(
            self.max_tokens is None or self.min_tokens <= self.max_tokens,
            "min_tokens",
            self.min_tokens,
            f"<= max_tokens ({self.max_tokens})",
        )
        self._check_decoder()
        self._check_renoise()
        check_penalties(self.presence_penalty, self.frequency_penalty, self.repetition_penalty)
        self._check_outputs()

    def _check_decoder(self) -> None:
        _check(
            self.decoder is None or self.decoder in DECODER_NAMES, "decoder", self.decoder, f"one of {DECODER_NAMES}"
        )
        _check(self.threshold is None or 0 <= self.threshold <= 1, "threshold", self.threshold, "in [0, 1]")
        _check(self.steps is None or self.steps >= 1, "steps", self.steps, ">= 1")
        _check(self.entropy_bound is None or self.entropy_bound >= 0, "entropy_bound", self.entropy_bound, ">= 0")
        _check(
            self.edit_threshold is None or 0 <= self.edit_threshold <= 1,
            "edit_threshold",
            self.edit_threshold,
            "in [0, 1]",
        )
        _check(
            self.max_post_edit_steps is None or self.max_post_edit_steps >= 0,
            "max_post_edit_steps",
            self.max_post_edit_steps,
            ">= 0",
        )

    def _check_outputs(self) -> None:
        """Stops, logprobs and the grammar's compatibility with the decoder."""
        _check(all(isinstance(s, str) and s for s in self.stop), "stop", self.stop, "non-empty strings")
        _check(
            all(isinstance(t, int) and t >= 0 for t in self.stop_token_ids),
            "stop_token_ids",
            self.stop_token_ids,
            "non-negative token ids",
        )
        _check(
            self.logprobs is None or (type(self.logprobs) is int and 0 <= self.logprobs <= MAX_LOGPROBS),
            "logprobs",
            self.logprobs,
            f"an integer in [0, {MAX_LOGPROBS}] (the top alternatives returned per token), or None",
        )
        _check(
            self.prompt_logprobs is None
            or (type(self.prompt_logprobs) is int and 0 <= self.prompt_logprobs <= MAX_LOGPROBS),
            "prompt_logprobs",
            self.prompt_logprobs,
            f"an integer in [0, {MAX_LOGPROBS}] (the top alternatives returned per prompt token), or None",
        )
        kinds = {kind.value for kind in RequestOutputKind}
        _check(self.output_kind in kinds, "output_kind", self.output_kind, f"a RequestOutputKind ({sorted(kinds)})")
        _check(
            self.structured_outputs is None or self.decoder != "edit",
            "decoder",
            self.decoder,
            "not edit with structured_outputs (an edited token could leave the grammar)",
        )

    def _check_renoise(self) -> None:
        _check(self.t_min is None or self.t_min >= 0, "t_min", self.t_min, ">= 0")
        _check(self.t_max is None or self.t_max > 0, "t_max", self.t_max, "> 0")
        _check(
            self.t_min is None or self.t_max is None or self.t_min < self.t_max,
            "t_min",
            self.t_min,
            f"below t_max ({self.t_max})",
        )
        _check(
            self.stability_threshold is None
            or (type(self.stability_threshold) is int and self.stability_threshold >= 0),
            "stability_threshold",
            self.stability_threshold,
            "an integer >= 0",
        )
        _check(
            self.confidence_threshold is None or self.confidence_threshold > 0,
            "confidence_threshold",
            self.confidence_threshold,
            "> 0",
        )

    def with_defaults(
        self,
        defaults: Mapping[str, Any],
        *,
        max_tokens_limit: int | None = None,
        eos_token_ids: Sequence[int] = (),
        block_length: int | None = None,
    ) -> ResolvedSamplingParams:
        """Resolves every None knob from `defaults` (the model's generation config), then from BUILTIN_DEFAULTS.

        `max_tokens_limit`: the most tokens the engine can generate for this prompt; max_tokens is capped to it
        and None becomes it (without a limit, max_tokens must be set). `eos_token_ids` join the stop ids unless
        ignore_eos. With `block_length` (one step per token when steps is unset), the defaults'
        STEPS_CAPPED_BY_MAX_TOKENS applies."""
        knobs = {name: getattr(self, name) for name in MODEL_DEFAULTED}
        for name, value in knobs.items():
            if value is None:
                knobs[name] = defaults.get(name, BUILTIN_DEFAULTS.get(name))
        if max_tokens_limit is not None:
            max_tokens = min(max_tokens_limit if self.max_tokens is None else self.max_tokens, max_tokens_limit)
        elif self.max_tokens is not None:
            max_tokens = self.max_tokens
        else:
            raise ValueError("max_tokens: None (up to max_model_len) needs the engine's max_tokens_limit")
        eos = () if self.ignore_eos else tuple(eos_token_ids)
        if knobs["t_min"] >= knobs["t_max"]:
            raise RequestError("t_min", f"got {knobs['t_min']!r}, must be below t_max ({knobs['t_max']!r})")
        check_penalties(knobs["presence_penalty"], knobs["frequency_penalty"], knobs["repetition_penalty"])
        if defaults.get(STEPS_CAPPED_BY_MAX_TOKENS) and block_length is not None:
            knobs["steps"] = min(knobs["steps"] or block_length, max_tokens)
        return ResolvedSamplingParams(
            n=self.n,
            top_p=self.top_p,
            top_k=self.top_k,
            seed=self.seed,
            max_tokens=max_tokens,
            min_tokens=self.min_tokens,
            stop=list(self.stop),
            stop_token_ids=list(self.stop_token_ids),
            stop_ids=frozenset((*eos, *self.stop_token_ids)),
            ignore_eos=self.ignore_eos,
            skip_special_tokens=self.skip_special_tokens,
            include_stop_str_in_output=self.include_stop_str_in_output,
            structured_outputs=self.structured_outputs,
            logprobs=self.logprobs,
            prompt_logprobs=self.prompt_logprobs,
            record_denoising=self.record_denoising,
            penalize_prompt=self.penalize_prompt,
            output_kind=RequestOutputKind(self.output_kind),
            **knobs,
        )

    def replace(self, **changes: Any) -> SamplingParams:
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True)
class ResolvedSamplingParams:
    """What a request is decoded with: SamplingParams after `with_defaults`. Field meanings are SamplingParams'."""

    n: int
    temperature: float
    top_p: float
    top_k: int
    seed: int | None
    """None: the engine draws one (a real choice, not a missing default)."""
    max_tokens: int
    """Capped to what fits within max_model_len."""
    min_tokens: int
    stop: list[str]
    stop_token_ids: list[int]
    stop_ids: frozenset[int]
    """The token ids that end the request: EOS (unless ignore_eos) and stop_token_ids."""
    ignore_eos: bool
    skip_special_tokens: bool
    include_stop_str_in_output: bool
    decoder: str
    threshold: float
    steps: int | None
    """None: block_length steps (one token a step). The block length belongs to the run, not to the request,
    so the decoder applies it."""
    entropy_bound: float
    edit_threshold: float
    max_post_edit_steps: int
    t_min: float = RENOISE_DEFAULTS["t_min"]
    t_max: float = RENOISE_DEFAULTS["t_max"]
    stability_threshold: int = RENOISE_DEFAULTS["stability_threshold"]
    confidence_threshold: float = RENOISE_DEFAULTS["confidence_threshold"]
    structured_outputs: StructuredOutputsParams | None = None
    logprobs: int | None = None
    """Top alternatives per generated token; None = no logprobs computed (SamplingParams.logprobs)."""
    prompt_logprobs: int | None = None
    """Top alternatives per scored prompt token; None = the prompt is not scored (SamplingParams.prompt_logprobs)."""
    record_denoising: bool = False
    """Whether the request keeps each denoising step's writes (SamplingParams.record_denoising)."""
    presence_penalty: float = PENALTY_DEFAULTS["presence_penalty"]
    frequency_penalty: float = PENALTY_DEFAULTS["frequency_penalty"]
    repetition_penalty: float = PENALTY_DEFAULTS["repetition_penalty"]
    penalize_prompt: bool = False
    output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE

    @property
    def has_penalties(self) -> bool:
        """Whether any penalty changes the logits (a request without pays nothing for them)."""
        return bool(self.presence_penalty or self.frequency_penalty or self.repetition_penalty != 1)

    @property
    def is_greedy(self) -> bool:
        """Temperatures below 1e-5 decode greedily (vLLM's rule): dividing logits by them overflows. The renoise
        decoder always samples, at its schedule's temperatures (`temperature` does not apply to it)."""
        return self.temperature < GREEDY_BELOW and not self.is_renoise

    @property
    def is_renoise(self) -> bool:
        """Whether the request decodes renoise canvases (decoder=renoise)."""
        return self.decoder == RENOISE

    @property
    def is_verified(self) -> bool:
        """Whether the request's blocks are drafts that the commit forward verifies (decoder=verified or auto)."""
        return self.decoder == VERIFIED or self.decoder == AUTO

    @property
    def is_auto(self) -> bool:
        """Whether the engine chooses, step by step, between drafting and deciding only the next token."""
        return self.decoder == AUTO

    @property
    def is_editing(self) -> bool:
        """Whether accepted tokens may still change while their block is open (decoder=edit)."""
        return self.decoder == "edit"

    @property
    def post_edit_budget(self) -> int:
        """Steps a block may take after its masks are gone: max_post_edit_steps with decoder=edit, else 0."""
        return self.max_post_edit_steps if self.is_editing else 0

    def replace(self, **changes: Any) -> ResolvedSamplingParams:
        return dataclasses.replace(self, **changes)


def check_penalties(presence: float | None, frequency: float | None, repetition: float | None) -> None:
    """The penalties' ranges (OpenAI's for presence and frequency, vLLM's for repetition); None = unset."""
    _check(presence is None or -2 <= presence <= 2, "presence_penalty", presence, "in [-2, 2] (0 = off)")
    _check(frequency is None or -2 <= frequency <= 2, "frequency_penalty", frequency, "in [-2, 2] (0 = off)")
    _check(repetition is None or repetition > 0, "repetition_penalty", repetition, "> 0 (1 = off)")


def _check(ok: bool, name: str, value: Any, allowed: str) -> None:
    if not ok:
        raise RequestError(name, f"got {value!r}, must be {allowed}")
