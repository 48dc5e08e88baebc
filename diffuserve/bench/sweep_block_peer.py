"""The static-batch block-diffusion peers of `bench sweep` (bench/sweep_peers.py describes them):

  KvForward         transformers' Qwen3(-MoE) with a DynamicCache, the SDAR scheme (block forwards over the cache,
                    a commit forward per finished block)
  RecomputeForward  a model's dense path, the whole [B, T] frame recomputed at every step (dFactory's LLaDA2 loop)

`BlockDiffusionPeer` runs the batch's blocks on one left-padded frame: prompts end together at the frame's prompt
length L; the first block denoised is the one holding position L (its prompt positions kept), as the official loops
align a batch. Each step decodes, in every row that still has masks, the positions whose top probability is above
the threshold, else the `count` most confident (temperature 0): count = B // steps, one more in the first B % steps
steps, where steps is the request's (default B: one token a step) and, for LLaDA2 (`capped`), at most the batch's
generation length, as dFactory's `generate` caps it. A position is never given the mask token: where that is the
argmax, the best other token, its probability from the same whole-vocabulary softmax (the references' rule). A
row is done at its max_tokens or stop token; done rows stay in the batch (static batching) but need no more steps.
Knows nothing of the engine.
"""

from __future__ import annotations

import itertools
import time
from typing import Any, Protocol

import torch

from diffuserve.bench.sweep_metrics import RequestTrace
from diffuserve.bench.sweep_peers import PeerRun, cut, left_pad
from diffuserve.bench.sweep_workload import SweepRequest
from diffuserve.model.layers.attention import DenseAttentionInputs
from diffuserve.model.step_inputs import StepInputs


class BlockForward(Protocol):
    def reset(self) -> None: ...

    def logits(self, ids: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor, start: int) -> torch.Tensor:
        """fp32 logits [B, end - start, V] of rows [start, end) (end = ids.shape[1]); mask [B, 1, end, end]."""
        ...

    def commit(self, ids: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor, start: int) -> None:
        """Keeps the K/V of rows [start, end) (a no-op when nothing is cached)."""
        ...


def _additive(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return torch.zeros(mask.shape, dtype=dtype).masked_fill(~mask, float("-inf"))


class KvForward:
    """transformers' CausalLM over a DynamicCache: committed blocks' K/V kept, a denoising step's dropped."""

    def __init__(self, hf_model: Any) -> None:
        self.hf = hf_model
        self.cache: Any = None  # a transformers DynamicCache once reset

    def reset(self) -> None:
        import transformers

        self.cache = transformers.DynamicCache(config=self.hf.config)

    def _run(self, ids: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor, start: int) -> torch.Tensor:
        out = self.hf.model(
            input_ids=ids[:, start:],
            attention_mask=_additive(mask[:, :, start:], self.hf.dtype),
            position_ids=positions[:, start:],
            cache=self.cache,
            use_cache=True,
        )
        return out.last_hidden_state

    def logits(self, ids: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor, start: int) -> torch.Tensor:
        assert self.cache is not None, "reset() first"
        hidden = self._run(ids, positions, mask, start)
        self.cache.crop(start - self.cache.get_seq_length())  # a denoising step never keeps its K/V
        return self.hf.lm_head(hidden).float()

    def commit(self, ids: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor, start: int) -> None:
        self._run(ids, positions, mask, start)


class RecomputeForward:
    """A diffuserve model's dense path: the whole frame every step, nothing cached."""

    def __init__(self, model: Any) -> None:
        self.model = model

    def reset(self) -> None:
        """Nothing to forget: no cache is kept between steps."""

    def logits(self, ids: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor, start: int) -> torch.Tensor:
        hidden = self.model(ids, positions, StepInputs(DenseAttentionInputs(mask)))  # [B, T, H]
        rows = hidden[:, start:]
        return self.model.compute_logits(rows.reshape(-1, rows.shape[-1])).view(*rows.shape[:2], -1).float()

    def commit(self, ids: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor, start: int) -> None:
        """Nothing to commit: the next step recomputes the whole frame, the finished block with it."""


def frame_mask(valid: torch.Tensor, block: int) -> torch.Tensor:
    """[B, 1, T, T] bool, True = may attend: key block <= query block, the key a real token (pads: themselves)."""
    length = valid.shape[1]
    blocks = torch.arange(length) // block
    allowed = (blocks[None, :] <= blocks[:, None])[None] & valid[:, None, :]
    return (allowed | torch.eye(length, dtype=torch.bool)[None])[:, None]


class BlockDiffusionPeer:
    def __init__(
        self,
        name: str,
        forward: BlockForward,
        block: int,
        mask_id: int,
        pad_id: int,
        threshold: float,
        steps: int | None = None,
        capped: bool = False,
    ) -> None:
        self.name, self.forward, self.block = name, forward, block
        self.mask_id, self.pad_id, self.threshold = mask_id, pad_id, threshold
        self.steps, self.capped = steps or block, capped

    @torch.inference_mode()
    def run(self, requests: list[SweepRequest]) -> PeerRun:
        wait, block = max(r.arrival_s for r in requests), self.block
        prompt_ids, prompt_valid = left_pad([r.prompt for r in requests], self.pad_id)
        frame = prompt_ids.shape[1]
        total = -(-(frame + max(r.max_tokens for r in requests)) // block) * block
        ids = torch.full((len(requests), total), self.mask_id, dtype=torch.long)
        ids[:, :frame] = prompt_ids
        valid = torch.cat([prompt_valid, torch.ones(len(requests), total - frame, dtype=torch.bool)], dim=1)
        positions = (valid.long().cumsum(1) - 1).clamp(min=0)
        mask = frame_mask(valid, block)
        traces = [RequestTrace(r.arrival_s) for r in requests]
        done = torch.zeros(len(requests), dtype=torch.bool)
        started = time.perf_counter()
        self.forward.reset()
        first = frame // block * block
        steps = min(self.steps, max(r.max_tokens for r in requests)) if self.capped else self.steps
        if first:
            self.forward.commit(ids[:, :first], positions[:, :first], mask[:, :, :first, :first], 0)
        for start in range(first, total, block):
            end = start + block
            self._denoise(ids[:, :end], positions[:, :end], mask[:, :, :end, :end], start, done, steps)
            at = wait + time.perf_counter() - started
            for row, request in enumerate(requests):
                if done[row]:
                    continue
                tokens = cut(ids[row, frame:end].tolist(), request.stop_token_ids, request.max_tokens)
                traces[row].deliver(at, len(tokens) - len(traces[row].tokens))
                traces[row].tokens = tokens
                done[row] = len(tokens) == request.max_tokens or (bool(tokens) and tokens[-1] in request.stop_token_ids)
            if bool(done.all()):
                break
            self.forward.commit(ids[:, :end], positions[:, :end], mask[:, :, :end, :end], start)
        return PeerRun(traces, wait + time.perf_counter() - started)

    def _denoise(
        self,
        ids: torch.Tensor,
        positions: torch.Tensor,
        mask: torch.Tensor,
        start: int,
        done: torch.Tensor,
        steps: int,
    ) -> None:
        """Fills the masks of block [start, end) in place, rows not `done`; done rows' masks become pads."""
        canvas = ids[:, start:]
        canvas[done] = torch.where(canvas[done] == self.mask_id, self.pad_id, canvas[done])
        for step in itertools.count():
            count = max(1, self.block // steps + (1 if step < self.block % steps else 0))
            masked = canvas == self.mask_id
            if not bool(masked.any()):
                return
            logits = self.forward.logits(ids, positions, mask, start)
            probs = torch.softmax(logits, dim=-1)  # the whole vocabulary's softmax, the mask token included ...
            tokens = logits.index_fill(-1, torch.tensor([self.mask_id]), float("-inf")).argmax(-1)  # ... never written
            confidence = probs.gather(-1, tokens[..., None])[..., 0]
            confidence = confidence.masked_fill(~masked, float("-inf"))
            accept = masked & (confidence > self.threshold)
            short = masked.any(1) & (accept.sum(1) < count)
            if bool(short.any()):  # fewer than `count` above the threshold: the `count` most confident instead
                top = confidence[short].topk(min(count, self.block), dim=1).indices
                accept[short] = torch.zeros_like(accept[short]).scatter_(1, top, True) & masked[short]
            canvas.copy_(torch.where(accept, tokens, canvas))
            if not bool(((canvas == self.mask_id) < masked).any()):
                raise RuntimeError("sweep: a peer step decoded no masked position (a mask token was written back)")
