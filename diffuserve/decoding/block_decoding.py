"""BlockDecoding: the engine's decoding state on rank 0: the decoder registry, each request's decoder (resolved
once, when the request is added), the per-request generators and the grammar failures of a step. The model
runner asks it for a request's decoder and calls that decoder once per block; knows nothing of batches or caches.
"""

from __future__ import annotations

import torch

from diffuserve.core.request import Request
from diffuserve.decoding.generators import RequestGenerators
from diffuserve.decoding.grammar_walk import StructuredDecoding
from diffuserve.decoding.protocol import Decoder
from diffuserve.decoding.registry import DecoderRegistry
from diffuserve.model.interface import StepRules
from diffuserve.sampling_params import ResolvedSamplingParams


class BlockDecoding:
    def __init__(
        self,
        rules: StepRules,
        block_length: int,
        device: torch.device,
        seed: int = 0,
        structured: StructuredDecoding | None = None,
        vocab_size: int = 0,
    ) -> None:
        self.block_length, self.device, self.vocab_size = block_length, device, vocab_size
        self.structured = structured
        """Grammar-constrained decoding of requests with structured_outputs (None without a tokenizer)."""
        self.registry = DecoderRegistry(rules, block_length, device, vocab_size, structured)
        self.generators = RequestGenerators(device, seed)
        self._decoders: dict[str, Decoder] = {}

    def resolve(self, params: ResolvedSamplingParams) -> Decoder:
        """The decoder for a request with `params`, validated (a RequestError naming the field otherwise)."""
        return self.registry.resolve(params)

    def assign(self, request_id: str, decoder: Decoder) -> None:
        """The request decodes with `decoder` (resolved when it was added)."""
        self._decoders[request_id] = decoder

    def decoder_of(self, request: Request) -> Decoder:
        """The request's decoder (resolved now if it entered without one, e.g. a test's hand-made request)."""
        if request.request_id not in self._decoders:
            self._decoders[request.request_id] = self.registry.resolve(request.params)
        return self._decoders[request.request_id]

    def take_failures(self) -> dict[str, str]:
        """Requests whose grammar failed during the step's decoding (request id -> message), emptied."""
        if self.structured is None or not self.structured.failures:
            return {}
        return self.structured.take_failures()

    def release(self, request_id: str) -> None:
        """Forgets a finished request's decoder, generator and the decoder's state for it."""
        decoder = self._decoders.pop(request_id, None)
        if decoder is not None:
            decoder.release(request_id)
        self.generators.release(request_id)
