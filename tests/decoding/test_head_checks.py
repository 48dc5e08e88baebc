"""The step's plain verified heads checked all at once (head_checks.py) against each head checked alone through
its decoder's `verify`, the oracle: greedy and sampled heads (seeded or not, top-k, top-p, temperatures), heads
the check keeps and heads it replaces, heads below min_tokens with stop ids, the mask token ranked first, and
heads with logprobs (checked one by one) in the same call."""

from __future__ import annotations

import random

import pytest
import torch

from diffuserve.core.request import Request
from diffuserve.core.writes import BlockWrite
from diffuserve.decoding.generators import RequestGenerators
from diffuserve.decoding.head_checks import with_head
from diffuserve.decoding.step_decoding import PlannedBlock
from diffuserve.decoding.verification import check_heads
from diffuserve.decoding.verified import VerifiedDecoder
from diffuserve.sampling_params import SamplingParams

VOCAB, BLOCK, PROMPT = 12, 4, 5
MASK = VOCAB - 1


def _heads(rng: random.Random, count: int) -> tuple[list[tuple[PlannedBlock, BlockWrite, int]], torch.Tensor]:
    decoder = VerifiedDecoder(BLOCK)
    heads, rows = [], []
    for i in range(count):
        knobs = rng.choice(
            [
                {},
                dict(temperature=0.8, seed=i),
                dict(temperature=1.5),
                dict(temperature=0.7, top_k=3, seed=50 + i),
                dict(temperature=1.0, top_p=0.6),
                dict(temperature=0.9, logprobs=2, seed=i),
                dict(min_tokens=20, max_tokens=40, stop_token_ids=[2, 3], temperature=rng.choice([0.0, 1.1])),
            ]
        )
        request = Request(f"r{i}", list(range(1, PROMPT + 1)), SamplingParams(**knobs).with_defaults({}), BLOCK, MASK)
        request.block_start = 8
        head = rng.randrange(VOCAB - 1)
        write = BlockWrite([(0, head), (1, rng.randrange(VOCAB - 1))])
        heads.append((PlannedBlock(request, decoder, [0, 1], []), write, count - 1 - i))  # rows in reverse order
        row = torch.randn(VOCAB) * rng.choice([0.5, 2.0, 6.0])
        if rng.random() < 0.3:
            row[head] += 8.0  # a head the check likely keeps
        if rng.random() < 0.1:
            row[MASK] = 20.0
        rows.append(row)
    return heads, torch.stack(rows[::-1])


@pytest.mark.parametrize("seed", range(8))
def test_heads_checked_together_equal_each_checked_alone(seed: int):
    rng = random.Random(seed)
    heads, logits = _heads(rng, 24)
    got = check_heads(heads, logits.clone(), RequestGenerators(torch.device("cpu"), seed=1))
    oracle = RequestGenerators(torch.device("cpu"), seed=1)
    want = {}
    for block, write, row in heads:
        request = block.request
        verdict = block.decoder.verify(request, logits[row : row + 1].clone(), [8], [write.accepted[0][1]], oracle)
        want[request.request_id] = with_head(write, verdict)
    assert got == want
    assert {w.head.token is None for w in got.values()} == {True, False}  # kept and replaced heads both
