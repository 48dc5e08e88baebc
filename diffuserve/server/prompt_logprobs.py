"""Prompt scores on the wire: the engine's per-position `prompt_logprobs` as OpenAI's legacy completions
`logprobs` of an echoed prompt (lm-eval's loglikelihood request: `echo`, `logprobs`, `max_tokens: 0`) and as
vLLM's `prompt_logprobs` choice field (docs/serving/logprobs.md, "Prompt scoring").

The legacy shape lists every prompt token: the first with a null logprob and null top alternatives (it has no
score, as in OpenAI's and vLLM's answers), each other with its logprob and a `top_logprobs` dict of the k most
likely tokens plus the prompt token itself (up to k + 1 entries, as OpenAI's). A token is shown as its own text
(`decoded_token`: special tokens spelled out), or `token_id:N` without a tokenizer; `text_offset` adds up those
texts' lengths from 0, as vLLM does. Knows nothing of the engine but its output types.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from diffuserve.core.outputs import Logprob, RequestOutput, TokenLogprobs
from diffuserve.server.response_models import CompletionLogprobs, PromptLogprob


def token_text(token: int, logprob: Logprob) -> str:
    return logprob.decoded_token if logprob.decoded_token is not None else f"token_id:{token}"


def echo_logprobs(token_ids: list[int], scores: list[TokenLogprobs | None], k: int, first: str) -> CompletionLogprobs:
    """The prompt `token_ids` with their `scores` (None at position 0) in the legacy shape, `k` alternatives per
    position; `first`: the text of the first token, which has no entry to carry it."""
    out = CompletionLogprobs()
    offset = 0
    for token, entry in zip(token_ids, scores):
        if entry is None:
            text, logprob, top = first, None, None
        else:
            chosen = entry[token]
            text, logprob = token_text(token, chosen), chosen.logprob
            top = {token_text(t, lp): lp.logprob for t, lp in sorted(entry.items(), key=lambda e: e[1].rank)[:k]}
            top.setdefault(text, chosen.logprob)
        out.tokens.append(text)
        out.token_logprobs.append(logprob)
        out.top_logprobs.append(top)
        out.text_offset.append(offset)
        offset += len(text)
    return out


def end_offset(logprobs: CompletionLogprobs | None) -> int:
    """The text offset just past the last token (0 for none)."""
    if logprobs is None or not logprobs.tokens:
        return 0
    return logprobs.text_offset[-1] + len(logprobs.tokens[-1])


def concat_logprobs(first: CompletionLogprobs | None, then: CompletionLogprobs | None) -> CompletionLogprobs | None:
    """`first`'s tokens followed by `then`'s (whose text offsets already continue `first`'s)."""
    if first is None or then is None:
        return then if first is None else first
    return CompletionLogprobs(
        tokens=first.tokens + then.tokens,
        token_logprobs=first.token_logprobs + then.token_logprobs,
        top_logprobs=first.top_logprobs + then.top_logprobs,
        text_offset=first.text_offset + then.text_offset,
    )


def vllm_prompt_logprobs(scores: list[TokenLogprobs | None]) -> list[dict[int, PromptLogprob] | None]:
    """vLLM's `prompt_logprobs`: per position, token id -> {logprob, rank, decoded_token} (None at position 0)."""
    return [
        None if entry is None else {t: PromptLogprob(**dataclasses.asdict(lp)) for t, lp in entry.items()}
        for entry in scores
    ]


@dataclass(frozen=True)
class PromptScoring:
    """What a completions request asked to see of its prompts' scores."""

    echo_top: int | None = None
    """With echo and logprobs: the top alternatives per prompt token in each choice's `logprobs`."""
    vllm: bool = False
    """prompt_logprobs was set: each choice carries `prompt_logprobs`."""
    first_tokens: tuple[str, ...] = ()
    """Per prompt, the text of its first token."""

    @property
    def asks(self) -> bool:
        """Whether any prompt score is shown."""
        return self.echo_top is not None or self.vllm

    def echo_logprobs(self, prompt: int, output: RequestOutput) -> CompletionLogprobs | None:
        """The legacy logprobs of prompt `prompt`'s echo (None unless asked, or before the prompt is scored)."""
        if self.echo_top is None or output.prompt_logprobs is None:
            return None
        return echo_logprobs(output.prompt_token_ids, output.prompt_logprobs, self.echo_top, self.first_tokens[prompt])

    def prompt_logprobs(self, output: RequestOutput) -> list[dict[int, PromptLogprob] | None] | None:
        if not self.vllm or output.prompt_logprobs is None:
            return None
        return vllm_prompt_logprobs(output.prompt_logprobs)
