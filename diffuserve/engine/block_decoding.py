"""BlockDecoding: a block's logits -> what the step writes into its canvas (rank 0). Applies the request's decoder
(or, with structured_outputs, the grammar walk; for decoder=renoise, engine/renoise_decoding), forbids tokens no
position may take, and owns the per-request sampling generators. Knows nothing of batches or caches: the model
runner hands it one block's logit rows.
"""

from __future__ import annotations

import random

import torch

from diffuserve.engine.decoders import DECODERS, Proposal, propose
from diffuserve.engine.grammar_decoding import StructuredDecoding
from diffuserve.engine.logprobs import token_logprobs
from diffuserve.engine.renoise_decoding import RenoiseDecoding
from diffuserve.engine.request import BlockWrite, Request


class BlockDecoding:
    def __init__(
        self,
        block_length: int,
        device: torch.device,
        seed: int = 0,
        structured: StructuredDecoding | None = None,
        vocab_size: int = 0,
    ) -> None:
        self.block_length, self.device = block_length, device
        self.structured = structured
        """Grammar-constrained decoding of requests with structured_outputs (None without a tokenizer)."""
        self.vocab_size = vocab_size
        """What a renoise canvas's random tokens range over."""
        self._renoise: RenoiseDecoding | None = None
        self._seed_source = random.Random(seed)
        self._generators: dict[str, torch.Generator] = {}

    def read_positions(self, request: Request, autoregressive: bool) -> list[int]:
        """Canvas indices of the request's block whose logits its decoder reads (autoregressive: the first
        masked one)."""
        if autoregressive:
            return request.masked_indices()[:1]
        if request.params.is_renoise:
            return list(range(self.block_length))
        return DECODERS[request.params.decoder].logit_positions(
            request.masked_indices(), request.generation_start_in_block(), self.block_length
        )

    def block_tokens(self, request: Request) -> list[int]:
        """The tokens the request's block reads this step: its canvas (a renoise canvas's first step draws it)."""
        if request.params.is_renoise:
            return self.renoise.canvas_tokens(request, self.sampling_generator(request))
        return request.canvas

    @property
    def renoise(self) -> RenoiseDecoding:
        """The renoise decoder's canvases (decoder=renoise), made with the first such request."""
        if self._renoise is None:
            self._renoise = RenoiseDecoding(self.block_length, self.vocab_size, self.device)
        return self._renoise

    def decode_renoise(self, request: Request, rows: torch.Tensor) -> tuple[BlockWrite, torch.Tensor | None]:
        """rows [C, V]: a renoise canvas's logits -> (the step's write, the tempered logits its next step is
        self-conditioned on, None when the canvas ends); below min_tokens the stop ids are forbidden."""
        rows = self.forbid_tokens(request, list(range(self.block_length)), rows)
        return self.renoise.decode(request, rows, self.sampling_generator(request))

    def decode(self, request: Request, rows: torch.Tensor, positions: list[int]) -> BlockWrite:
        """rows [M, V]: the block's logits at canvas `positions` -> what the decoder writes this step."""
        params = request.params
        structured = self.structured if params.structured_outputs is not None else None
        # Unstructured, the mask token keeps its logit: propose counts its mass and never proposes it.
        rows = self.forbid_tokens(request, positions, rows, forbid_mask=structured is not None)
        generator = self.generator(request)
        if structured is not None:
            proposal, written = structured.decode(request, rows, positions, generator, self.block_length)
            return block_write(proposal, torch.tensor(written, dtype=torch.long, device=self.device))
        decoder = DECODERS[params.decoder]
        index = torch.tensor(positions, dtype=torch.long, device=self.device)
        proposal = propose(
            rows,
            index,
            self.block_length,
            params,
            generator,
            decoder.needs_entropy,
            params.logprobs,
            request.mask_token_id,
        )
        canvas = torch.tensor(request.canvas, device=self.device)  # [B]
        write = decoder.decide(
            proposal, canvas, canvas == request.mask_token_id, request.step_in_block, params, self.block_length
        )
        return block_write(proposal, write.nonzero().flatten())

    def next_token(self, request: Request, row: torch.Tensor, index: int) -> BlockWrite:
        """Autoregressive: row [1, V] predicts canvas position `index` (the block's first masked one)."""
        rows = self.forbid_tokens(request, [index], row)
        positions = torch.tensor([index], device=self.device)
        params = request.params
        if params.structured_outputs is not None and self.structured is not None:
            # The grammar walk over the one position: the grammar's mask, then the decoder accepts it (>= 1 a step).
            proposal, written = self.structured.decode(
                request, rows, [index], self.generator(request), self.block_length
            )
            return block_write(proposal, torch.tensor(written, dtype=torch.long, device=self.device))
        proposal = propose(
            rows, positions, self.block_length, params, self.generator(request), num_logprobs=params.logprobs
        )
        return block_write(proposal, positions)

    def take_failures(self) -> dict[str, str]:
        """Requests whose grammar failed during the step's decoding (request id -> message), emptied."""
        if self.structured is None or not self.structured.failures:
            return {}
        return self.structured.take_failures()

    def release(self, request_id: str) -> None:
        """Forgets a finished request's generator, grammar state and canvas."""
        self._generators.pop(request_id, None)
        if self._renoise is not None:
            self._renoise.release(request_id)
        if self.structured is not None and request_id in self.structured.states:
            self.structured.release(request_id)

    def forbid_tokens(
        self, request: Request, positions: list[int], rows: torch.Tensor, forbid_mask: bool = True
    ) -> torch.Tensor:
        """rows [M, V]: this block's rows of the step's decode logits, at canvas `positions`, edited in place
        (no other block or reader shares them): the mask token at -inf everywhere unless `forbid_mask` is False
        (then `propose` keeps it out; a position given it would stay masked, and a model that ranks it first, as
        random weights can, would never finish its block), and below min_tokens the stop ids at -inf too."""
        if forbid_mask and 0 <= request.mask_token_id < rows.shape[-1]:
            rows[:, request.mask_token_id] = float("-inf")
        first_generated = request.block_start - request.num_prompt_tokens
        early = [i for i, index in enumerate(positions) if first_generated + index < request.params.min_tokens]
        if early and request.params.stop_ids:
            stop = torch.tensor(sorted(request.params.stop_ids), device=self.device)
            rows[torch.tensor(early, device=self.device)[:, None], stop[None, :]] = float("-inf")
        return rows

    def generator(self, request: Request) -> torch.Generator | None:
        """The request's generator (seeded with its seed, else one the engine draws); None when it decodes
        greedily."""
        return None if request.params.is_greedy else self.sampling_generator(request)

    def sampling_generator(self, request: Request) -> torch.Generator:
        if request.request_id not in self._generators:
            seed = request.params.seed if request.params.seed is not None else self._seed_source.getrandbits(63)
            self._generators[request.request_id] = torch.Generator(device=self.device).manual_seed(seed)
        return self._generators[request.request_id]


def block_write(proposal: Proposal | None, indices: torch.Tensor) -> BlockWrite:
    """The proposal's tokens at canvas `indices` [W] (and their logprobs, if it has them) as host values."""
    if proposal is None or not indices.numel():
        return BlockWrite([])
    written, tokens = torch.stack([indices, proposal.tokens[indices]]).tolist()  # one transfer
    accepted = list(zip(written, tokens))
    if proposal.logprobs is None:
        return BlockWrite(accepted)
    return BlockWrite(accepted, token_logprobs(proposal.logprobs, proposal.tokens, indices))
