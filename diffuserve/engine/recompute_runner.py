"""The simple engine path for models with recurrent layers (clover_moe): every step recomputes each scheduled
request's whole committed prefix in a plain causal forward, with no KV or recurrent-state cache, then:

  - with the block-diffusion tensors: previews the request's block after that prefix and lets the request's
    decoder accept positions, exactly as the paged runner does (a masked position is read from its own output
    row, or from the previous one when the model predicts with the AR shift);
  - without them (the autoregressive model): fills the block's first masked position with the next token
    predicted from the last known position, one token per step.

Exact but quadratic in the sequence length: a stand-in until the engine carries GDN state (hybrid-state issue).
Commits and prefill chunks the scheduler hands out are no-ops here (nothing is cached).
"""

from __future__ import annotations

from typing import cast

import torch

from diffuserve.config import EngineConfig
from diffuserve.engine.decoders import DECODERS, propose
from diffuserve.engine.model_runner import BlockRows, ModelRunner, block_write
from diffuserve.engine.request import BlockWrite
from diffuserve.engine.scheduler import ScheduledRequest
from diffuserve.model.clover_moe import CloverMoeForBlockDiffusion
from diffuserve.model.clover_moe_config import hybrid_args


def check_recompute_config(config: EngineConfig) -> None:
    """The recompute path runs the whole model on one device: refuse what it cannot honour, before any rank or
    weight is set up."""
    if config.parallel.tensor_parallel_size > 1:
        raise ValueError(
            f"tensor_parallel_size: {config.parallel.tensor_parallel_size} is not supported for models "
            "with recurrent layers (clover_moe) yet; use 1"
        )
    if config.cache.expert_offload and config.cache.recurrent_state != "keep":
        raise ValueError(
            f"expert_offload: not supported with --recurrent-state {config.cache.recurrent_state} (models with "
            "recurrent layers, clover_moe); use --recurrent-state keep or drop --expert-offload"
        )


class RecomputeRunner(ModelRunner):
    """A ModelRunner whose `execute` recomputes instead of reading the paged cache (see the module docstring)."""

    supports_prompt_scoring = False

    @property
    def model(self) -> CloverMoeForBlockDiffusion:
        # engine_setup builds this runner only for a family with recurrent state: clover_moe, whose model this is
        return cast(CloverMoeForBlockDiffusion, self.executor.model)

    @torch.inference_mode()
    def execute(self, scheduled: list[ScheduledRequest]) -> dict[str, BlockWrite]:
        return {work.request.request_id: self._step(work) for work in scheduled if work.has_block}

    def _step(self, work: ScheduledRequest) -> BlockWrite:
        request = work.request
        prefix = torch.tensor([request.known_tokens(0, request.block_start)], dtype=torch.long, device=self.device)
        if not self.model.has_diffusion:
            return self._next_token(work, prefix)
        hidden, state = self.model.forward_causal(prefix) if prefix.shape[1] else (None, None)
        canvas = torch.tensor([request.canvas], dtype=torch.long, device=self.device)
        rows = self.model.forward_preview(canvas, state)[0]  # [B, H]: row i is the output at canvas index i
        if hybrid_args(self.model.args).prediction_shift:
            previous = hidden[0, -1:] if hidden is not None else rows[:1]  # position 0 is never masked
            rows = torch.cat([previous, rows[:-1]])
        read = DECODERS[request.params.decoder].logit_positions(
            request.masked_indices(), request.generation_start_in_block(), self.block_length
        )
        logits = self.model.compute_logits(rows[read])
        return self._decode(BlockRows(work, 0, 0, read), logits)

    def _next_token(self, work: ScheduledRequest, prefix: torch.Tensor) -> BlockWrite:
        request = work.request
        index = request.masked_indices()[0]
        known = torch.tensor([request.canvas[:index]], dtype=torch.long, device=self.device)
        hidden, _ = self.model.forward_causal(torch.cat([prefix, known], dim=1))
        logits = self._forbid_tokens(request, [index], self.model.compute_logits(hidden[0, -1:]))
        positions = torch.tensor([index], device=self.device)
        params = request.params
        proposal = propose(
            logits, positions, self.block_length, params, self._generator(request), num_logprobs=params.logprobs
        )
        return block_write(proposal, positions)
