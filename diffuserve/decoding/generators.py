"""Per-request seeds and sampling generators, and the tokens no position may take (shared by every decoder).

A request's seed is its own, or one drawn from the engine's seed, and lives until the request finishes. The mask
decoders sample from a torch generator seeded with it (a greedy request draws nothing); the renoise decoder keys
its counter-based draws by it (renoise_draws). Knows nothing of decoders.
"""

from __future__ import annotations

import random

import torch

from diffuserve.core.request import Request


class RequestGenerators:
    def __init__(self, device: torch.device, seed: int = 0) -> None:
        self.device = device
        self._seed_source = random.Random(seed)
        self._seeds: dict[str, int] = {}
        self._generators: dict[str, torch.Generator] = {}

    def for_sampling(self, request: Request) -> torch.Generator | None:
        """The request's generator; None when it decodes greedily."""
        return None if request.params.is_greedy else self.of(request)

    def seed_of(self, request: Request) -> int:
        """The request's seed: its own, else one drawn from the engine's seed when it is first asked for."""
        if request.request_id not in self._seeds:
            seed = request.params.seed if request.params.seed is not None else self._seed_source.getrandbits(63)
            self._seeds[request.request_id] = seed
        return self._seeds[request.request_id]

    def of(self, request: Request) -> torch.Generator:
        """The request's generator (seeded with `seed_of`), made on first use."""
        if request.request_id not in self._generators:
            seed = self.seed_of(request)
            self._generators[request.request_id] = torch.Generator(device=self.device).manual_seed(seed)
        return self._generators[request.request_id]

    def release(self, request_id: str) -> None:
        self._seeds.pop(request_id, None)
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


def forbid_in_canvases(requests: list[Request], logits: torch.Tensor) -> torch.Tensor:
    """`forbid_tokens` for a batch of whole canvases: logits [B, C, V] (request b's canvas at row b), edited in
    place: every request's mask token (when it is a vocabulary id) in one indexing pass, then the stop ids of
    the positions below min_tokens, request by request for those few that have any."""
    vocab = logits.shape[-1]
    masked = [(b, r.mask_token_id) for b, r in enumerate(requests) if 0 <= r.mask_token_id < vocab]
    if masked:
        index = torch.tensor(masked, dtype=torch.long, device=logits.device).T  # [2, k]
        logits[index[0], :, index[1]] = float("-inf")
    for b, request in enumerate(requests):
        first_generated = request.block_start - request.num_prompt_tokens
        if first_generated < request.params.min_tokens and request.params.stop_ids:
            forbid_tokens(request, list(range(logits.shape[1])), logits[b], forbid_mask=False)
    return logits
