"""The grammar walk's acceptance rule on hand-built logits, under a grammar that allows any text (so the grammar
masks nothing and only the left-to-right rule decides): the decoder's count is taken from the left, then every
following position the decoder's rule accepts, up to the first it does not."""

from __future__ import annotations

import pytest
import torch

from diffuserve import SamplingParams
from diffuserve.core.request import Request
from diffuserve.decoding import grammar_walk as grammar_decoding
from diffuserve.decoding.grammar_walk import StructuredDecoding
from diffuserve.model.default_model import DEFAULT_MODEL_DIR
from diffuserve.structured_outputs import StructuredOutputsParams
from diffuserve.text.tokenizer import Tokenizer

EOS, MASK, VOCAB = 256, 259, 272
BLOCK = 8
SURE, UNSURE = 0.99, 0.3
"""Probabilities of a position's top token: above and below the 0.9 threshold."""


@pytest.fixture(scope="module")
def structured() -> StructuredDecoding:
    return StructuredDecoding(Tokenizer(DEFAULT_MODEL_DIR), VOCAB, [EOS])


def _rows(tops: list[float]) -> torch.Tensor:
    """[M, V] logits whose top token (the letter 'a' + m) has probability tops[m], the rest spread evenly."""
    rows = torch.full((len(tops), VOCAB), float("-inf"))
    text = torch.arange(32, 127)  # printable bytes, allowed by the grammar
    for m, top in enumerate(tops):
        rows[m, text] = torch.log(torch.tensor((1 - top) / (len(text) - 1)))
        rows[m, ord("a") + m] = torch.log(torch.tensor(top))
    return rows


def _accepted(structured: StructuredDecoding, tops: list[float], **params) -> list[int]:
    spec = StructuredOutputsParams(regex=r"[\s\S]*")
    resolved = SamplingParams(max_tokens=16, threshold=0.9, structured_outputs=spec, **params).with_defaults({})
    request = Request("r", [1, 2], resolved, BLOCK, MASK)  # canvas [1, 2, MASK x 6]
    positions = list(range(2, BLOCK))
    proposal, written = structured.decode(request, _rows(tops), positions, None, BLOCK)
    structured.release("r")
    assert proposal is not None and proposal.tokens[written].tolist() == [ord("a") + i - 2 for i in written]
    return written


@pytest.mark.parametrize("walk", ["early stop", "full walk"])
@pytest.mark.parametrize(
    ("params", "tops", "expected"),
    [
        # threshold: the first position by the schedule (the free decoder would take 3 and 4 alone), then 3 and 4
        ({}, [UNSURE, SURE, SURE, UNSURE, SURE, SURE], [2, 3, 4]),
        # threshold, nothing above it: the schedule's one position from the left (not the top-1 elsewhere)
        ({}, [UNSURE, 0.5, UNSURE, UNSURE, UNSURE, UNSURE], [2]),
        # threshold with a schedule of 2 a step: 2 from the left, then the run above the threshold
        ({"steps": 4}, [UNSURE, UNSURE, SURE, SURE, UNSURE, SURE], [2, 3, 4, 5]),
        # fixed: exactly its count from the left, however confident the positions after it
        ({"decoder": "fixed", "steps": 4}, [UNSURE, SURE, SURE, SURE, SURE, SURE], [2, 3]),
        # entropy: the first position, then the run the entropy bound selects (the four sure ones, 0.10 nats each)
        ({"decoder": "entropy", "entropy_bound": 0.35}, [UNSURE, SURE, SURE, UNSURE, SURE, SURE], [2, 3, 4]),
    ],
)
def test_after_the_count_from_the_left_the_decoders_rule_extends_the_run(
    structured, monkeypatch, walk, params, tops, expected
):
    if walk == "full walk":
        monkeypatch.setattr(grammar_decoding, "_early_stop", lambda *args: None)
    assert _accepted(structured, tops, **params) == expected
