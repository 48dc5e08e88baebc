"""The renoise decoder's first canvases, drawn for all of a step's new canvases at once: each request's tokens are
the ones it draws alone (the counter-based draws are keyed by its seed and block, never by its batch), canvases
past their first step feed what they hold, and every new canvas's stop rule starts afresh."""

from __future__ import annotations

import random

import torch

from diffuserve.core.request import Request
from diffuserve.decoding.generators import RequestGenerators
from diffuserve.decoding.renoise import RenoiseDecoder
from diffuserve.sampling_params import SamplingParams

VOCAB, CANVAS = 50, 6


def _requests(rng: random.Random) -> list[Request]:
    requests = []
    for i in range(9):
        params = SamplingParams(decoder="renoise", seed=rng.choice([None, i, 1000 + i])).with_defaults({})
        request = Request(f"r{i}", [1, 2, 3], params, CANVAS, VOCAB)
        request.block_start = rng.choice([0, 6, 12])
        request.step_in_block = rng.choice([0, 0, 2])
        request.canvas = [rng.randrange(VOCAB) for _ in range(CANVAS)]
        requests.append(request)
    return requests


def test_first_canvases_drawn_together_equal_each_drawn_alone():
    requests = _requests(random.Random(3))
    together, together_generators = (
        RenoiseDecoder(CANVAS, VOCAB, torch.device("cpu")),
        RequestGenerators(torch.device("cpu"), seed=5),
    )
    alone, alone_generators = (
        RenoiseDecoder(CANVAS, VOCAB, torch.device("cpu")),
        RequestGenerators(torch.device("cpu"), seed=5),
    )
    got = together.block_tokens(requests, together_generators)
    want = [alone.block_tokens([request], alone_generators)[0] for request in requests]
    assert got == want
    for request, tokens in zip(requests, got, strict=True):
        if request.step_in_block:
            assert tokens == request.canvas
        else:
            assert tokens != request.canvas  # drawn, not the canvas it held
            canvas = together._canvases[request.request_id]
            assert canvas.block_start == request.block_start and canvas.run == 0
            assert torch.equal(canvas.previous_argmax, torch.full((CANVAS,), -1))
    assert set(together._canvases) == {r.request_id for r in requests if not r.step_in_block}
