"""RenoiseDecoder: the renoise decoder (uniform-noise canvases, as DiffusionGemma decodes) on rank 0, its
per-request state and one canvas's step. The arithmetic is renoise_steps' pure functions, the ones transformers'
`generate` is matched against; this module owns when they run and what a request keeps between steps:

    canvas start   the request's generator state (saved at the canvas's first step, restored if the canvas is
                   redone after a preemption), then C uniform random tokens drawn from it: the first input
    every step     denoise_step over the canvas's logits [C, V] (sample, accept by entropy bound, renoise), the
                   stop rule against the argmax history; the next input is the renoised canvas, and the tempered
                   logits go back to the runner for the next step's self-conditioning input
    canvas end     stable-and-confident, or `steps` (max_denoising_steps) taken: the canvas's tokens are the
                   last step's argmax, with their logprobs under that step's tempered distribution if asked

Draws follow transformers' order per request (canvas; per step the samples, then the renoise tokens), each
request on its own generator, so a request's canvases are those of transformers' `generate` for it alone. The
canvas input lives here (on the device) and in `Request.canvas` (on the host, for the step's input ids); the
step index is the request's `step_in_block`. Knows nothing of batches or caches.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from diffuserve.core.request import Request
from diffuserve.core.writes import BlockWrite
from diffuserve.decoding.generators import RequestGenerators, forbid_tokens
from diffuserve.decoding.logprobs import logprob_rows, token_logprobs
from diffuserve.decoding.protocol import BlockDecode
from diffuserve.decoding.renoise_knobs import RenoiseDefaults
from diffuserve.decoding.renoise_steps import denoise_step, empty_history, random_canvas, should_stop
from diffuserve.sampling_params import ResolvedSamplingParams


@dataclass
class _Canvas:
    """One request's current canvas."""

    block_start: int
    generator_state: torch.Tensor
    """The request's generator as it was when the canvas started (before its draw)."""
    tokens: torch.Tensor
    """[C] long: the next step's input canvas."""
    history: torch.Tensor
    """[S, C] long: the argmax canvases of the last S steps (-1 before any)."""


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


class RenoiseDecoder:
    """The renoise decoder (a `Decoder`): reads every canvas position every step, draws a canvas's tokens at its
    first step, and hands on the tempered logits its next step is self-conditioned on."""

    name = "renoise"

    def __init__(self, block_length: int, vocab_size: int, device: torch.device) -> None:
        self.block_length, self.vocab_size, self.device = block_length, vocab_size, device
        self._canvases: dict[str, _Canvas] = {}

    def read_positions(self, request: Request) -> list[int]:
        return list(range(self.block_length))

    def block_tokens(self, request: Request, generators: RequestGenerators) -> list[int]:
        return self.canvas_tokens(request, generators.of(request))

    def decode(
        self, request: Request, rows: torch.Tensor, positions: list[int], generators: RequestGenerators
    ) -> BlockDecode:
        """Below min_tokens the stop ids are forbidden, then one renoise step (`step`)."""
        rows = forbid_tokens(request, positions, rows)
        write, tempered = self.step(request, rows, generators.of(request))
        return BlockDecode(write, tempered)

    def canvas_tokens(self, request: Request, generator: torch.Generator) -> list[int]:
        """The tokens the request's canvas reads this step. At the canvas's first step they are drawn: from the
        generator state saved when this canvas first started (it is being redone), else from the generator as
        it is now (then saved)."""
        if request.step_in_block:
            return request.canvas
        previous = self._canvases.get(request.request_id)
        if previous is not None and previous.block_start == request.block_start:
            generator.set_state(previous.generator_state)
        state = generator.get_state()
        tokens = random_canvas(self.block_length, self.vocab_size, generator).to(self.device)
        knobs = renoise_knobs(request.params)
        history = empty_history(knobs, self.block_length, self.device)
        self._canvases[request.request_id] = _Canvas(request.block_start, state, tokens, history)
        return tokens.tolist()

    def step(
        self, request: Request, logits: torch.Tensor, generator: torch.Generator
    ) -> tuple[BlockWrite, torch.Tensor | None]:
        """logits [C, V] fp32 of the canvas this step read -> (what the step writes into the canvas: every
        position, the canvas's tokens if it ends here; the tempered logits [C, V] its next step is conditioned
        on, None when it ends)."""
        canvas, knobs = self._canvases[request.request_id], renoise_knobs(request.params)
        result = denoise_step(logits, canvas.tokens, request.step_in_block, knobs, generator)
        stop, canvas.history = should_stop(canvas.history, result, knobs)
        positions = torch.arange(self.block_length, device=logits.device)
        if stop or request.step_in_block + 1 >= knobs.max_denoising_steps:
            written = list(enumerate(result.argmax.tolist()))
            logprobs = None
            if request.params.logprobs is not None:
                rows = logprob_rows(
                    torch.log_softmax(result.logits, dim=-1),
                    result.argmax,
                    positions,
                    self.block_length,
                    request.params.logprobs,
                )
                logprobs = token_logprobs(rows, result.argmax, positions)
            return BlockWrite(written, logprobs, final=True), None
        canvas.tokens = result.canvas
        return BlockWrite(list(enumerate(result.canvas.tolist())), final=False), result.logits

    def release(self, request_id: str) -> None:
        """Forgets a finished request's canvas."""
        self._canvases.pop(request_id, None)
