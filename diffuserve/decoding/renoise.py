"""RenoiseDecoder: the renoise decoder (uniform-noise canvases, as DiffusionGemma decodes) on rank 0, its
per-request state and one batched step of all the canvases of a logits chunk. The arithmetic is renoise_steps'
pure functions (the ones transformers' `generate` is matched against); this module owns when they run and what a
request keeps between steps:

    canvas start   C uniform random tokens, the counter-based draws of (seed, canvas start, step 0): the first
                   input (a canvas redone after a preemption draws the same tokens: nothing to save)
    every step     `decode_blocks`: one `denoise_step` over all the canvases' logits [B, C, V] (sample, accept by
                   entropy bound, renoise), one `stop_rule`, one host copy of the batch's tokens and stop flags;
                   the next input is the renoised canvas, and the tempered logits go back to the runner for the
                   next step's self-conditioning input
    canvas end     stable-and-confident, or `steps` (max_denoising_steps) taken: the canvas's tokens are the
                   last step's argmax, with their logprobs under that step's tempered distribution if asked

A request's seed is `RequestGenerators.seed_of` (its own, or one drawn from the engine's seed): the draws depend
on it, the canvas's start position, the step and the position only, never on the batch. The step index is the
request's `step_in_block`; the canvas input lives in `Request.canvas` (host, for the step's input ids). Knows
nothing of caches.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from diffuserve.core.request import Request
from diffuserve.core.writes import BlockWrite
from diffuserve.decoding.generators import RequestGenerators, forbid_in_canvases
from diffuserve.decoding.logprobs import logprob_rows, token_logprobs
from diffuserve.decoding.protocol import BlockDecode, Decoder
from diffuserve.decoding.renoise_draws import DrawKeys
from diffuserve.decoding.renoise_steps import CanvasKnobs, DenoiseStep, denoise_step, initial_canvas, stop_rule
from diffuserve.renoise_knobs import RenoiseDefaults
from diffuserve.sampling_params import ResolvedSamplingParams


@dataclass
class _Canvas:
    """One request's current canvas: what its stop rule remembers."""

    block_start: int
    previous_argmax: torch.Tensor
    """[C] long: the argmax canvas of its last step (-1 before any)."""
    run: int = 0
    """Steps in a row that ended on `previous_argmax`."""


def renoise_knobs(params: ResolvedSamplingParams) -> RenoiseDefaults:
    """The request's renoise knobs under the decoding functions' names."""
    return RenoiseDefaults(
        max_denoising_steps=params.steps or RenoiseDefaults.max_denoising_steps,
        entropy_bound=params.entropy_bound,
        t_min=params.t_min,
        t_max=params.t_max,
        stability_threshold=params.stability_threshold,
        confidence_threshold=params.confidence_threshold,
    )


class RenoiseDecoder(Decoder):
    """The renoise decoder (a `Decoder` that also decodes many blocks at once): reads every canvas position
    every step, draws a canvas's tokens at its first step, and hands on the tempered logits its next step is
    self-conditioned on."""

    name = "renoise"

    def __init__(self, block_length: int, vocab_size: int, device: torch.device) -> None:
        self.block_length, self.vocab_size, self.device = block_length, vocab_size, device
        self._canvases: dict[str, _Canvas] = {}

    def read_positions(self, request: Request) -> list[int]:
        return list(range(self.block_length))

    def block_tokens(self, requests: list[Request], generators: RequestGenerators) -> list[list[int]]:
        """The tokens each request's canvas reads this step; the canvases at their first step drawn in one batch
        (counter-based draws: each canvas's tokens are its own whatever it is drawn with), their stop rules
        reset."""
        first = [request for request in requests if not request.step_in_block]
        drawn: dict[str, list[int]] = {}
        if first:
            seeds = [generators.seed_of(request) for request in first]
            keys = DrawKeys.of(seeds, [r.block_start for r in first], [0] * len(first), self.device)
            # Shared by the new canvases: a canvas's previous argmax is replaced after its step, never edited.
            previous = torch.full((self.block_length,), -1, dtype=torch.long, device=self.device)
            canvases = initial_canvas(keys, self.block_length, self.vocab_size).tolist()  # [F, C], one transfer
            for request, canvas in zip(first, canvases, strict=True):
                self._canvases[request.request_id] = _Canvas(request.block_start, previous)
                drawn[request.request_id] = canvas
        return [drawn.get(request.request_id, request.canvas) for request in requests]

    def decode(
        self, request: Request, rows: torch.Tensor, positions: list[int], generators: RequestGenerators
    ) -> BlockDecode:
        """One canvas's step (`decode_blocks` of one)."""
        return self.decode_blocks([request], rows, [positions], generators)[0]

    def decode_blocks(
        self,
        requests: list[Request],
        rows: torch.Tensor,
        positions: list[list[int]],
        generators: RequestGenerators,
    ) -> list[BlockDecode]:
        """rows [B x C, V] fp32: the canvases' logits, request after request (edited in place) -> each request's
        write and, for a canvas that goes on, its tempered logits [C, V] (views of `rows`)."""
        logits = forbid_in_canvases(requests, rows.view(len(requests), self.block_length, -1))
        canvases = [self._canvases[r.request_id] for r in requests]
        per_request = [renoise_knobs(r.params) for r in requests]
        knobs = CanvasKnobs.of(per_request, self.device)
        steps = [r.step_in_block for r in requests]
        seeds = [generators.seed_of(r) for r in requests]
        result = denoise_step(logits, knobs, DrawKeys.of(seeds, [c.block_start for c in canvases], steps, self.device))
        previous = torch.stack([c.previous_argmax for c in canvases])
        runs = torch.tensor([c.run for c in canvases], device=self.device)
        stop, runs = stop_rule(result, previous, runs, knobs)
        # One host copy of what the step decided: [B, 2C + 2] (the canvases, the argmaxes, stop, run).
        table = torch.cat([result.canvas, result.argmax, stop[:, None].long(), runs[:, None]], dim=1).tolist()
        decoded = []
        for index, (request, canvas, row) in enumerate(zip(requests, canvases, table, strict=True)):
            canvas.previous_argmax, canvas.run = result.argmax[index], row[-1]
            if row[-2] or request.step_in_block + 1 >= per_request[index].max_denoising_steps:
                decoded.append(BlockDecode(self._final_write(request, result, index, row)))
            else:
                tokens = row[: self.block_length]
                decoded.append(BlockDecode(BlockWrite(list(enumerate(tokens)), final=False), result.logits[index]))
        return decoded

    def _final_write(self, request: Request, result: DenoiseStep, index: int, row: list[int]) -> BlockWrite:
        """The canvas ends: its tokens are the step's argmax (with their logprobs if asked)."""
        argmax = row[self.block_length : 2 * self.block_length]
        if request.params.logprobs is None:
            return BlockWrite(list(enumerate(argmax)), None, final=True)
        positions = torch.arange(self.block_length, device=self.device)
        tokens = result.argmax[index]
        logprobs = torch.log_softmax(result.logits[index], dim=-1)
        rows = logprob_rows(logprobs, tokens, positions, self.block_length, request.params.logprobs)
        return BlockWrite(list(enumerate(argmax)), token_logprobs(rows, tokens, positions), final=True)

    def release(self, request_id: str) -> None:
        """Forgets a finished request's canvas."""
        self._canvases.pop(request_id, None)
