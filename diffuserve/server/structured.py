"""From a request's structured-output fields (OpenAI's `response_format`, vLLM's `structured_outputs` and
`guided_*`) and its tool choice to the engine's `StructuredOutputsParams`, or None for free text.

At most one of the fields may constrain a request (a 400 naming both otherwise). A tool choice of `required` or
a named function is itself a grammar (tool_calls.tool_call_grammar), so it cannot be combined with another one.
For templates that think, the grammar starts after `</think>`: it constrains the answer, never the reasoning.
Whether a grammar compiles is the engine's check (a 400 naming the field and llguidance's message).
Knows nothing of the engine's internals or of HTTP transport.
"""

from __future__ import annotations

from typing import Any

from diffuserve.server.errors import bad_request
from diffuserve.server.protocol import SamplingFields
from diffuserve.structured_outputs import StructuredOutputsParams

THINK_END = "</think>"


def structured_outputs(
    request: SamplingFields, tool_grammar: str | None = None, thinking: bool = False
) -> StructuredOutputsParams | None:
    """The request's grammar; `tool_grammar`: the Lark grammar its tool choice forces (if any); `thinking`: the
    chat template thinks, so the grammar starts after THINK_END."""
    given = _given(request)
    if tool_grammar is not None:
        given.append(("tool_choice", {"grammar": tool_grammar}))
    if not given:
        return None
    if len(given) > 1:
        names = [name for name, _ in given]
        raise bad_request(f"{names[1]}: cannot be combined with {names[0]}; constrain the output one way", names[1])
    name, fields = given[0]
    try:
        return StructuredOutputsParams(**fields, start_after=THINK_END if thinking else None)
    except ValueError as e:
        raise bad_request(f"{name}: {str(e).split(': ', 1)[-1]}", name) from e


def _given(request: SamplingFields) -> list[tuple[str, dict[str, Any]]]:
    """(field name, StructuredOutputsParams fields) of every constraining field the request sets."""
    given: list[tuple[str, dict[str, Any]]] = []
    fmt = request.response_format
    if fmt is not None and fmt.type == "json_object":
        given.append(("response_format", {"json_object": True}))
    elif fmt is not None and fmt.type == "json_schema":
        if fmt.json_schema is None:
            raise bad_request(
                'response_format: type json_schema needs a `json_schema` object ({"name": ..., "schema": {...}})',
                "response_format",
            )
        schema = fmt.json_schema.schema_
        given.append(("response_format", {"json": schema} if schema is not None else {"json_object": True}))
    so = request.structured_outputs
    if so is not None:
        fields = {"json": so.json_, "regex": so.regex, "choice": so.choice, "grammar": so.grammar}
        given.append(("structured_outputs", {k: v for k, v in fields.items() if v is not None}))
    for name, key in (
        ("guided_json", "json"),
        ("guided_regex", "regex"),
        ("guided_choice", "choice"),
        ("guided_grammar", "grammar"),
    ):
        value = getattr(request, name)
        if value is not None:
            given.append((name, {key: value}))
    return given
