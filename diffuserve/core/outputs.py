"""What the engine hands back to callers: `RequestOutput` (a user request: its prompt and n completions),
`CompletionOutput` (one completion's text, tokens and finish reason), `RequestMetrics`, and the logprob shapes
(`Logprob`, `TokenLogprobs`). vLLM's shapes, plus the diffusion counters (NFE, TPF).

Plain data, no behaviour beyond derived counts: filled by the output processor, read by the offline API, the
server and the benchmarks. Knows nothing of requests' scheduling, tokenizers or stop strings. No torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Logprob:
    """A token's log-probability under one distribution (vLLM's shape)."""

    logprob: float
    rank: int
    """1-based rank of the token in that distribution (1: the most likely)."""
    decoded_token: str | None = None


TokenLogprobs = dict[int, Logprob]
"""One position: the token there and the top-k alternatives from the same distribution, by token id."""


@dataclass(frozen=True)
class DraftCheck:
    """decoder=verified: what the forward that committed a drafted block found, in output positions. The checked
    drafts are `accepted` then `rejected`; the first rejected one differed from the causal path, whose token
    (`causal`) was written there instead, and the drafts after it are dropped with it (the block is redrafted)."""

    accepted: tuple[tuple[int, int], ...]
    """(output position, token) pairs of the drafts the check kept."""
    rejected: tuple[tuple[int, int], ...]
    """(output position, drafted token) pairs it did not keep; empty when every checked draft was kept."""
    causal: tuple[int, int] | None
    """(output position, token) the causal path wrote at the first rejected draft; None when none was rejected."""


@dataclass(frozen=True)
class DenoisingStep:
    """What one denoising step wrote into a request's block, in output positions (0 = the first generated token).

    The block's generated positions are [start, end): the first block starts after the prompt's tail, so its
    span may be shorter than the block length."""

    block: int
    """The block's index among the request's generated blocks (0 = the block the prompt's tail opens)."""
    step: int
    """The step's number within its block, from 1."""
    start: int
    end: int
    writes: tuple[tuple[int, int], ...]
    """(output position, token) pairs the step accepted (or, for decoder=edit, rewrote); empty if none. For a
    check: the kept drafts and the causal token, the positions whose final tokens it decided."""
    check: DraftCheck | None = None
    """decoder=verified: set on the entry that reports the check of the block's draft (made by the forward that
    also carries the next block's step, an entry of its own, or, on a rejection, discards that step); its `step`
    follows the draft's last. None for a denoising step."""


@dataclass
class CompletionOutput:
    """One completion's output. While a request runs, the engine updates the same object after every step, and
    its `token_ids` and `logprobs` lists grow in place (a step appends its new tokens, not a copy of the whole
    output: vLLM's cumulative outputs share their lists too); copy them to keep one step's view."""

    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None = None
    """stop, length, abort or error; None while running."""
    stop_reason: int | str | None = None
    """The stop token id or stop string that ended the completion."""
    num_forwards: int = 0
    """NFE: denoising forwards this completion took part in (prefill chunks excluded)."""
    num_draft_tokens: int = 0
    """decoder=verified: drafted tokens its commit forwards checked ..."""
    num_accepted_tokens: int = 0
    """... and kept (both 0 for the other decoders)."""
    error: str | None = None
    logprobs: list[TokenLogprobs] | None = None
    """With SamplingParams.logprobs: per token, its logprob and the top alternatives, `decoded_token` filled.
    One per token of `token_ids` once finished; while running, those of the tokens whose text `text` shows (a
    token whose text is held back, for a stop string or an incomplete character, follows with its text)."""
    denoising_steps: list[DenoisingStep] | None = None
    """With SamplingParams.record_denoising: every denoising step's writes so far, oldest first (a copy: the
    engine's list goes on growing). They may reach past `token_ids` (a block's positions after a stop)."""

    @property
    def tokens_per_forward(self) -> float:
        """TPF = generated tokens / NFE."""
        return len(self.token_ids) / self.num_forwards if self.num_forwards else 0.0

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestMetrics:
    arrival_time: float
    first_token_time: float | None = None
    """When the first block of generated tokens was final."""
    finished_time: float | None = None


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    metrics: RequestMetrics
    num_cached_tokens: int = 0
    """Prompt tokens served from the prefix cache."""
    new_token_counts: list[int] = field(default_factory=list)
    """Per completion, tokens that became final in the step that produced this output."""
    prompt_logprobs: list[TokenLogprobs | None] | None = None
    """With SamplingParams.prompt_logprobs: per prompt position, the token's logprob and top alternatives
    (None at position 0, which has no score); None until the whole prompt is scored."""

    @property
    def finished(self) -> bool:
        return all(o.finished for o in self.outputs)

    @property
    def num_forwards(self) -> int:
        return sum(o.num_forwards for o in self.outputs)

    @property
    def tokens_per_forward(self) -> float:
        nfe = self.num_forwards
        return sum(len(o.token_ids) for o in self.outputs) / nfe if nfe else 0.0


@dataclass(frozen=True, slots=True)
class RequestProgress:
    """How far a user request whose caller takes its finished output only (`RequestOutputKind.FINAL_ONLY`) has
    come, as of the last step that ran it: what its metrics need while it produces no output."""

    request_id: str
    num_tokens: int
    """Output tokens of all its completions so far."""
    finish_reasons: list[str | None]
    """Per completion: its finish reason if it finished (a sibling may finish before the others), else None."""
