"""GrammarState on the bundled model's byte tokenizer: the grammar starts after the `start_after` marker (the
reasoning is never constrained), stop ids end it, and `sync` rolls back and forward to any decided sequence."""

from __future__ import annotations

import pytest

from diffuserve.decoding.grammar_compiler import GrammarCompiler
from diffuserve.decoding.grammar_state import GrammarState
from diffuserve.errors import RequestError
from diffuserve.model.default_model import DEFAULT_MODEL_DIR
from diffuserve.structured_outputs import StructuredOutputsParams
from diffuserve.text.tokenizer import Tokenizer

EOS = 256
VOCAB = 272


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return Tokenizer(DEFAULT_MODEL_DIR)


@pytest.fixture(scope="module")
def compiler(tokenizer) -> GrammarCompiler:
    return GrammarCompiler(tokenizer.hf, VOCAB, [EOS])


def _allowed_text(state: GrammarState) -> set[int]:
    allowed = state.allowed()
    assert allowed is not None
    return {int(i) for i in allowed.nonzero()[0]}


def test_grammar_starts_after_the_marker(tokenizer, compiler):
    spec = StructuredOutputsParams(regex="[0-9]{2}", start_after="</think>")
    state = GrammarState(
        compiler.matcher(spec), VOCAB, tokenizer.encode("</think>", add_special_tokens=False), frozenset({EOS})
    )
    for token in tokenizer.encode("<think>any text, even </thin", add_special_tokens=False):
        assert state.allowed() is None  # reasoning: unconstrained
        state.push(token)
    for token in tokenizer.encode("k>", add_special_tokens=False):
        state.push(token)
    digits = set(tokenizer.encode("0123456789", add_special_tokens=False))
    space = set(tokenizer.encode(" \t\r\n", add_special_tokens=False))
    assert _allowed_text(state) == digits | space  # newlines may follow `</think>` before the answer
    state.push(tokenizer.encode("\n", add_special_tokens=False)[0])
    assert _allowed_text(state) == digits | space
    state.push(tokenizer.encode("4", add_special_tokens=False)[0])
    state.push(tokenizer.encode("2", add_special_tokens=False)[0])
    assert _allowed_text(state) == {EOS}
    state.push(EOS)
    assert state.allowed() is None  # ended: what follows the stop id is cut anyway


def test_sync_rolls_back_and_forward(tokenizer, compiler):
    spec = StructuredOutputsParams(
        json={"type": "object", "properties": {"a": {"type": "integer"}}, "additionalProperties": False}
    )
    state = GrammarState(compiler.matcher(spec), VOCAB, None, frozenset({EOS}))
    first = tokenizer.encode('{"a": 12}', add_special_tokens=False)
    state.sync([*first, EOS])
    assert state.ended and state.allowed() is None
    state.sync(first[:2])
    assert not state.ended and _allowed_text(state) == set(tokenizer.encode("a", add_special_tokens=False))
    other = tokenizer.encode('{"a": 7', add_special_tokens=False)
    state.sync(other)
    assert _allowed_text(state) >= set(tokenizer.encode("0}", add_special_tokens=False))
    with pytest.raises(RuntimeError, match="refused"):
        state.push(tokenizer.encode("x", add_special_tokens=False)[0])


def test_compilation_is_cached_and_errors_name_the_field(compiler):
    spec = StructuredOutputsParams(choice=["a", "b"])
    assert compiler.compile(spec) is compiler.compile(StructuredOutputsParams(choice=["a", "b"]))
    with pytest.raises(RequestError, match=r"structured_outputs\.grammar: does not compile"):
        compiler.compile(StructuredOutputsParams(grammar="start: nope"))


@pytest.mark.parametrize(
    ("spec", "text"),
    [
        (dict(regex="a/b"), "\n\na/b"),
        (dict(choice=['say "hi"', "no"]), ' say "hi"'),
        (dict(json={"type": "array", "maxItems": 1}), "\n[]"),
        (dict(json_object=True), '{"k": 1}'),
    ],
)
def test_after_a_marker_the_answer_may_start_with_whitespace(tokenizer, compiler, spec, text):
    with_marker = StructuredOutputsParams(**spec, start_after="</think>")
    assert compiler.compile(with_marker) != compiler.compile(StructuredOutputsParams(**spec))
    state = GrammarState(compiler.matcher(with_marker), VOCAB, None, frozenset({EOS}))
    state.sync(tokenizer.encode(text, add_special_tokens=False))
    assert _allowed_text(state) == {EOS}
