"""Training batches for block diffusion on a hybrid (`clover_moe`) model, matching the engine's decoding exactly.

Owns the layout of a batch: clean conversations plus noised copies of their answer blocks. The forward and the
loss are `hybrid_forward`'s; knows nothing of models, optimisers or checkpoints.

The engine denoises one block at a time: the committed prefix runs through the causal trunk (attention K/V and
GDN state after it), then the block - prompt tokens clean, the rest masked or accepted - is previewed against
that state, bidirectionally inside the block. A batch reproduces this for every answer block at once:

    clean_ids  [B, L]   each whole conversation, causal; its state at every block boundary is kept
    clean_targets [B, L] each reply token (every assistant turn, <|im_end|> included), for the next-token loss
    noisy_ids  [M, T]   M noised blocks (several independent copies per answer block), each previewed against
                        the state of its row's clean prefix at its block start (`noisy_rows`, `noisy_blocks`)

With the prediction shift (the `clover_moe` default, `diffusion_prediction_shift`), position p is predicted
from output row p - 1: inside a block from the previewed row before it, and for the block's first position from
the clean trunk's row at the block start - 1, as the engine reads the committed prefix's last row. The
next-token (autoregressive) loss reads the clean stream the same way: reply token p from causal row p - 1, as
the engine's causal rows do when verified decoding checks a block's drafts.

Only the last turn of a conversation is noised: earlier turns are its prompt (the history a chat sends back),
and their final blocks hold the next turn's template tokens, which a decode never sees clean.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .diffusion_batch import END_OF_TEXT, noise_answer_blocks, reply_positions


@dataclass(frozen=True)
class HybridBatch:
    clean_ids: torch.Tensor
    """[B, L] long, L a multiple of the block length (right-padded with <|endoftext|>, which only later
    positions of a causal stream could see)."""
    clean_targets: torch.Tensor
    """[B, L] long: the token at every reply position (reply_positions), -100 elsewhere."""
    noisy_ids: torch.Tensor
    """[M, T] long: noised answer blocks."""
    noisy_rows: torch.Tensor
    """[M] long: the clean row each noisy block belongs to."""
    noisy_blocks: torch.Tensor
    """[M] long: its absolute block index (always >= 1: the prompt fills block 0)."""
    targets: torch.Tensor
    """[M, T] long: the clean token at masked positions, -100 elsewhere."""


def build_hybrid_batch(
    encoded: list[tuple[list[int], int]], block_length: int, generator: torch.Generator, num_copies: int = 1
) -> HybridBatch:
    """encoded: (ids, number of prompt ids) per conversation, ids a whole number of blocks
    (encode_conversation)."""
    width = max(len(ids) for ids, _ in encoded)
    clean = torch.full((len(encoded), width), END_OF_TEXT, dtype=torch.long)
    clean_targets = torch.full_like(clean, -100)
    noisy, rows, blocks, targets = [], [], [], []
    for row, (ids, num_prompt) in enumerate(encoded):
        if num_prompt < block_length:
            raise ValueError(
                f"prompt: {num_prompt} tokens; the first block must be prompt only "
                f"(at least {block_length} tokens) so every noisy block has a clean prefix"
            )
        clean[row, : len(ids)] = torch.tensor(ids)
        replies = torch.tensor(reply_positions(ids))
        clean_targets[row, replies] = clean[row, replies]
        for _ in range(num_copies):
            copy_ids, positions, copy_targets = noise_answer_blocks(ids, num_prompt, block_length, generator)
            noisy.append(copy_ids.view(-1, block_length))
            targets.append(copy_targets.view(-1, block_length))
            blocks.append(positions[::block_length] // block_length)
            rows.append(torch.full_like(blocks[-1], row))
    return HybridBatch(clean, clean_targets, torch.cat(noisy), torch.cat(rows), torch.cat(blocks), torch.cat(targets))
