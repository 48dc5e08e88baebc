"""The naive reference decoder for `clover_moe` (a test oracle, deliberately slow and obviously correct).

Block diffusion: blocks of `block_length` positions aligned to absolute position 0 (the prompt's last partial
block is completed by the first generated tokens). For every denoising step the committed prefix (every whole
block before the current one) is recomputed causally from nothing, then the current block is previewed; the
masked positions whose greedy confidence beats `threshold` are accepted (at least the most confident one). A full
block is committed simply by being part of the next step's recomputed prefix. With `prediction_shift` position p
is read from the output row p - 1 (the previous block's last row for a block's first position), else from row p.

Autoregressive: every token recomputes the whole sequence causally and takes the last row's prediction.

Temperature 0 is argmax (never the mask token, whose mass still counts in the confidence); above 0 tokens are
sampled from softmax(logits / T) without the mask token, with the given generator, and the
confidence is the sampled token's probability. Knows nothing of the engine (it must not import it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, cast

import torch
from torch import nn

from diffuserve.model.config import ModelArgs
from diffuserve.model.families.clover_moe.config import hybrid_args
from diffuserve.model.families.clover_moe.dense import HybridState
from diffuserve.reference.reference_coreset import block_coreset_routing


class HybridLM(Protocol):
    """What the oracle calls: a clover_moe model read whole (model/families/clover_moe/dense.py's DenseClover), or
    a wrapper of one (bench compare counts its forwards)."""

    @property
    def args(self) -> ModelArgs: ...

    def forward_causal(
        self, input_ids: torch.Tensor, state: HybridState | None = None
    ) -> tuple[torch.Tensor, HybridState]: ...

    def forward_preview(self, input_ids: torch.Tensor, state: HybridState | None = None) -> torch.Tensor: ...

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor: ...


@dataclass(frozen=True)
class ReferenceSettings:
    max_new_tokens: int
    threshold: float = 0.9
    temperature: float = 0.0
    eos_token_ids: tuple[int, ...] = ()
    block_expert_coreset: int = 0
    """C of block expert coreset routing in the block's preview (reference_coreset.py); 0 = per-token."""


def _pick(
    logits: torch.Tensor, temperature: float, generator: torch.Generator | None, never: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [M, V] fp32 -> (tokens [M], confidences [M]); the token `never` is never picked. Greedy: the
    argmax (or, where that is `never`, the best other token) and its probability under the softmax of the whole
    vocabulary, `never` included. Sampled: `never` removed, then softmax(logits / T)."""
    allowed = logits.clone()
    if never is not None:
        allowed[:, never] = float("-inf")
    if temperature == 0:
        tokens = logits.argmax(dim=-1)
        if never is not None:
            tokens = torch.where(tokens == never, allowed.argmax(dim=-1), tokens)
        return tokens, torch.softmax(logits, dim=-1).gather(1, tokens[:, None])[:, 0]
    probs = torch.softmax(allowed / temperature, dim=-1)
    tokens = torch.multinomial(probs, 1, generator=generator)[:, 0]
    return tokens, probs.gather(1, tokens[:, None])[:, 0]


@torch.no_grad()
def _block_logits(model: HybridLM, seq: list[int], start: int, block: list[int], coreset: int = 0) -> torch.Tensor:
    """Logits [len(block), V] that predict each position of the block at this step (the preview routed by a
    block expert coreset of `coreset` experts when > 0; the causal prefix always per token)."""
    prefix = torch.tensor([seq[:start]], dtype=torch.long)
    hidden, state = model.forward_causal(prefix) if start else (None, None)
    with block_coreset_routing(cast(nn.Module, model), 0, len(block), coreset):
        preview = model.forward_preview(torch.tensor([block], dtype=torch.long), state)[0]  # [B, H]
    if hybrid_args(model.args).prediction_shift:
        # Row p - 1 predicts position p; the sequence's position 0 is never masked, so its own row fills in.
        previous = hidden[0, -1:] if hidden is not None else preview[:1]
        preview = torch.cat([previous, preview[:-1]])
    return model.compute_logits(preview)


def _truncate(generated: list[int], settings: ReferenceSettings) -> list[int]:
    generated = generated[: settings.max_new_tokens]
    for i, token in enumerate(generated):
        if token in settings.eos_token_ids:
            return generated[: i + 1]
    return generated


def reference_block_decode(
    model: HybridLM,
    prompt: list[int],
    settings: ReferenceSettings,
    generator: torch.Generator | None = None,
) -> list[int]:
    """-> the generated token ids (prompt excluded), up to and including the first EOS."""
    length, mask_id = model.args.block_length, model.args.mask_token_id
    seq = list(prompt)
    while len(seq) - len(prompt) < settings.max_new_tokens:
        start = len(seq) // length * length
        block = seq[start:] + [mask_id] * (start + length - len(seq))
        while mask_id in block:
            is_mask = torch.tensor([token == mask_id for token in block])
            if is_mask[0] and start == 0:
                raise ValueError("reference decode: the first position of the sequence cannot be masked")
            logits = _block_logits(model, seq, start, block, settings.block_expert_coreset)
            tokens, conf = _pick(logits, settings.temperature, generator, never=mask_id)
            conf = conf.masked_fill(~is_mask, -1.0)
            accept = is_mask & (conf > settings.threshold)
            accept[conf.argmax()] = True  # top-1 fallback: every step accepts at least one position
            block = [int(t) if a else b for t, a, b in zip(tokens, accept, block)]
        seq = seq[:start] + block
        if any(t in settings.eos_token_ids for t in seq[len(prompt) :]):
            break
    return _truncate(seq[len(prompt) :], settings)


@torch.no_grad()
def reference_ar_decode(
    model: HybridLM,
    prompt: list[int],
    settings: ReferenceSettings,
    generator: torch.Generator | None = None,
) -> list[int]:
    """Next-token decoding through the causal trunk, recomputing the whole sequence for every token."""
    seq = list(prompt)
    while len(seq) - len(prompt) < settings.max_new_tokens:
        hidden, _ = model.forward_causal(torch.tensor([seq], dtype=torch.long))
        logits = model.compute_logits(hidden[0, -1:])
        if 0 <= model.args.mask_token_id < logits.shape[-1]:
            logits[:, model.args.mask_token_id] = float("-inf")  # as the engine: the mask token is never output
        token, _ = _pick(logits, settings.temperature, generator)
        seq.append(int(token))
        if seq[-1] in settings.eos_token_ids:
            break
    return seq[len(prompt) :]
