"""The recompute baseline of `bench compare` for models with recurrent layers (clover_moe), never a serving mode:
every step recomputes each scheduled request's whole committed prefix in a plain causal forward, with no cache,
then:

  - with the block-diffusion tensors: previews the request's block after that prefix and lets the request's
    decoder accept positions, exactly as the engine does (a masked position is read from its own output row, or
    from the previous one when the model predicts with the AR shift);
  - without them (the autoregressive model): fills the block's first masked position with the next token
    predicted from the last known position, one token per step.

Exact but quadratic in the sequence length: what keeping the state buys. Commits and prefill chunks the
scheduler hands out are no-ops here (nothing is read from the caches; the engine runs without prefix caching).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cached_property
from typing import cast

import torch

from diffuserve.core.step import ScheduledRequest, StepResult
from diffuserve.core.writes import BlockWrite
from diffuserve.model.families.clover_moe.dense import DenseClover
from diffuserve.model.families.clover_moe.model import CloverMoeForBlockDiffusion
from diffuserve.worker.model_runner import ModelRunner


class RecomputeRunner(ModelRunner):
    """A ModelRunner whose `execute` recomputes instead of reading the caches (see the module docstring)."""

    supports_prompt_scoring = False

    @cached_property
    def clover(self) -> DenseClover:
        """The served model read whole (the baseline is built only for models with recurrent layers: clover_moe)."""
        return DenseClover(cast(CloverMoeForBlockDiffusion, self.executor.model))

    @torch.inference_mode()
    def execute(self, scheduled: list[ScheduledRequest], beside: Callable[[], object] | None = None) -> StepResult:
        """Each block from its whole prefix, recomputed (`beside`, the engine's overlapped outputs, runs first)."""
        if beside is not None:
            beside()
        writes = {work.request.request_id: self._step(work) for work in scheduled if work.has_block}
        return StepResult(writes, {}, self.decoding.take_failures())

    def _step(self, work: ScheduledRequest) -> BlockWrite:
        request = work.request
        prefix = torch.tensor([request.known_tokens(0, request.block_start)], dtype=torch.long, device=self.device)
        if self.rules.autoregressive:
            return self._next_token(work, prefix)
        hidden, state = self.clover.forward_causal(prefix) if prefix.shape[1] else (None, None)
        canvas = torch.tensor([request.canvas], dtype=torch.long, device=self.device)
        rows = self.clover.forward_preview(canvas, state)[0]  # [B, H]: row i is the output at canvas index i
        if self.rules.prediction_shift:
            previous = hidden[0, -1:] if hidden is not None else rows[:1]  # position 0 is never masked
            rows = torch.cat([previous, rows[:-1]])
        decoder = self.decoding.decoder_of(request)
        read = decoder.read_positions(request)
        return decoder.decode(request, self.model.compute_logits(rows[read]), read, self.decoding.generators).write

    def _next_token(self, work: ScheduledRequest, prefix: torch.Tensor) -> BlockWrite:
        request = work.request
        decoder = self.decoding.decoder_of(request)  # the autoregressive rule: the first masked position
        index = decoder.read_positions(request)[0]
        known = torch.tensor([request.canvas[:index]], dtype=torch.long, device=self.device)
        hidden, _ = self.clover.forward_causal(torch.cat([prefix, known], dim=1))
        logits = self.model.compute_logits(hidden[0, -1:])
        return decoder.decode(request, logits, [index], self.decoding.generators).write
