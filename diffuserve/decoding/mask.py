"""MaskDecoder: a masked block decoded by one of the mask policies (threshold, fixed, entropy, edit): propose a
token at each position read, let the policy decide which to write. `decode_blocks` decodes a logits chunk's blocks
at once: those in the common case (greedy or sampled, with or without logprobs and penalties, no grammar, a batched
policy) in one pass (mask_batch.py), the others one by one."""

from __future__ import annotations

import torch

from diffuserve.core.request import Request
from diffuserve.decoding.generators import RequestGenerators, forbid_tokens
from diffuserve.decoding.mask_batch import BATCHED_RULES, decode_common_blocks
from diffuserve.decoding.mask_policies import MaskPolicy, propose
from diffuserve.decoding.protocol import BlockDecode, Decoder
from diffuserve.sampling_params import ResolvedSamplingParams


class MaskDecoder(Decoder):
    def __init__(self, name: str, policy: MaskPolicy, block_length: int) -> None:
        self.name, self.policy, self.block_length = name, policy, block_length

    def read_positions(self, request: Request) -> list[int]:
        return self.policy.logit_positions(
            request.masked_indices(), request.generation_start_in_block(), self.block_length
        )

    def decode(
        self, request: Request, rows: torch.Tensor, positions: list[int], generators: RequestGenerators
    ) -> BlockDecode:
        params = self.proposal_params(request)
        # The mask token keeps its logit: propose counts its mass and never proposes it.
        rows = forbid_tokens(request, positions, rows, forbid_mask=False)
        index = torch.tensor(positions, dtype=torch.long, device=rows.device)
        proposal = propose(
            rows,
            index,
            self.block_length,
            params,
            None if params.is_greedy else generators.of(request),
            self.policy.needs_entropy,
            params.logprobs,
            request.mask_token_id,
        )
        canvas = torch.tensor(request.canvas, device=rows.device)  # [B]
        write = self.policy.decide(
            proposal, canvas, canvas == request.mask_token_id, request.step_in_block, params, self.block_length
        )
        return BlockDecode(proposal.write(write.nonzero().flatten()))

    def decode_blocks(
        self,
        requests: list[Request],
        rows: torch.Tensor,
        positions: list[list[int]],
        generators: RequestGenerators,
    ) -> list[BlockDecode]:
        """rows [N, V] fp32: each block's rows at its `read_positions` (`positions`, as the step read them, not
        scanned again), request after request -> what each writes, the common case's blocks decoded in one pass and
        the others by `decode`."""
        starts = [0]
        for read in positions:
            starts.append(starts[-1] + len(read))
        params = [self.proposal_params(r) for r in requests]
        for request, p in zip(requests, params, strict=True):
            if not p.is_greedy:  # generators made in request order, as block-by-block decoding makes them
                generators.of(request)
        batched: list[int] = []
        if requests and self._batches(rows.device):
            mask_token_id = requests[0].mask_token_id  # one pass decodes one mask token's blocks
            batched = [i for i, r in enumerate(requests) if self._batchable(r, params[i], mask_token_id)]
        decoded: list[BlockDecode | None] = [None] * len(requests)
        if batched:
            taken = rows
            if len(batched) < len(requests):  # the common case's rows only
                index = [row for i in batched for row in range(starts[i], starts[i + 1])]
                taken = rows.index_select(0, torch.tensor(index, dtype=torch.long, device=rows.device))
            chosen = [requests[i] for i in batched]
            reads = [positions[i] for i in batched]
            writes = decode_common_blocks(self.policy, chosen, [params[i] for i in batched], taken, reads, generators)
            for i, write in zip(batched, writes, strict=True):
                decoded[i] = BlockDecode(write)
        for i, request in enumerate(requests):
            if decoded[i] is None:
                decoded[i] = self.decode(request, rows[starts[i] : starts[i + 1]], positions[i], generators)
        return [d for d in decoded if d is not None]

    def _batches(self, device: torch.device) -> bool:
        """Whether this decoder has a batched pass: its policy has a batched rule (entropy only on the CPU, whose
        row sums do not depend on how many rows are summed; a GPU reduction's order can), and `decode` is this
        class's (a subclass's own `decode` is not what the batched pass computes)."""
        entropy_ok = not self.policy.needs_entropy or device.type == "cpu"
        return type(self.policy) in BATCHED_RULES and entropy_ok and type(self).decode is MaskDecoder.decode

    @staticmethod
    def _batchable(request: Request, params: ResolvedSamplingParams, mask_token_id: int) -> bool:
        """Whether the request's block decodes in the batched pass exactly as `decode` would: no grammar (its
        wrapper never calls decode_blocks; checked anyway), no stop ids forbidden below min_tokens, and the pass's
        mask token. Penalties are their wrapper's, which hands this decoder rows already penalised, to `decode`
        and `decode_blocks` alike."""
        early = bool(params.stop_ids) and request.block_start - request.num_prompt_tokens < params.min_tokens
        return params.structured_outputs is None and not early and request.mask_token_id == mask_token_id

    @property
    def walk_policy(self) -> MaskPolicy:
        return self.policy
