"""Verified decoding at temperature > 0 (decoding/verified.py): a greedy draft x checked against the causal row p
keeps x with probability p(x) and otherwise draws from p without x, so each verified position is distributed as
autoregressive sampling from p (temperature, top-k, top-p applied alike). Over many seeds on a 6-token vocabulary
the verified tokens and autoregressive draws cannot be told apart; drawing the replacement from p itself (the
residual resampling removed) can."""

from __future__ import annotations

import pytest
import torch

from diffuserve import SamplingParams
from diffuserve.core.request import Request
from diffuserve.decoding import verified
from diffuserve.decoding.generators import RequestGenerators
from diffuserve.decoding.mask_policies import filter_logits
from diffuserve.decoding.verified import VerifiedDecoder
from tests.engine.test_oracle_mutations import apply_source_mutation

LOGITS = torch.tensor([[2.0, 1.6, 0.3, -0.5, 1.0, -3.0], [0.1, 1.2, 2.2, 0.4, -1.0, 0.9]])
DRAFTS = [1, 2]  # neither is the most likely token of its row
PARAMS = SamplingParams(temperature=0.8, top_k=5, max_tokens=8, ignore_eos=True, decoder="verified")
SEEDS = 3000


def _verified_draws() -> tuple[torch.Tensor, torch.Tensor]:
    """Per seed: the first position's token, and the second's where the first kept its draft (else -1)."""
    decoder = VerifiedDecoder(block_length=2)
    first, second = [], []
    for seed in range(SEEDS):
        params = PARAMS.replace(seed=seed).with_defaults({})
        request = Request(f"r{seed}", [7, 7, 7, 7], params, block_length=2, mask_token_id=99)
        request.draft.tokens = list(DRAFTS)  # the block [2, 4), drafted; the next block opens at 4
        verdict = decoder.verify(request, LOGITS.clone(), [2, 3], DRAFTS, RequestGenerators(torch.device("cpu")))
        tokens = DRAFTS[: verdict.num_accepted] + ([verdict.token] if verdict.token is not None else [])
        first.append(tokens[0])
        second.append(tokens[1] if tokens[0] == DRAFTS[0] and len(tokens) > 1 else -1)
    return torch.tensor(first), torch.tensor(second)


def _autoregressive_draws() -> tuple[torch.Tensor, torch.Tensor]:
    """The same positions sampled autoregressively: the first from row 0, the second from row 1 given the first."""
    probs = torch.softmax(filter_logits(LOGITS / PARAMS.temperature, PARAMS.top_k, 1.0), dim=-1)
    generator = torch.Generator().manual_seed(1234)
    first = torch.multinomial(probs[0], SEEDS, replacement=True, generator=generator)
    second = torch.multinomial(probs[1], SEEDS, replacement=True, generator=generator)
    return first, torch.where(first == DRAFTS[0], second, -1)


def _distance(a: torch.Tensor, b: torch.Tensor) -> float:
    """Total variation distance between the empirical distributions of two samples (values -1..5)."""
    count = lambda x: torch.bincount(x + 1, minlength=7).double() / len(x)  # noqa: E731
    return 0.5 * (count(a) - count(b)).abs().sum().item()


def _conditional(first: torch.Tensor, second: torch.Tensor) -> torch.Tensor:
    return second[first == DRAFTS[0]]


def test_verified_sampling_is_autoregressive_sampling():
    first, second = _verified_draws()
    ar_first, ar_second = _autoregressive_draws()
    assert _distance(first, ar_first) < 0.04
    assert _distance(_conditional(first, second), _conditional(ar_first, ar_second)) < 0.08
    assert (first == DRAFTS[0]).any() and (first != DRAFTS[0]).any()  # both branches drawn
    assert (first != 5).all()  # top_k=5 leaves the least likely token out, the residual too


def test_without_the_residual_the_draft_is_too_likely(monkeypatch: pytest.MonkeyPatch):
    apply_source_mutation(monkeypatch, verified, "residual[draft] = 0.0", "pass")
    first, _ = _verified_draws()
    ar_first, _ = _autoregressive_draws()
    assert _distance(first, ar_first) > 0.1


GRAMMAR_VOCAB, GRAMMAR_EOS, GRAMMAR_MASK = 272, 256, 259
"""The bundled model's byte vocabulary (its tokenizer compiles the grammar)."""
GRAMMAR = r"[ab][xyz]"
GRAMMAR_DRAFTS = [ord("b"), ord("c")]
"""Drafted tokens: 'b' allowed and not the row's most likely allowed token; 'c' forbidden at the second position."""


def _grammar_rows() -> torch.Tensor:
    """[2, V] logits over bytes: the rows give most mass to tokens the grammar forbids."""
    rows = torch.full((2, GRAMMAR_VOCAB), -4.0)
    for token, logit in {"a": 1.0, "b": 0.5, "q": 3.0}.items():
        rows[0, ord(token)] = logit
    for token, logit in {"x": 0.2, "y": 1.1, "z": -0.4, "c": 2.5}.items():
        rows[1, ord(token)] = logit
    return rows


def test_grammar_constrained_verified_sampling_is_constrained_autoregressive_sampling():
    """At temperature > 0 with a grammar, each verified position is distributed as the grammar-masked causal row:
    the first as softmax over 'a', 'b'; the second, after a kept 'b', over 'x', 'y', 'z' (the draft 'c', which a
    grammar walk never drafts, is rejected every time). Without the mask the forbidden tokens would be drawn."""
    from diffuserve.decoding.constrained import GrammarConstrained
    from diffuserve.decoding.grammar_walk import StructuredDecoding
    from diffuserve.model.default_model import DEFAULT_MODEL_DIR
    from diffuserve.structured_outputs import StructuredOutputsParams
    from diffuserve.text.tokenizer import Tokenizer

    structured = StructuredDecoding(Tokenizer(DEFAULT_MODEL_DIR), GRAMMAR_VOCAB, [GRAMMAR_EOS])
    decoder = GrammarConstrained(VerifiedDecoder(block_length=2), structured, block_length=2)  # as the registry wraps
    spec = StructuredOutputsParams(regex=GRAMMAR)
    first, second = [], []
    for seed in range(1500):
        params = PARAMS.replace(seed=seed, top_k=0, structured_outputs=spec).with_defaults({})
        # One id for every seed: the matcher is made once and synced back to the verified tokens (none) each time.
        request = Request("g", [7, 7, 7, 7], params, block_length=2, mask_token_id=GRAMMAR_MASK)
        request.draft.tokens = list(GRAMMAR_DRAFTS)
        generators = RequestGenerators(torch.device("cpu"))
        verdict = decoder.verify(request, _grammar_rows(), [2, 3], GRAMMAR_DRAFTS, generators)
        assert verdict.token is not None  # "c" is forbidden: never kept
        tokens = [*GRAMMAR_DRAFTS[: verdict.num_accepted], verdict.token]
        first.append(tokens[0])
        if len(tokens) > 1:
            second.append(tokens[1])
    allowed = _grammar_rows().masked_fill(torch.ones(2, GRAMMAR_VOCAB, dtype=torch.bool), float("-inf"))
    for row, tokens in ((0, "ab"), (1, "xyz")):
        for t in tokens:
            allowed[row, ord(t)] = _grammar_rows()[row, ord(t)]
    probs = torch.softmax(allowed / PARAMS.temperature, dim=-1)
    for row, draws in ((0, first), (1, second)):
        counts = torch.bincount(torch.tensor(draws), minlength=GRAMMAR_VOCAB).double() / len(draws)
        assert 0.5 * (counts - probs[row]).abs().sum().item() < 0.06, row
    assert len(second) > 300  # 'b' kept often enough to see the second position
