"""GrammarConstrained.decode_blocks (the grammar walks of a chunk's blocks in lockstep, grammar_batch.py) against
`decode` block by block, the oracle, on random logits: regex, choice and JSON grammars, every mask policy and the
verified drafts, greedy and sampled blocks (seeded or not, top-k, top-p), blocks with decided tokens the matcher is
synced to, stop ids forbidden below min_tokens, a matcher that fails, and blocks with logprobs, in one call. Each
side has its own matchers and generators."""

from __future__ import annotations

import random

import pytest
import torch

from diffuserve import SamplingParams
from diffuserve.core.request import Request
from diffuserve.decoding.constrained import GrammarConstrained
from diffuserve.decoding.generators import RequestGenerators
from diffuserve.decoding.grammar_state import GrammarState
from diffuserve.decoding.grammar_walk import StructuredDecoding
from diffuserve.decoding.mask import MaskDecoder
from diffuserve.decoding.mask_policies import MASK_POLICIES
from diffuserve.decoding.protocol import BlockDecode, Decoder
from diffuserve.decoding.verified import VerifiedDecoder
from diffuserve.model.default_model import DEFAULT_MODEL_DIR
from diffuserve.structured_outputs import StructuredOutputsParams
from diffuserve.text.tokenizer import Tokenizer

EOS, MASK, VOCAB = 256, 259, 272
BLOCK, PROMPT = 8, 8
SPECS = [
    StructuredOutputsParams(regex="[a-z ]{1,40}"),
    StructuredOutputsParams(regex="(yes|no)[0-9]{2,6}"),
    StructuredOutputsParams(choice=["alpha", "beta", "gamma delta"]),
    StructuredOutputsParams(json={"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}),
]
DECIDED = {0: [ord("a"), ord("b"), ord(" ")], 1: [ord("y"), ord("e"), ord("s")], 2: [ord("b")], 3: [ord("{")]}
"""Per spec: generated tokens the grammar allows, for blocks that continue a decided prefix."""


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return Tokenizer(DEFAULT_MODEL_DIR)


def _request(index: int, rng: random.Random, decoder: str) -> Request:
    spec_index = rng.randrange(len(SPECS))
    knobs: dict = dict(
        decoder=decoder,
        structured_outputs=SPECS[spec_index],
        max_tokens=64,
        threshold=rng.choice([0.05, 0.3, 0.6, 0.99]),
        steps=rng.choice([None, 1, 3, 5]),
        entropy_bound=rng.choice([0.0, 0.35, 1.5, 4.0]),
    )
    knobs.update(
        rng.choice(
            [
                {},
                {},
                dict(temperature=0.8, seed=index),
                dict(temperature=1.3, top_k=3),
                dict(temperature=0.6, top_p=0.7, seed=index + 100),
            ]
        )
    )
    knobs["logprobs"] = rng.choice([None, None, 0, 2, 5])
    if rng.random() < 0.2:  # stop ids forbidden at the positions below min_tokens
        knobs.update(min_tokens=30, stop_token_ids=[ord("e"), ord("1")])
    request = Request(f"r{index}", list(range(1, PROMPT + 1)), SamplingParams(**knobs).with_defaults({}), BLOCK, MASK)
    request.step_in_block = rng.randrange(4)
    if rng.random() < 0.3:  # a decided prefix the matcher is synced to, in the block or before it
        decided = DECIDED[spec_index]
        if rng.random() < 0.5:
            request.output_token_ids = list(decided)
        else:
            request.canvas[: len(decided)] = decided
    return request


def _rows(num_rows: int, rng: random.Random) -> torch.Tensor:
    """[N, V]: random logits, some peaked (a confident run the threshold walk accepts), some flat."""
    gen = torch.Generator().manual_seed(rng.randrange(1 << 30))
    rows = torch.randn(num_rows, VOCAB, generator=gen) * rng.choice([0.5, 2.0, 6.0])
    for i in range(num_rows):
        if rng.random() < 0.3:
            rows[i, rng.randrange(32, 127)] += 25.0
        elif rng.random() < 0.1:
            rows[i] = 1.0
    return rows


def _constrained(inner: Decoder, tokenizer: Tokenizer) -> GrammarConstrained:
    """A grammar wrapper with matchers of its own (the batched side and the oracle never share one)."""
    return GrammarConstrained(inner, StructuredDecoding(tokenizer, VOCAB, [EOS]), BLOCK)


def _compare(inner: Decoder, requests: list[Request], rng: random.Random, tokenizer: Tokenizer, monkeypatch) -> int:
    """decode_blocks equals decode for every request (writes, and which matchers failed); -> how many blocks were
    walked together."""
    oracle, batched = _constrained(inner, tokenizer), _constrained(inner, tokenizer)
    positions = [inner.read_positions(r) for r in requests]
    rows = _rows(sum(len(p) for p in positions), rng)
    expected, start, generators = [], 0, RequestGenerators(torch.device("cpu"), seed=1)
    for request, read in zip(requests, positions, strict=True):
        expected.append(oracle.decode(request, rows[start : start + len(read)].clone(), read, generators))
        start += len(read)
    assert any(d.write.accepted for d in expected)
    alone: list[str] = []
    per_request = GrammarConstrained.decode

    def counted(self, request, *args) -> BlockDecode:
        alone.append(request.request_id)
        return per_request(self, request, *args)

    monkeypatch.setattr(GrammarConstrained, "decode", counted)
    batched_generators = RequestGenerators(torch.device("cpu"), seed=1)
    got = batched.decode_blocks(requests, rows.clone(), positions, batched_generators)
    monkeypatch.undo()
    assert [d.write for d in got] == [d.write for d in expected]
    for request in requests:  # as many draws from each block's generator: the next step's draws agree too
        if not request.params.is_greedy:
            want = generators.of(request).get_state()
            assert torch.equal(batched_generators.of(request).get_state(), want), request.request_id
    assert batched.structured.take_failures() == oracle.structured.take_failures()
    assert batched.structured.states.keys() == oracle.structured.states.keys()
    for request_id, state in oracle.structured.states.items():
        assert batched.structured.states[request_id].fed == state.fed, request_id
    return len(requests) - len(alone)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("name", ["threshold", "fixed", "entropy"])
def test_walks_in_lockstep_equal_the_walks_one_by_one(name: str, seed: int, tokenizer: Tokenizer, monkeypatch):
    rng = random.Random(f"{name}-{seed}")
    requests = [_request(i, rng, name) for i in range(12)]
    decoder = MaskDecoder(name, MASK_POLICIES[name], BLOCK)
    assert _compare(decoder, requests, rng, tokenizer, monkeypatch) == len(requests)


def test_verified_drafts_walk_in_lockstep(tokenizer: Tokenizer, monkeypatch):
    rng = random.Random(3)
    requests = [_request(i, rng, "verified") for i in range(10)]
    assert _compare(VerifiedDecoder(BLOCK), requests, rng, tokenizer, monkeypatch) == len(requests)


def test_a_failing_matcher_fails_its_own_block_only(tokenizer: Tokenizer, monkeypatch):
    """A block whose decided tokens its grammar refuses: its matcher fails on both sides, nothing is written for
    it, and the other blocks decode as they would alone."""
    rng = random.Random(9)
    requests = [_request(i, rng, "threshold") for i in range(6)]
    requests[2].params = requests[2].params.replace(structured_outputs=SPECS[1], logprobs=None)
    requests[2].output_token_ids = [ord("z")]  # (yes|no)... never starts with z
    _compare(MaskDecoder("threshold", MASK_POLICIES["threshold"], BLOCK), requests, rng, tokenizer, monkeypatch)
    decoder = _constrained(MaskDecoder("threshold", MASK_POLICIES["threshold"], BLOCK), tokenizer)
    positions = [decoder.read_positions(r) for r in requests]
    got = decoder.decode_blocks(
        requests, _rows(sum(map(len, positions)), rng), positions, RequestGenerators(torch.device("cpu"))
    )
    assert got[2].write.accepted == [] and "r2" in decoder.structured.take_failures()


def test_a_matcher_failing_mid_walk_fails_its_own_block_only(tokenizer: Tokenizer, monkeypatch):
    """A matcher that refuses the walk's second token (as a matcher error would): on both sides the block fails
    alone, with nothing written, and the walks beside it go on."""
    rng = random.Random(13)
    requests = [_request(i, rng, "threshold") for i in range(6)]
    requests[2].params = requests[2].params.replace(threshold=0.0)  # nothing stops its walk early
    begin, push, fail = StructuredDecoding.begin, GrammarState.push, StructuredDecoding.fail
    failed: list[str] = []

    def poisoned_begin(self, request, *args):
        start = begin(self, request, *args)
        if request.request_id == "r2":
            start.state.poison_at = len(start.state.fed) + 1
        return start

    def refusing_push(self, token):
        if len(self.fed) >= getattr(self, "poison_at", len(self.fed) + 1):
            raise RuntimeError("refused")
        push(self, token)

    def recorded_fail(self, request, error):
        failed.append(request.request_id)
        fail(self, request, error)

    monkeypatch.setattr(StructuredDecoding, "begin", poisoned_begin)
    monkeypatch.setattr(GrammarState, "push", refusing_push)
    monkeypatch.setattr(StructuredDecoding, "fail", recorded_fail)
    _compare(MaskDecoder("threshold", MASK_POLICIES["threshold"], BLOCK), requests, rng, tokenizer, monkeypatch)
    assert failed == ["r2", "r2"]  # the oracle's, then the lockstep walk's
