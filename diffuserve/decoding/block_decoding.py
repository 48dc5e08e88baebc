"""BlockDecoding: the engine's decoding on rank 0, what the model runner calls twice a step (`plan` before the
forward, `decode` after it: decoding/step_decoding.py), with the state that lives across steps: the decoder
registry, each request's decoder (resolved by the engine when the request is added), the per-request generators
and the grammar failures of a step. Knows nothing of the batch's layout or the caches.
"""

from __future__ import annotations

import torch

from diffuserve.core.request import Request
from diffuserve.core.step import ScheduledRequest
from diffuserve.core.verification import checked_positions
from diffuserve.core.writes import BlockWrite, Verification
from diffuserve.decoding.generators import RequestGenerators
from diffuserve.decoding.grammar_walk import StructuredDecoding
from diffuserve.decoding.protocol import Decoder
from diffuserve.decoding.registry import DecoderRegistry
from diffuserve.decoding.step_decoding import (
    DecodedStep,
    DecodingPlan,
    PlannedBlock,
    PlannedDraft,
    SelfConditioningSink,
    StepLogits,
    decode_chunk,
    logit_chunks,
)
from diffuserve.decoding.verification import check_drafts, check_heads
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
        decoder = self._decoders.get(request.request_id)
        if decoder is None:
            decoder = self._decoders[request.request_id] = self.registry.resolve(request.params)
        return decoder

    def plan(self, scheduled: list[ScheduledRequest]) -> DecodingPlan:
        """Before the forward: each request's block (what its decoder reads and feeds) and the draft its commit
        verifies."""
        plan = DecodingPlan()
        fed = self._block_tokens([work.request for work in scheduled if work.has_block and work.forwards_block])
        for work in scheduled:
            request = work.request
            positions = checked_positions(work) if request.draft.tokens else []  # only verified requests draft
            if positions:
                first = request.draft.start(request.block_start)
                drafts = request.draft.tokens[positions[0] - first : positions[-1] + 1 - first]
                plan.drafts[request.request_id] = PlannedDraft(request, self.decoder_of(request), positions, drafts)
            if work.has_block:
                decoder = self.decoder_of(request)
                read = decoder.read_positions(request)
                tokens = fed.get(request.request_id, [])  # none for a block the forward does not run
                plan.blocks[request.request_id] = PlannedBlock(
                    request, decoder, read[:1] if work.head_only else read, tokens
                )
        return plan

    def _block_tokens(self, requests: list[Request]) -> dict[str, list[int]]:
        """Request id -> the tokens its block feeds the forward, asked of each decoder for all its requests at once
        (in the step's order)."""
        groups: dict[int, tuple[Decoder, list[Request]]] = {}
        for request in requests:
            decoder = self.decoder_of(request)
            groups.setdefault(id(decoder), (decoder, []))[1].append(request)
        fed: dict[str, list[int]] = {}
        for decoder, members in groups.values():
            fed |= {r.request_id: tokens for r, tokens in zip(members, decoder.block_tokens(members, self.generators))}
        return fed

    def decode(self, plan: DecodingPlan, logits: StepLogits, keep: SelfConditioningSink) -> DecodedStep:
        """After the forward: the drafts checked, then the blocks decoded (but those fused with a rejected draft),
        a chunk of logits at a time."""
        verdicts: dict[str, Verification] = {}
        if plan.drafts:
            draft_logits = logits.compute_logits(logits.hidden.index_select(0, logits.draft_rows))
            verdicts = check_drafts(list(plan.drafts.values()), draft_logits, self.generators)
        rejected = {request_id for request_id, verdict in verdicts.items() if verdict.token is not None}
        writes: dict[str, BlockWrite] = {}
        start = 0
        for chunk in logit_chunks(list(plan.blocks.values()), logits.max_rows):
            num_rows = sum(len(block.read) for block in chunk)
            hidden = logits.hidden.index_select(0, logits.block_rows[start : start + num_rows])
            writes |= self._decode_chunk(chunk, logits.compute_logits(hidden), rejected, keep)
            start += num_rows
        return DecodedStep(writes, verdicts, self.take_failures())

    def _decode_chunk(
        self, chunk: list[PlannedBlock], logits: torch.Tensor, skip: set[str], keep: SelfConditioningSink
    ) -> dict[str, BlockWrite]:
        """logits [the chunk's rows, V] fp32 -> the chunk's writes, verified heads checked against the rows they
        were read from; the self-conditioning input of canvases that go on handed to `keep`."""
        decoded = decode_chunk(chunk, logits, skip, self.generators)
        writes = {block.request.request_id: d.write for block, d, _ in decoded}
        heads = [(block, d.write, row) for block, d, row in decoded if block.request.rule.verifies_heads]
        if heads:
            writes |= check_heads(heads, logits, self.generators)
        carried = [(b.request, d.self_conditioning) for b, d, _ in decoded if d.self_conditioning is not None]
        del logits, decoded  # freed before the self-conditioning pass (unless canvases' tempered logits view them)
        if carried:
            keep(carried)
        return writes

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
