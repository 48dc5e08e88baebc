"""Compiles `StructuredOutputsParams` into llguidance grammars for one tokenizer, and makes matchers of them.

Why llguidance: it compiles lazily (an Earley parser over a derivative-based lexer, no per-grammar token-mask
precomputation), so a new schema per request costs about a millisecond; it has no dependencies beyond its wheel
(no torch, no CUDA build); and its matcher offers exactly what block decoding needs: `consume_tokens`,
`rollback`, `validate_tokens` and a bitmask of the next allowed tokens.

Compilation is cached per grammar (`cache_key`); a grammar that does not compile raises a `RequestError` naming
the field and llguidance's message. Knows nothing of blocks or steps (see grammar_decoding).
"""

from __future__ import annotations

import json
import re
from collections import OrderedDict
from typing import Any

import llguidance

from diffuserve.errors import RequestError
from diffuserve.structured_outputs import StructuredOutputsParams

CACHE_SIZE = 256
"""Compiled grammars kept (least recently used dropped first)."""
JSON_SEPARATORS = {"item_separator": ", ", "key_separator": ": "}
"""JSON is written as Python's json.dumps and the Qwen3 tool-call format write it: `{"a": 1, "b": [2, 3]}`."""


class GrammarCompiler:
    def __init__(self, hf_tokenizer: Any, vocab_size: int, eos_token_ids: list[int]) -> None:
        """`hf_tokenizer`: a transformers fast tokenizer; `vocab_size`: the model's (padded) vocabulary, so that
        masks have one bit per logit; `eos_token_ids`: the ids that end a request, allowed once the grammar is
        complete."""
        import llguidance.hf  # imports transformers: seconds a worker rank, which never compiles grammars, skips

        self.vocab_size = vocab_size
        self.tokenizer = llguidance.hf.from_tokenizer(
            hf_tokenizer, n_vocab=vocab_size, eos_token=list(eos_token_ids) or None
        )
        self._cache: OrderedDict[str, str] = OrderedDict()

    def compile(self, spec: StructuredOutputsParams) -> str:
        """The llguidance grammar of `spec` (cached); RequestError if it does not compile."""
        key = spec.cache_key()
        if key in self._cache:
            self._cache.move_to_end(key)
            return self._cache[key]
        grammar = _grammar_text(spec)
        is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar, self.tokenizer)
        if is_error:
            raise RequestError(
                f"structured_outputs.{spec.kind}",
                f"does not compile: {_one_line(messages[0] if messages else '')}; fix it",
            )
        self._cache[key] = grammar
        if len(self._cache) > CACHE_SIZE:
            self._cache.popitem(last=False)
        return grammar

    def matcher(self, spec: StructuredOutputsParams) -> llguidance.LLMatcher:
        """A fresh matcher at the grammar's start."""
        return llguidance.LLMatcher(self.tokenizer, self.compile(spec), log_level=0)


def _one_line(message: str) -> str:
    """llguidance's multi-line message (with the source and a caret under the error) as one line."""
    lines = [line.strip() for line in message.splitlines()]
    kept = [line for line in lines if line and not set(line) <= {"^", " "} and "|" not in line[:8]]
    return " ".join(kept)[:400] or "invalid grammar"


def _grammar_text(spec: StructuredOutputsParams) -> str:
    options = {"whitespace_flexible": spec.whitespace_flexible, **JSON_SEPARATORS}
    if spec.start_after is not None and spec.grammar is None:
        # After `</think>` models write a newline or two before the answer: allow leading whitespace there.
        return llguidance.LLMatcher.grammar_from_lark(
            f"start: LEAD? {_lark_body(spec, options)}\nLEAD: /[ \\t\\r\\n]+/"
        )
    if isinstance(spec.json, dict):  # StructuredOutputsParams parsed JSON text into a dict
        return _from_json_schema(spec.json, options)
    if spec.json_object:
        return _from_json_schema({"type": "object"}, options)
    if spec.regex is not None:
        return llguidance.LLMatcher.grammar_from_regex(spec.regex)
    if spec.choice is not None:
        # Lark string literals use JSON's escaping.
        return llguidance.LLMatcher.grammar_from_lark("start: " + " | ".join(json.dumps(c) for c in spec.choice))
    assert spec.grammar is not None
    return llguidance.LLMatcher.grammar_from_lark(spec.grammar)


def _lark_body(spec: StructuredOutputsParams, options: dict[str, Any]) -> str:
    """`spec` (not a Lark grammar) as one Lark expression."""
    if spec.regex is not None:
        return "/(?:" + re.sub(r"(?<!\\)/", r"\\/", spec.regex) + ")/"
    if spec.choice is not None:
        return "(" + " | ".join(json.dumps(c) for c in spec.choice) + ")"
    schema: dict[str, Any] = spec.json if isinstance(spec.json, dict) else {"type": "object"}
    return "%json " + json.dumps({**schema, "x-guidance": {**schema.get("x-guidance", {}), **options}})


def _from_json_schema(schema: dict[str, Any], options: dict[str, Any]) -> str:
    try:
        # llguidance types `overrides` as its JsonCompileOptions TypedDict; ours is the same keys in a plain dict
        return llguidance.LLMatcher.grammar_from_json_schema(schema, overrides=options)  # type: ignore[arg-type]
    except ValueError as e:
        raise RequestError("structured_outputs.json", f"not a JSON schema ({e}); fix it") from e
