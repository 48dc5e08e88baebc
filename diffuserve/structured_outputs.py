"""What a request's output must match: a JSON schema, any JSON object, a regex, one of a list of strings, or a
Lark grammar (vLLM's `structured_outputs` fields). A plain description, validated for shape only; compiling it
is `decoding/grammar_compiler.py`'s business, and that is where a schema that does not compile is refused.

`start_after`: the grammar applies only to the text after this marker (e.g. "</think>": the answer, never the
reasoning before it). Torch-free, llguidance-free.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from diffuserve.errors import RequestError

KINDS = ("json", "json_object", "regex", "choice", "grammar")


@dataclass(frozen=True)
class StructuredOutputsParams:
    json: dict[str, Any] | str | None = None
    """A JSON schema (an object, or its JSON text)."""
    json_object: bool = False
    """Any JSON object (OpenAI's response_format {"type": "json_object"})."""
    regex: str | None = None
    choice: list[str] | None = None
    """The output is exactly one of these strings."""
    grammar: str | None = None
    """A Lark grammar (llguidance's dialect: `start: ...`, `%json{...}` allowed)."""
    start_after: str | None = None
    """The grammar starts after the first occurrence of this text in the output (None: at the output's start);
    whitespace may then precede it (models write newlines after `</think>`)."""
    whitespace_flexible: bool = field(default=False, compare=False)
    """JSON: allow any whitespace between tokens (default: only `{"a": 1, "b": [2, 3]}`'s single spaces)."""

    def __post_init__(self) -> None:
        given = [kind for kind in KINDS if getattr(self, kind) not in (None, False)]
        if len(given) != 1:
            raise RequestError("structured_outputs", f"got {given or 'nothing'}; give exactly one of {KINDS}")
        if self.choice is not None and (not self.choice or not all(isinstance(c, str) and c for c in self.choice)):
            raise RequestError("structured_outputs.choice", f"got {self.choice!r:.80}; give non-empty strings")
        if isinstance(self.json, str):
            try:
                object.__setattr__(self, "json", json.loads(self.json))
            except json.JSONDecodeError as e:
                raise RequestError("structured_outputs.json", f"not valid JSON ({e}); send a JSON schema") from e
        if self.json is not None and not isinstance(self.json, dict):
            raise RequestError("structured_outputs.json", f"got {self.json!r:.80}; a JSON schema is an object")

    @property
    def kind(self) -> str:
        return next(kind for kind in KINDS if getattr(self, kind) not in (None, False))

    def cache_key(self) -> str:
        """Equal for requests that compile to the same grammar."""
        return json.dumps(
            [self.kind, getattr(self, self.kind), self.whitespace_flexible, self.start_after is not None],
            sort_keys=True,
        )
