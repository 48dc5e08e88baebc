"""Output-token logprobs on the wire: the engine's per-token `TokenLogprobs` as OpenAI's chat shape
(`logprobs.content`) and its legacy completions shape (`tokens`, `token_logprobs`, `top_logprobs`,
`text_offset`), for a whole completion or for the tokens one stream chunk carries.

A token is shown as the engine's `decoded_token` (its text alone, special tokens spelled out), or `token_id:N`
when the model directory has no tokenizer. `bytes` are the UTF-8 bytes of that text, so a token that is part of
a multi-byte character shows U+FFFD. Chat's `top_logprobs` are the k most probable tokens; the legacy shape's
also hold the written token, as OpenAI's do ("up to logprobs + 1 elements"). A completions token's
`text_offset` adds the lengths of the tokens before it, as vLLM does. Knows nothing of the engine but these types.
"""

from __future__ import annotations

from diffuserve.core.outputs import Logprob, TokenLogprobs
from diffuserve.server.response_models import ChatLogprobs, CompletionLogprobs, TokenLogprob, TopLogprob


def token_text(token: int, logprob: Logprob) -> str:
    return logprob.decoded_token if logprob.decoded_token is not None else f"token_id:{token}"


def top_alternatives(entry: TokenLogprobs, k: int) -> list[tuple[int, Logprob]]:
    """The k most probable tokens of a position (the written token counts when it is one of them)."""
    return sorted(entry.items(), key=lambda item: item[1].rank)[:k]


def chat_logprobs(entries: list[TokenLogprobs], token_ids: list[int], k: int) -> ChatLogprobs:
    """`entries[i]` holds the logprobs of `token_ids[i]` and its top `k` alternatives."""
    content = []
    for token, entry in zip(token_ids, entries):
        chosen = entry[token]
        text = token_text(token, chosen)
        top = [
            TopLogprob(token=token_text(t, lp), logprob=lp.logprob, bytes=list(token_text(t, lp).encode()))
            for t, lp in top_alternatives(entry, k)
        ]
        content.append(TokenLogprob(token=text, logprob=chosen.logprob, bytes=list(text.encode()), top_logprobs=top))
    return ChatLogprobs(content=content)


def completion_logprobs(
    entries: list[TokenLogprobs], token_ids: list[int], k: int, text_offset: int = 0
) -> CompletionLogprobs:
    """As chat_logprobs, in the legacy shape; `text_offset`: the offset of the first token."""
    out = CompletionLogprobs()
    for token, entry in zip(token_ids, entries):
        chosen = entry[token]
        text = token_text(token, chosen)
        out.tokens.append(text)
        out.token_logprobs.append(chosen.logprob)
        top = dict(top_alternatives(entry, k))
        top.setdefault(token, chosen)
        out.top_logprobs.append({token_text(t, lp): lp.logprob for t, lp in top.items()})
        out.text_offset.append(text_offset)
        text_offset += len(text)
    return out


def text_length(entries: list[TokenLogprobs], token_ids: list[int]) -> int:
    """Characters the tokens' texts add up to: the text offset of the token after them."""
    return sum(len(token_text(token, entry[token])) for token, entry in zip(token_ids, entries))
