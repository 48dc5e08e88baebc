"""Per-request sampling generators and the tokens no position may take (shared by every decoder).

A request's generator is seeded with its seed, or with one drawn from the engine's seed, and lives until the
request finishes; a greedy request draws nothing. Knows nothing of decoders or batches.
"""

from __future__ import annotations

import random

import torch

from diffuserve.core.request import Request


class RequestGenerators:
    def __init__(self, device: torch.device, seed: int = 0) -> None:
        self.device = device
        self._seed_source = random.Random(seed)
        self._generators: dict[str, torch.Generator] = {}

    def for_sampling(self, request: Request) -> torch.Generator | None:
        """The request's generator; None when it decodes greedily."""
        return None if request.params.is_greedy else self.of(request)

    def of(self, request: Request) -> torch.Generator:
        """The request's generator, made on first use."""
        if request.request_id not in self._generators:
            seed = request.params.seed if request.params.seed is not None else self._seed_source.getrandbits(63)
            self._generators[request.request_id] = torch.Generator(device=self.device).manual_seed(seed)
        return self._generators[request.request_id]

    def owner_of(self, generator: torch.Generator) -> str:
        """The id of the request `generator` belongs to (KeyError if none)."""
        return next(request_id for request_id, g in self._generators.items() if g is generator)

    def release(self, request_id: str) -> None:
        self._generators.pop(request_id, None)


def forbid_tokens(request: Request, positions: list[int], rows: torch.Tensor, forbid_mask: bool = True) -> torch.Tensor:
    """rows [M, V]: a block's rows of the step's decode logits, at canvas `positions`, edited in place (no other
    block or reader shares them): the mask token at -inf everywhere unless `forbid_mask` is False (then `propose`
    keeps it out; a position given it would stay masked, and a model that ranks it first, as random weights can,
    would never finish its block), and below min_tokens the stop ids at -inf too."""
    if forbid_mask and 0 <= request.mask_token_id < rows.shape[-1]:
        rows[:, request.mask_token_id] = float("-inf")
    first_generated = request.block_start - request.num_prompt_tokens
    early = [i for i, index in enumerate(positions) if first_generated + index < request.params.min_tokens]
    if early and request.params.stop_ids:
        stop = torch.tensor(sorted(request.params.stop_ids), device=rows.device)
        rows[torch.tensor(early, device=rows.device)[:, None], stop[None, :]] = float("-inf")
    return rows
