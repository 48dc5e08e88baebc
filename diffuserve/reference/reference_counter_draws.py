"""The renoise decoder's counter-based draws, written again in plain Python integers, and transformers'
DiffusionGemma `generate` made to draw them: the reference the engine's renoise tokens are checked against.

Every random number of a canvas is a function of (seed, canvas start position, step, stream, position):

    mix(z)  = splitmix64 (z + 0x9E3779B97F4A7C15 mod 2^64, then its finaliser)
    h       = mix(mix(mix(mix(seed) ^ start) ^ (4 * step + stream)) ^ position)    streams: 0 initial canvas,
                                                                                     1 samples, 2 renoise tokens
    token   = (top 24 bits of h) x V // 2^24                                          a uniform token
    sample  = the first vocabulary index whose running sum of the position's probabilities is above
              u x (their total), u = top 24 bits of h / 2^24 (the running sums are torch's fp32 `cumsum` and the
              product is taken in fp32, as the engine's; it stays below the total since u < 1)

`CounterDraws` replaces transformers' three draws (`EntropyBoundSampler.initialize_canvas` at a canvas's start,
`torch.multinomial` for a step's samples, the sampler's renoise tokens), position by position in Python, so its
`generate` loop, forward and arithmetic stay transformers' own. Imports nothing of the engine.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from unittest import mock

import torch

MASK64 = (1 << 64) - 1
INITIAL, SAMPLE, RENOISE = 0, 1, 2


def mix(z: int) -> int:
    z = (z + 0x9E3779B97F4A7C15) & MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


def draw(seed: int, start: int, step: int, stream: int, position: int) -> int:
    """The 64-bit h of one draw (the seed taken mod 2^64 by `mix`'s mask)."""
    return mix(mix(mix(mix(seed) ^ start) ^ (4 * step + stream)) ^ position)


def uniform_token(h: int, vocab_size: int) -> int:
    return ((h >> 40) * vocab_size) >> 24


def inverse_cdf(probs: torch.Tensor, h: int) -> int:
    """probs [V] fp32 of one position -> the sampled index (module docstring)."""
    sums = torch.cumsum(probs, dim=0)
    target = torch.tensor((h >> 40) / (1 << 24), dtype=torch.float32) * sums[-1]
    return int(torch.nonzero(sums > target)[0])


class CounterDraws:
    """The draws of one `generate` call whose batch rows have `seeds` and one prompt length: canvas k starts at
    prompt_length + k x C; a canvas's steps are counted by its sample draws."""

    def __init__(self, seeds: list[int], prompt_length: int, canvas_length: int, vocab_size: int) -> None:
        self.seeds, self.prompt_length, self.canvas_length, self.vocab_size = (
            seeds,
            prompt_length,
            canvas_length,
            vocab_size,
        )
        self.canvas_index, self.step = -1, 0

    @property
    def start(self) -> int:
        return self.prompt_length + self.canvas_index * self.canvas_length

    def tokens(self, stream: int, step: int, device: torch.device) -> torch.Tensor:
        """[B, C] uniform tokens of `stream` at `step`."""
        rows = [
            [uniform_token(draw(seed, self.start, step, stream, p), self.vocab_size) for p in range(self.canvas_length)]
            for seed in self.seeds
        ]
        return torch.tensor(rows, dtype=torch.long, device=device)

    def initial(self, device: torch.device) -> torch.Tensor:
        """A new canvas's tokens [B, C]."""
        self.canvas_index, self.step = self.canvas_index + 1, 0
        return self.tokens(INITIAL, 0, device)

    def samples(self, probs: torch.Tensor) -> torch.Tensor:
        """probs [B x C, V] -> [B x C, 1]: the current step's samples (in `torch.multinomial`'s shape)."""
        drawn = [
            inverse_cdf(probs[b * self.canvas_length + p], draw(seed, self.start, self.step, SAMPLE, p))
            for b, seed in enumerate(self.seeds)
            for p in range(self.canvas_length)
        ]
        return torch.tensor(drawn, dtype=torch.long, device=probs.device)[:, None]

    def renoise(self, device: torch.device) -> torch.Tensor:
        """The current step's renoise tokens [B, C]; the step ends."""
        tokens = self.tokens(RENOISE, self.step, device)
        self.step += 1
        return tokens


@contextmanager
def counter_draws(model: Any, seeds: list[int], prompt_length: int) -> Iterator[None]:
    """Within it, `model.generate` on a batch of one prompt length (row b seeded `seeds[b]`) draws by the counter
    rule; the sampler class `generate` prepares is subclassed (so recording wrappers around it still see it)."""
    text = model.config.text_config
    draws = CounterDraws(seeds, prompt_length, model.config.canvas_length, text.vocab_size)
    prepare = model._prepare_sampler

    def counter_sampler(generation_config: Any) -> Any:
        sampler = prepare(generation_config)
        base = type(sampler)

        class CounterSampler(base):  # type: ignore[valid-type, misc]
            def initialize_canvas(self, batch_size: int, device: torch.device) -> torch.Tensor:
                return draws.initial(device)

            def renoise_canvas(self, accepted_canvas: torch.Tensor, cur_step: Any) -> torch.Tensor:
                noise = draws.renoise(accepted_canvas.device)
                return torch.where(~self.accepted_token_mask, noise, accepted_canvas)

        sampler.__class__ = CounterSampler
        return sampler

    def multinomial(probs: torch.Tensor, num_samples: int, *args: Any, **kwargs: Any) -> torch.Tensor:
        assert num_samples == 1 and not args and not kwargs, "generate draws one sample per position"
        return draws.samples(probs)

    model._prepare_sampler = counter_sampler
    try:
        with mock.patch.object(torch, "multinomial", multinomial):
            yield
    finally:
        del model._prepare_sampler
