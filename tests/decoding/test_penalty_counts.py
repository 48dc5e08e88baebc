"""The penalised requests' token counts kept in one table across steps (decoding/penalties.py: `PenaltyCounts`)
against each request's tokens counted afresh (`torch.bincount`), the oracle, through many steps of a changing
batch: outputs growing, requests joining and leaving (their rows freed and taken again), the table growing, an
output cut back (as a stop cuts it, between two reads), the prompt counted or not, tokens outside the vocabulary
left out."""

from __future__ import annotations

import random

import torch

from diffuserve.core.request import Request
from diffuserve.decoding.penalties import PenaltyCounts
from diffuserve.sampling_params import SamplingParams

VOCAB = 17


def _oracle(request: Request) -> torch.Tensor:
    tokens = request.output_token_ids + (request.prompt_token_ids if request.params.penalize_prompt else [])
    kept = torch.tensor([t for t in tokens if 0 <= t < VOCAB], dtype=torch.long)
    return torch.bincount(kept, minlength=VOCAB)


def test_counts_kept_across_steps_equal_counts_made_afresh():
    rng = random.Random(3)
    counts, live, made, stopped = PenaltyCounts(), [], 0, set()
    for _ in range(60):
        while len(live) < rng.randrange(1, 14):  # requests join (more than the table's first 8 rows)
            params = SamplingParams(frequency_penalty=0.5, penalize_prompt=rng.random() < 0.5).with_defaults({})
            prompt = [rng.randrange(VOCAB + 3) for _ in range(rng.randrange(1, 6))]
            live.append(Request(f"r{made}", prompt, params, 4, VOCAB - 1))
            made += 1
        for request in live:  # outputs grow; now and then one is cut back (a stop: it grows no more)
            if request.request_id in stopped:
                continue
            if rng.random() < 0.1 and request.output_token_ids:
                request.output_token_ids = request.output_token_ids[: rng.randrange(len(request.output_token_ids))]
                stopped.add(request.request_id)
            else:
                request.output_token_ids += [rng.randrange(VOCAB + 2) for _ in range(rng.randrange(0, 4))]
        batch = rng.sample(live, rng.randrange(1, len(live) + 1))
        got = counts.rows(batch, VOCAB, torch.device("cpu"))
        assert torch.equal(got, torch.stack([_oracle(r) for r in batch]))
        for request in [r for r in live if rng.random() < 0.2]:  # requests leave: their rows are free again
            counts.release(request.request_id)
            live.remove(request)
    assert made > 20 and stopped
