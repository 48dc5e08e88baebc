"""The batched peers of `bench sweep`: what a user without an engine runs for N concurrent requests of each family,
as a static batcher (one batch, formed when its last request has arrived, run until every row is done; rows that
finished early stay in the batch, as in transformers' `generate`).

  transformers-kv-batched (SDAR, SDAR-MoE)  transformers' Qwen3(-MoE) with its KV cache, the SDAR scheme batched:
      prompts left-padded to one frame, blocks on the frame (as the official SDAR loop aligns a batch), each denoising
      step a forward of the current block of every row over the cache, then one commit forward per block
  recompute-batched (LLaDA2)  dFactory's `generate` on a batch: the whole [B, T] sequence recomputed every step under
      the block-causal mask, left-padded; run over diffuserve's model on its dense path (transformers has no LLaDA2)
  transformers-generate (Clover, autoregressive reading)  transformers' Qwen3_5MoeForCausalLM.generate, greedy,
      left-padded with an attention mask, the mask token suppressed (the engine never writes it)
  transformers-generate (DiffusionGemma)  transformers' DiffusionGemmaForBlockDiffusion.generate on the batch

Both block-diffusion peers decode by the confidence threshold the engine uses at temperature 0 (positions above the
threshold, else the most confident one). Pads attend only to themselves and are never keys of real tokens. The
peer's clock starts at the last arrival without idling in real time: its wall time and TTFTs add the wait.
Knows nothing of the engine.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from diffuserve.bench.sweep_metrics import RequestTrace
from diffuserve.bench.sweep_workload import SweepRequest


@dataclass
class PeerRun:
    traces: list[RequestTrace]
    wall_s: float


class Peer(Protocol):
    name: str

    def run(self, requests: list[SweepRequest]) -> PeerRun: ...


def cut(tokens: list[int], stops: tuple[int, ...], max_tokens: int) -> list[int]:
    """The first max_tokens tokens, ending at (and keeping) the first stop token."""
    tokens = tokens[:max_tokens]
    for i, token in enumerate(tokens):
        if token in stops:
            return tokens[: i + 1]
    return tokens


def left_pad(prompts: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """[B, L] ids left-padded to the longest prompt, and the [B, L] bool mask of real tokens."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    valid = torch.zeros(len(prompts), width, dtype=torch.bool)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt) :] = torch.tensor(prompt)
        valid[row, width - len(prompt) :] = True
    return ids, valid


class TimingStreamer:
    """A transformers streamer that only notes when each chunk of new tokens came out of `generate` (the first
    `put` is the prompt)."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self._prompt_seen = False

    def put(self, value: Any) -> None:
        if self._prompt_seen:
            self.times.append(time.perf_counter())
        self._prompt_seen = True

    def end(self) -> None:
        """The last chunk's time was noted by `put`."""


class TransformersGeneratePeer:
    """transformers' `generate` on the whole batch; each `put` of the streamer delivers `chunk` tokens per row
    (1 for autoregressive decoding, the canvas for DiffusionGemma)."""

    def __init__(self, name: str, model: Any, pad_id: int, chunk: int, extra: dict[str, Any] | None = None) -> None:
        self.name, self.model, self.pad_id, self.chunk, self.extra = name, model, pad_id, chunk, extra or {}

    def run(self, requests: list[SweepRequest]) -> PeerRun:
        wait = max(r.arrival_s for r in requests)
        ids, valid = left_pad([r.prompt for r in requests], self.pad_id)
        streamer = TimingStreamer()
        stops = list(requests[0].stop_token_ids)
        torch.manual_seed(self.extra.get("seed", 0))  # DiffusionGemma samples its canvases from the global generator
        started = time.perf_counter()
        with torch.inference_mode():
            out = self.model.generate(
                ids,
                attention_mask=valid.long(),
                max_new_tokens=max(r.max_tokens for r in requests),
                streamer=streamer,
                **self.options(stops),
            )
        wall = time.perf_counter() - started
        sequences = out.sequences if hasattr(out, "sequences") else out
        traces = []
        for row, request in enumerate(requests):
            trace = RequestTrace(request.arrival_s)
            trace.tokens = cut(sequences[row, ids.shape[1] :].tolist(), request.stop_token_ids, request.max_tokens)
            for k, at in enumerate(streamer.times):
                trace.deliver(wait + at - started, min(self.chunk, len(trace.tokens) - k * self.chunk))
            traces.append(trace)
        return PeerRun(traces, wait + wall)

    def options(self, stops: list[int]) -> dict[str, Any]:
        if "generation_config" in self.extra:  # DiffusionGemma: its own generation config, stops as its EOS
            config = self.extra["generation_config"]
            config.eos_token_id = stops or [self.extra["never"]]
            return {"generation_config": config}
        return {
            "do_sample": False,
            "eos_token_id": stops or None,
            "pad_token_id": self.pad_id,
            "suppress_tokens": self.extra.get("suppress_tokens"),
        }
