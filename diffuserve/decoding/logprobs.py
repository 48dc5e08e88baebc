"""Output-token logprobs: from a step's sampling distribution to each written token's `Logprob` and its top
alternatives (docs/serving/logprobs.md, "Logprobs").

A token's logprob is its log-probability under the distribution the decoder accepted it from: the step's
distribution at its position after temperature, top-k and top-p (temperature 0: the plain softmax of the
logits), with min_tokens' suppressed stop ids and, for structured output, the grammar's forbidden tokens at
probability 0. The top alternatives come from the same distribution; a token it gives no probability is never
one. `rank` is 1 + the number of tokens strictly more probable.

Computed only for requests that ask (`SamplingParams.logprobs`), on the logits' device and canvas-shaped like
the proposal (`LogprobRows`); `token_logprobs` brings the written positions' values to the host in one transfer
per request and step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from diffuserve.core.outputs import Logprob, TokenLogprobs


@dataclass(frozen=True)
class LogprobRows:
    """Per canvas position of one block [B]: the proposed token's logprob and rank, and the top-k alternatives."""

    chosen: torch.Tensor
    """[B] fp32: logprob of the proposed token (-inf where nothing was proposed)."""
    rank: torch.Tensor
    """[B] long: 1-based rank of the proposed token in its distribution."""
    top_ids: torch.Tensor
    """[B, k] long: the k most probable tokens, most probable first."""
    top_values: torch.Tensor
    """[B, k] fp32: their logprobs (-inf past the distribution's support)."""

    @staticmethod
    def empty(block_length: int, k: int, device: torch.device) -> LogprobRows:
        return LogprobRows(
            torch.full((block_length,), float("-inf"), device=device),
            torch.zeros(block_length, dtype=torch.long, device=device),
            torch.zeros(block_length, k, dtype=torch.long, device=device),
            torch.full((block_length, k), float("-inf"), device=device),
        )

    def copy_row(self, index: int, other: LogprobRows) -> None:
        """Takes canvas position `index` from `other` (the grammar walk proposes one position at a time)."""
        self.chosen[index], self.rank[index] = other.chosen[index], other.rank[index]
        self.top_ids[index], self.top_values[index] = other.top_ids[index], other.top_values[index]


def logprob_rows(
    log_probs: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor, block_length: int, k: int
) -> LogprobRows:
    """log_probs [M, V] (the rows' log-distributions), tokens [M] proposed at canvas indices `positions` [M]
    -> canvas-shaped LogprobRows [B] with the top `k` alternatives."""
    chosen = log_probs.gather(-1, tokens[:, None])  # [M, 1]
    rank = (log_probs > chosen).sum(-1) + 1
    top_values, top_ids = torch.topk(log_probs, min(k, log_probs.shape[-1]), dim=-1)
    rows = LogprobRows.empty(block_length, top_ids.shape[-1], log_probs.device)
    rows.chosen[positions], rows.rank[positions] = chosen.squeeze(-1), rank
    rows.top_ids[positions], rows.top_values[positions] = top_ids, top_values
    return rows


def token_logprobs(rows: LogprobRows, tokens: torch.Tensor, indices: torch.Tensor) -> list[TokenLogprobs]:
    """The written canvas `indices` [W] (tokens [B]: the proposal's) as host TokenLogprobs, in that order: the
    written token first, then the alternatives by rank (those outside the distribution's support left out)."""
    if not indices.numel():
        return []
    return host_logprobs(
        tokens[indices], rows.chosen[indices], rows.rank[indices], rows.top_ids[indices], rows.top_values[indices]
    )


def host_logprobs(
    tokens: torch.Tensor, chosen: torch.Tensor, rank: torch.Tensor, top_ids: torch.Tensor, top_values: torch.Tensor
) -> list[TokenLogprobs]:
    """Written tokens [W] with their logprob [W], rank [W] and top alternatives [W, k] (ids, logprobs) -> host
    TokenLogprobs, one per token (two transfers): the token first, then the alternatives by rank (those outside
    the distribution's support left out)."""
    ids = torch.cat([tokens[:, None], rank[:, None], top_ids], dim=1).tolist()
    values = torch.cat([chosen[:, None], top_values], dim=1).tolist()
    out = []
    for (token, token_rank, *alternatives), (logprob, *alternative_values) in zip(ids, values):
        entry = {token: Logprob(logprob, token_rank)}
        for top_id, value in zip(alternatives, alternative_values):
            if value != float("-inf"):
                # Ties share a rank, as the written token's rank counts only strictly more probable tokens.
                entry.setdefault(top_id, Logprob(value, 1 + sum(v > value for v in alternative_values)))
        out.append(entry)
    return out
