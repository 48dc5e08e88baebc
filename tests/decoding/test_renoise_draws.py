"""The renoise decoder's counter-based draws (int64 tensors, renoise_draws) == the reference's (plain Python
integers, reference_counter_draws): the same 64-bit hashes, uniform tokens and inverse-CDF samples for keys
across the int64 range (seeds up to 2^64 - 1 and negative ones: taken mod 2^64); a token of probability 0 is
never drawn; each key field changes the draws."""

from __future__ import annotations

import random

import torch

from diffuserve.decoding.renoise_draws import INITIAL, RENOISE, SAMPLE, DrawKeys, draw_bits, sample, uniform_tokens
from diffuserve.reference import reference_counter_draws as ref

CPU = torch.device("cpu")


def _keys(count: int) -> tuple[list[int], list[int], list[int]]:
    rng = random.Random(4)
    seeds = [0, 1, (1 << 63) - 1, 1 << 63, (1 << 64) - 1, -5] + [rng.getrandbits(63) for _ in range(count - 6)]
    return seeds, [rng.randrange(0, 1 << 20) for _ in seeds], [rng.randrange(0, 64) for _ in seeds]


def test_hashes_and_uniform_tokens_equal_the_python_reference():
    seeds, starts, steps = _keys(12)
    keys = DrawKeys.of(seeds, starts, steps, CPU)
    for stream in (INITIAL, SAMPLE, RENOISE):
        bits = draw_bits(keys, stream, 9)
        expected = [[ref.draw(s, b, t, stream, p) for p in range(9)] for s, b, t in zip(seeds, starts, steps)]
        assert [[h & ref.MASK64 for h in row] for row in bits.tolist()] == expected
        for vocab in (5, 96, 262_144):
            want = [[ref.uniform_token(h, vocab) for h in row] for row in expected]
            assert uniform_tokens(bits, vocab).tolist() == want


def test_samples_equal_the_python_inverse_cdf_and_skip_zero_probabilities():
    seeds, starts, steps = _keys(8)
    keys = DrawKeys.of(seeds, starts, steps, CPU)
    logits = torch.randn(8, 16, 30, generator=torch.Generator().manual_seed(1)) * 3
    logits[:, :, ::3] = float("-inf")  # forbidden tokens (a stop id under min_tokens): probability 0
    probs = torch.softmax(logits, dim=-1)
    bits = draw_bits(keys, SAMPLE, 16)
    drawn = sample(probs.clone(), bits)
    expected = [
        [ref.inverse_cdf(probs[b, p], h & ref.MASK64) for p, h in enumerate(row)] for b, row in enumerate(bits.tolist())
    ]
    assert drawn.tolist() == expected
    assert (drawn % 3 != 0).all()


def test_the_largest_uniform_takes_the_last_token_with_mass():
    """u = 1 - 2^-24 (every bit set) with totals of 2^e (the product's one exact case) and not: the last token of
    nonzero probability, never a zero-probability token after it."""
    for probs in ([0.25, 0.75, 0.0, 0.0], [0.5, 0.5, 0.0], [0.1, 0.3, 0.2, 0.0]):
        table = torch.tensor([probs])
        last = max(i for i, p in enumerate(probs) if p > 0)
        assert sample(table.clone(), torch.tensor([-1])).tolist() == [last]  # -1: all 64 bits set
        assert ref.inverse_cdf(table[0], (1 << 64) - 1) == last


def test_every_key_field_changes_the_draws():
    base = draw_bits(DrawKeys.of([7], [32], [3], CPU), SAMPLE, 4)
    for changed in (([8], [32], [3]), ([7], [33], [3]), ([7], [32], [4])):
        assert not torch.equal(draw_bits(DrawKeys.of(*changed, CPU), SAMPLE, 4), base)
    assert not torch.equal(draw_bits(DrawKeys.of([7], [32], [3], CPU), RENOISE, 4), base)
    assert len(set(base[0].tolist())) == 4  # positions
