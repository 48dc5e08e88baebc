"""Training batches for block diffusion that match the engine's inference exactly: the two-stream layout.

Owns chat encoding of task examples into byte-tokenizer ids, the noising of answer blocks, the attention mask
and the masked-diffusion loss. Knows nothing of optimisers or checkpoints.

The engine denoises one block at a time: the current block (prompt tokens clean, the rest masked or accepted)
attends bidirectionally to itself and to the final K/V of every earlier block, which were computed from clean
tokens under the block-causal mask. One training row reproduces that for every answer block at once:

    row = [ clean stream: the whole example, length L | noisy copy 1: answer blocks b0 .. b1 | copy 2 | .. | pad ]
    clean query  -> clean key   iff  key block <= query block      (block-causal: the committed K/V)
    noisy query  -> clean key   iff  key block <  query block      (earlier blocks, final tokens)
    noisy query  -> noisy key   iff  same copy and same block      (its own noisy block, bidirectional)
    pad query    -> itself only (never read)

Every stream uses the absolute positions of the example, so RoPE sees what the engine sees. Each noisy copy
masks its blocks independently: several noise draws share one clean forward, which is most of a row's cost.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from diffuserve.eval.tasks import Example
from diffuserve.model.layers.attention import DenseAttentionInputs
from diffuserve.model.step_inputs import StepInputs
from diffuserve.reference.byte_tokenizer import special_token_ids

SPECIALS = special_token_ids()
IM_START, IM_END = SPECIALS["<|im_start|>"], SPECIALS["<|im_end|>"]
END_OF_TEXT, MASK = SPECIALS["<|endoftext|>"], SPECIALS["<|MASK|>"]
CLEAN, PAD = 0, -1
"""Stream ids; noisy copies are 1, 2, ..."""


def encode_turn(role: str, content: str) -> list[int]:
    """One whole ChatML message, as the chat template renders it: `<|im_start|>role\ncontent<|im_end|>\n`."""
    return [IM_START, *f"{role}\n".encode(), *content.encode(), IM_END, *b"\n"]


def encode_prompt(user_message: str, history: Sequence[Example] = ()) -> list[int]:
    """The ChatML prompt of a user turn after `history` (earlier turns, each a user message and its answer), as
    the byte tokenizer encodes the rendered chat template with the generation prompt."""
    ids = []
    for turn in history:
        ids += encode_turn("user", turn.prompt) + encode_turn("assistant", turn.answer)
    return [*ids, *encode_turn("user", user_message), IM_START, *b"assistant\n"]


def encode_conversation(turns: Sequence[Example], block_length: int) -> tuple[list[int], int]:
    """-> (ids, number of prompt ids) of a conversation whose last turn is the one answered: the earlier turns
    are its prompt (the history `diffuserve chat` sends back). The reply ends with <|im_end|>, then
    <|endoftext|> up to the block's end, so the model learns to fill the rest of the final block with stop
    tokens in few steps."""
    prompt = encode_prompt(turns[-1].prompt, turns[:-1])
    ids = [*prompt, *turns[-1].answer.encode(), IM_END]
    ids += [END_OF_TEXT] * (-len(ids) % block_length)
    return ids, len(prompt)


def encode_example(example: Example, block_length: int) -> tuple[list[int], int]:
    """A one-turn conversation (encode_conversation)."""
    return encode_conversation([example], block_length)


ASSISTANT_HEADER = [IM_START, *b"assistant\n"]


def reply_positions(ids: list[int]) -> list[int]:
    """The positions of every assistant reply's tokens in a ChatML conversation, each reply's closing
    <|im_end|> included: the tokens a chat model writes (the padding after the last reply is not)."""
    positions, inside = [], False
    for p, token in enumerate(ids):
        if inside or ids[max(0, p - len(ASSISTANT_HEADER)) : p] == ASSISTANT_HEADER:
            positions.append(p)
            inside = token != IM_END
    return positions


@dataclass(frozen=True)
class DiffusionBatch:
    input_ids: torch.Tensor
    """[Bt, T] long."""
    positions: torch.Tensor
    """[Bt, T] long: absolute position in the example (both streams)."""
    attention: DenseAttentionInputs
    targets: torch.Tensor
    """[Bt, T] long: the clean token at masked noisy positions, -100 elsewhere."""


def noise_answer_blocks(ids: list[int], num_prompt: int, block_length: int, generator: torch.Generator):
    """One noisy copy of an example's answer blocks: k ~ U{1..n} of each block's n answer positions masked
    (prompt positions never are). -> (noisy ids, positions, targets), all [N] tensors."""
    start = num_prompt // block_length * block_length
    clean = torch.tensor(ids[start:])
    positions = torch.arange(start, len(ids))
    targets = torch.full_like(clean, -100)
    for block_start in range(0, len(clean), block_length):
        answer = [i for i in range(block_start, block_start + block_length) if positions[i] >= num_prompt]
        num_masked = int(torch.randint(1, len(answer) + 1, (1,), generator=generator))
        chosen = torch.tensor(answer)[torch.randperm(len(answer), generator=generator)[:num_masked]]
        targets[chosen] = clean[chosen]
    noisy = torch.where(targets >= 0, torch.full_like(clean, MASK), clean)
    return noisy, positions, targets


def _row(ids: list[int], num_prompt: int, block_length: int, num_copies: int, generator: torch.Generator):
    """[clean | noisy copies] -> (input ids, positions, targets, stream ids), all [L + copies * N] tensors."""
    length = len(ids)
    parts = [(torch.tensor(ids), torch.arange(length), torch.full((length,), -100), torch.full((length,), CLEAN))]
    for copy in range(1, num_copies + 1):
        noisy, positions, targets = noise_answer_blocks(ids, num_prompt, block_length, generator)
        parts.append((noisy, positions, targets, torch.full((len(noisy),), copy)))
    return tuple(torch.cat(column) for column in zip(*parts))


def build_batch(
    encoded: list[tuple[list[int], int]], block_length: int, generator: torch.Generator, num_copies: int = 1
) -> DiffusionBatch:
    """Lays out each example as [clean | noisy copies | pad] and builds the two-stream mask (module docstring)."""
    rows = [_row(ids, num_prompt, block_length, num_copies, generator) for ids, num_prompt in encoded]
    width = max(len(r[0]) for r in rows)
    pads = (END_OF_TEXT, 0, -100, PAD)
    input_ids, positions, targets, streams = (
        torch.stack([F.pad(r[i], (0, width - len(r[i])), value=pads[i]) for r in rows]) for i in range(4)
    )
    mask = two_stream_mask(positions, streams, block_length)
    return DiffusionBatch(input_ids, positions, DenseAttentionInputs(mask[:, None]), targets)


def two_stream_mask(positions: torch.Tensor, streams: torch.Tensor, block_length: int) -> torch.Tensor:
    """positions, streams [Bt, T] -> [Bt, T, T] bool, True = the query (row) may attend to the key (column)."""
    blocks = positions // block_length
    bq, bk = blocks[:, :, None], blocks[:, None, :]
    sq, sk = streams[:, :, None], streams[:, None, :]
    clean_to_clean = (sq == CLEAN) & (sk == CLEAN) & (bk <= bq)
    noisy_to_clean = (sq > CLEAN) & (sk == CLEAN) & (bk < bq)
    noisy_to_noisy = (sq > CLEAN) & (sk == sq) & (bk == bq)
    pad_to_self = (sq == PAD) & torch.eye(positions.shape[1], dtype=torch.bool)
    return clean_to_clean | noisy_to_clean | noisy_to_noisy | pad_to_self


def diffusion_loss(model: torch.nn.Module, batch: DiffusionBatch) -> torch.Tensor:
    """Masked-diffusion loss: the mean cross-entropy over masked positions (no shift: the logit at position i
    predicts token i).

    NOTE: unweighted, not the ELBO's 1/t weighting. With blocks of a few positions 1/t ranges over 1..B and lets
    the lightly masked states (the easy ones) dominate a noisy gradient; the plain mean weights each state by
    its number of masked positions, favouring the heavily masked states in which parallel decoding must be
    confident."""
    logits, targets = _masked_logits(model, batch)
    return F.cross_entropy(logits, targets)


@torch.no_grad()
def masked_token_accuracy(model: torch.nn.Module, batch: DiffusionBatch) -> float:
    """Share of masked positions whose argmax is the clean token: a cheap progress probe (one forward)."""
    logits, targets = _masked_logits(model, batch)
    return (logits.argmax(-1) == targets).float().mean().item()


def _masked_logits(model: torch.nn.Module, batch: DiffusionBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """-> (logits [M, V] fp32, clean tokens [M]) at the M masked positions."""
    hidden = model(batch.input_ids, batch.positions, StepInputs(batch.attention))  # [Bt, T, H]
    selected = batch.targets >= 0
    return model.compute_logits(hidden[selected]), batch.targets[selected]
