"""Which keys a DiffusionGemma query may see, per layer kind: the masks and key ranges its attention inputs carry.

A sequence's tokens are either *committed* (the prompt and every finished canvas: the encoder's causal rows,
whose K/V the cache keeps) or the current *canvas* (the decoder's rows, bidirectional, never kept). With P
committed tokens and the canvas at positions [P, P + C), window W (transformers' DynamicCache keeps the last W - 1
committed tokens of a sliding layer, and its masks):

    committed row q, full layer     keys k <= q                      (causal)
    committed row q, sliding layer  keys q - W < k <= q              (causal, the last W positions)
    canvas row, full layer          keys [0, P + C)                  (every committed key, the whole canvas)
    canvas row, sliding layer       keys [max(0, P - (W - 1)), P + C) (the last W - 1 committed, the whole canvas)

So a sliding layer never reads a key more than W - 1 + C positions behind the last row of a step: K/V pages
wholly before `key_start(...)` of a sequence's next step can be freed. Knows nothing of pages or requests: the
paged helpers take key positions and return masks; the caller maps positions to slots.
"""

from __future__ import annotations

import torch

from diffuserve.model.families.diffusion_gemma.attention import GemmaAttentionInputs
from diffuserve.model.families.diffusion_gemma.config import FULL, SLIDING, GemmaArgs
from diffuserve.model.layers.attention import DenseAttentionInputs


def key_start(kind: str, window: int, first_row: int) -> int:
    """The first key position a step's rows, the first at position `first_row`, may read in a `kind` layer."""
    return 0 if kind == FULL else max(0, first_row - (window - 1))


def rows_mask(
    kind: str, window: int, query_positions: torch.Tensor, key_positions: torch.Tensor, is_canvas: bool
) -> torch.Tensor | None:
    """[Lq, L] bool (True = may attend) for rows of one role over the keys `key_positions` [L] of their range
    (`key_start` .. the last row); None for canvas rows, which see every key of that range."""
    if is_canvas:
        return None
    visible = key_positions[None, :] <= query_positions[:, None]
    if kind == SLIDING:
        visible &= key_positions[None, :] > query_positions[:, None] - window
    return visible


def dense_mask(kind: str, window: int, positions: torch.Tensor, is_canvas: torch.Tensor) -> torch.Tensor:
    """[T, T] bool for one sequence laid out whole (committed tokens, then at most one canvas): the table above."""
    q, k = positions[:, None], positions[None, :]
    committed_k = ~is_canvas[None, :]
    committed_rows = committed_k & (k <= q)
    if kind == SLIDING:
        committed_rows &= k > q - window
    canvas_start = positions[is_canvas].min() if bool(is_canvas.any()) else positions.max() + 1
    canvas_rows = torch.ones_like(committed_rows)
    if kind == SLIDING:
        canvas_rows = is_canvas[None, :] | (k >= canvas_start - (window - 1))
    return torch.where(is_canvas[:, None], canvas_rows, committed_rows)


def dense_inputs(gemma: GemmaArgs, positions: torch.Tensor, is_canvas: torch.Tensor) -> GemmaAttentionInputs:
    """Dense (no cache) inputs for Bt sequences of one layout: positions, is_canvas [T] -> masks [1, 1, T, T]."""
    window = gemma.sliding_window
    masks = {kind: dense_mask(kind, window, positions, is_canvas)[None, None] for kind in (SLIDING, FULL)}
    return GemmaAttentionInputs(DenseAttentionInputs(masks[SLIDING]), DenseAttentionInputs(masks[FULL]))
