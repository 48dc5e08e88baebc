"""The step's drafts checked all at once where they are plain and greedy (draft_checks.py, through
verification.check_drafts) against each checked alone through its decoder's `verify`, the oracle: drafts kept
whole and cut at every place, the mask token ranked first, drafts below min_tokens whose stop ids lead their rows,
and in the same call sampled drafts and drafts with logprobs (checked one by one)."""

from __future__ import annotations

import random

import pytest
import torch

from diffuserve.core.request import Request
from diffuserve.decoding.draft_checks import is_plain_greedy
from diffuserve.decoding.generators import RequestGenerators
from diffuserve.decoding.step_decoding import PlannedDraft
from diffuserve.decoding.verification import check_drafts
from diffuserve.decoding.verified import VerifiedDecoder
from diffuserve.sampling_params import SamplingParams

VOCAB, BLOCK, PROMPT = 12, 4, 5
MASK = VOCAB - 1


def _drafts(rng: random.Random, count: int) -> tuple[list[PlannedDraft], torch.Tensor]:
    decoder = VerifiedDecoder(BLOCK)
    drafts, rows = [], []
    for i in range(count):
        knobs = rng.choice(
            [
                {},
                {},
                dict(min_tokens=20, max_tokens=40, stop_token_ids=[2, 3]),
                dict(temperature=0.9, seed=i),
                dict(logprobs=2),
            ]
        )
        request = Request(f"r{i}", list(range(1, PROMPT + 1)), SamplingParams(**knobs).with_defaults({}), BLOCK, MASK)
        request.block_start = 12
        count_checked = rng.randrange(1, BLOCK)
        positions = list(range(8 + BLOCK - count_checked, 8 + BLOCK))  # the draft block's last positions
        tokens = [rng.randrange(VOCAB - 1) for _ in positions]
        for token in tokens:
            row = torch.randn(VOCAB) * rng.choice([0.5, 2.0])
            if rng.random() < 0.7:
                row[token] += 9.0  # a draft the check likely keeps
            if rng.random() < 0.1:
                row[MASK] = 30.0
            if rng.random() < 0.2:
                row[2] = 25.0  # a stop id first: kept out below min_tokens
            rows.append(row)
        drafts.append(PlannedDraft(request, decoder, positions, tokens))
    return drafts, torch.stack(rows)


@pytest.mark.parametrize("seed", range(8))
def test_drafts_checked_together_equal_each_checked_alone(seed: int):
    rng = random.Random(seed)
    drafts, logits = _drafts(rng, 24)
    got = check_drafts(drafts, logits.clone(), RequestGenerators(torch.device("cpu"), seed=1))
    oracle = RequestGenerators(torch.device("cpu"), seed=1)
    want, start = {}, 0
    for draft in drafts:
        rows = logits[start : start + len(draft.positions)].clone()
        start += len(draft.positions)
        want[draft.request.request_id] = draft.decoder.verify(
            draft.request, rows, draft.positions, draft.drafts, oracle
        )
    assert got == want and list(got) == list(want)
    plain = [want[d.request.request_id] for d in drafts if is_plain_greedy(d)]
    assert {v.token is None for v in plain} == {True, False}  # plain drafts kept whole and cut, both
    assert len(plain) < len(drafts)  # beside drafts checked one by one
