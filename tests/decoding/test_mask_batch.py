"""MaskDecoder.decode_blocks (the batched pass of mask_batch.py for the common case, `decode` for the rest) against
`decode` block by block, the oracle, on random logits and random canvases: every policy, greedy and sampled blocks
(seeded or not, top-k, top-p), with and without logprobs, in one call, ties in confidence and in a row's argmax,
blocks where nothing passes the threshold, and requests outside the common case in the same call."""

from __future__ import annotations

import random

import pytest
import torch

from diffuserve.core.request import Request
from diffuserve.decoding.generators import RequestGenerators
from diffuserve.decoding.mask import MaskDecoder
from diffuserve.decoding.mask_policies import MASK_POLICIES
from diffuserve.decoding.penalties import Penalized, PenaltyCounts
from diffuserve.decoding.protocol import BlockDecode
from diffuserve.decoding.verified import VerifiedDecoder
from diffuserve.sampling_defaults import MASK_DECODER_NAMES
from diffuserve.sampling_params import SamplingParams

VOCAB, BLOCK, PROMPT = 12, 8, 5
MASK = VOCAB - 1  # a vocabulary id: its logit is kept and can rank first
FLAT = float(torch.tensor(1 / VOCAB))  # the confidence of a row whose logits are all equal


def _request(index: int, rng: random.Random, decoder: str, common: bool) -> Request:
    knobs: dict = dict(
        decoder=decoder,
        # 0.99: nothing passes, the schedule's top-k decides; a flat row's confidence, 1 / VOCAB in fp32, is not
        # above itself, and is above the Python float 1 / VOCAB in fp64 but not in fp32 (where they compare)
        threshold=rng.choice([0.05, 0.3, 0.6, 0.99, FLAT, 1 / VOCAB]),
        steps=rng.choice([None, 1, 3, 5, 20]),  # 20 > BLOCK: steps whose schedule count is 0
        entropy_bound=rng.choice([0.0, 0.35, 1.5, 4.0]),
    )
    # Sampled blocks are batched too (one pass per sampling setting, each drawing from its own generator): seeded
    # and not, with top-k and top-p; greedy ones beside them.
    knobs.update(
        rng.choice(
            [
                {},
                {},
                dict(temperature=0.8, seed=index),
                dict(temperature=1.3, top_k=3),
                dict(temperature=0.6, top_p=0.7, seed=index + 100),
                dict(temperature=0.8, seed=index, top_k=3, top_p=0.9),
            ]
        )
    )
    knobs["logprobs"] = rng.choice([None, None, 0, 2, 5])  # batched too, grouped by how many
    if not common:  # falls back to `decode` in the same call
        knobs.update(min_tokens=30, max_tokens=64, stop_token_ids=[3])
    params = SamplingParams(**knobs).with_defaults({})
    request = Request(f"r{index}", list(range(1, PROMPT + 1)), params, BLOCK, MASK)
    request.block_start = rng.choice([0, 8, 16])
    start = max(0, PROMPT - request.block_start)  # the prompt's tail is never masked
    request.canvas = [MASK if i >= start and rng.random() < 0.6 else rng.randrange(VOCAB - 1) for i in range(BLOCK)]
    if request.canvas[start:] and MASK not in request.canvas[start:]:
        request.canvas[rng.randrange(start, BLOCK)] = MASK
    request.step_in_block = rng.randrange(6)
    return request


def _rows(num_rows: int, rng: random.Random) -> torch.Tensor:
    """[N, V]: small-integer logits (ties within a row's maximum and equal confidences across rows), some rows
    repeated verbatim (equal confidences in a block), some ranking the mask token first, some flat."""
    gen = torch.Generator().manual_seed(rng.randrange(1 << 30))
    rows = torch.randint(0, 4, (num_rows, VOCAB), generator=gen).float()
    for i in range(1, num_rows):
        if rng.random() < 0.3:
            rows[i] = rows[i - 1]
        elif rng.random() < 0.1:
            rows[i, MASK] = 9.0
        elif rng.random() < 0.1:
            rows[i] = 1.0  # every token equally likely
        elif rng.random() < 0.3:
            rows[i] = torch.randn(VOCAB, generator=gen) * 3
    return rows


def _compare(decoder: MaskDecoder, requests: list[Request], rng: random.Random, monkeypatch) -> int:
    """decode_blocks equals decode for every request; -> how many blocks went through the batched pass."""
    positions = [decoder.read_positions(r) for r in requests]
    rows = _rows(sum(len(p) for p in positions), rng)
    expected, start, oracle = [], 0, RequestGenerators(torch.device("cpu"), seed=1)
    for request, read in zip(requests, positions, strict=True):
        expected.append(decoder.decode(request, rows[start : start + len(read)].clone(), read, oracle))
        start += len(read)
    fallbacks: list[str] = []
    per_request = MaskDecoder.decode

    def counted(self, request, *args) -> BlockDecode:
        fallbacks.append(request.request_id)
        return per_request(self, request, *args)

    monkeypatch.setattr(MaskDecoder, "decode", counted)
    read = [decoder.read_positions(r) for r in requests]
    got = decoder.decode_blocks(requests, rows.clone(), read, RequestGenerators(torch.device("cpu"), seed=1))
    monkeypatch.setattr(MaskDecoder, "decode", per_request)
    assert [d.write for d in got] == [d.write for d in expected]
    return len(requests) - len(fallbacks)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("name", MASK_DECODER_NAMES)
def test_batched_blocks_equal_the_per_request_decode(name: str, seed: int, monkeypatch):
    rng = random.Random(f"{name}-{seed}")
    decoder = MaskDecoder(name, MASK_POLICIES[name], BLOCK)
    common = [_request(i, rng, name, common=True) for i in range(12)]
    assert _compare(decoder, common, rng, monkeypatch) == len(common)  # all of them in the one pass
    mixed = [_request(i, rng, name, common=rng.random() < 0.6) for i in range(12)]
    num_common = sum(not r.params.min_tokens for r in mixed)
    assert _compare(decoder, mixed, rng, monkeypatch) == num_common


def test_blocks_where_nothing_passes_take_the_schedules_most_confident(monkeypatch):
    rng = random.Random(7)
    decoder = MaskDecoder("threshold", MASK_POLICIES["threshold"], BLOCK)
    requests = [_request(i, rng, "threshold", common=True) for i in range(16)]
    for request in requests:
        request.params = request.params.replace(threshold=0.999, steps=3)
    assert _compare(decoder, requests, rng, monkeypatch) == len(requests)


@pytest.mark.parametrize("seed", range(4))
def test_the_edit_policy_rewrites_generated_tokens_in_the_batched_pass(seed: int, monkeypatch):
    """Edit reads every generated position: masked ones are filled by the threshold rule, decided ones rewritten
    where a differing proposal is confident enough (low edit thresholds, so some are)."""
    rng = random.Random(f"edit-{seed}")
    decoder = MaskDecoder("edit", MASK_POLICIES["edit"], BLOCK)
    requests = [_request(i, rng, "edit", common=True) for i in range(10)]
    for request in requests:
        request.params = request.params.replace(edit_threshold=rng.choice([0.05, 0.2, 0.5, FLAT]))
    assert _compare(decoder, requests, rng, monkeypatch) == len(requests)


def test_verified_drafts_are_batched_whatever_the_temperature(monkeypatch):
    rng = random.Random(5)
    decoder = VerifiedDecoder(BLOCK)
    requests = [_request(i, rng, "verified", common=True) for i in range(10)]
    for request in requests[::2]:
        request.params = request.params.replace(temperature=0.7, seed=1)
    assert _compare(decoder, requests, rng, monkeypatch) == len(requests)


def test_the_entropy_bound_is_inclusive(monkeypatch):
    """Flat rows all have the entropy e; a set of two has the excess e, within a bound of exactly e."""
    probs = torch.softmax(torch.ones(1, VOCAB), dim=-1)
    flat_entropy = float(-(probs * torch.log(probs.clamp_min(1e-30))).sum(-1))
    rng = random.Random(11)
    decoder = MaskDecoder("entropy", MASK_POLICIES["entropy"], BLOCK)
    requests = [_request(i, rng, "entropy", common=True) for i in range(6)]
    for request in requests:
        request.params = request.params.replace(entropy_bound=flat_entropy, temperature=0.0)
    rows = torch.ones(sum(len(decoder.read_positions(r)) for r in requests), VOCAB)
    masked = [decoder.read_positions(r) for r in requests]
    got = decoder.decode_blocks(requests, rows, masked, RequestGenerators(torch.device("cpu")))
    oracle = [
        decoder.decode(r, torch.ones(len(m), VOCAB), m, RequestGenerators(torch.device("cpu")))
        for r, m in zip(requests, masked)
    ]
    assert [d.write for d in got] == [d.write for d in oracle]
    assert [len(d.write.accepted) for d in got] == [min(2, len(m)) for m in masked]


@pytest.mark.parametrize("name", ["threshold", "entropy"])
def test_penalised_blocks_are_batched_with_the_per_request_penalties(name: str, monkeypatch):
    """One penalty wrapper decodes its requests' blocks together: each block's rows penalised by its own counts
    (repetition, frequency, presence; with and without the prompt), then the inner decoder's batched pass."""
    rng = random.Random(f"penalties-{name}")
    decoder = Penalized(MaskDecoder(name, MASK_POLICIES[name], BLOCK), PenaltyCounts())
    requests = [_request(i, rng, name, common=True) for i in range(10)]
    for request in requests:
        request.output_token_ids = [rng.randrange(VOCAB - 1) for _ in range(rng.randrange(0, 12))]
        request.params = request.params.replace(
            repetition_penalty=rng.choice([1.0, 1.3]),
            frequency_penalty=rng.choice([0.0, 0.5]),
            presence_penalty=rng.choice([0.0, 0.7, -0.4]),
            penalize_prompt=rng.random() < 0.3,
        )
    assert _compare(decoder, requests, rng, monkeypatch) == len(requests)
