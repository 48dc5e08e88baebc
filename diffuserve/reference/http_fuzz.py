"""HTTP input drawn from the server's own OpenAPI schema (schemathesis): every operation the schema lists, with
requests that fit it (positive) and requests that violate it (negative: wrong types, missing fields, values out
of range), each answer checked and counted. Shared by tests/server/test_fuzz.py (a small budget, in CI) and
scripts/fuzz_http.py (a larger one, whose counts docs/internals/testing.md shows).

The rule every answer must keep: a 2xx, or a 4xx whose body is OpenAI's error shape (`{"error": {"message",
"type", "param", "code"}}`) with a message; never a 5xx; a streamed answer ends with `[DONE]` and carries no
error frame; and `/health` still answers 200 after each operation's examples.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import httpx
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode

MODES: tuple[Any, ...] = (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)
"""schemathesis's generation modes (typed loosely: its stubs declare the members as plain strings)."""


@dataclass
class FuzzCounts:
    """What one run drew and got back."""

    examples: Counter[str] = field(default_factory=Counter)
    """"METHOD path mode" -> examples sent."""
    statuses: Counter[int] = field(default_factory=Counter)
    problems: list[str] = field(default_factory=list)
    """One line per answer that broke the rule (empty: none did)."""

    def as_json(self) -> dict[str, Any]:
        return {
            "operations": len({key.rsplit(" ", 1)[0] for key in self.examples}),
            "examples": sum(self.examples.values()),
            "examples_by_operation": dict(sorted(self.examples.items())),
            "statuses": {str(k): v for k, v in sorted(self.statuses.items())},
            "problems": self.problems,
        }


def operations(schema: dict[str, Any]) -> list[tuple[str, str]]:
    """(METHOD, path) of every operation the schema lists, in its order."""
    return [(method.upper(), path) for path, ops in schema["paths"].items() for method in ops]


def problem(response: Any) -> str | None:
    """Why an answer breaks the rule (module docstring), or None."""
    text = response.content.decode(errors="replace")
    if response.status_code >= 500:
        return f"{response.status_code}: {text[:200]}"
    if response.status_code >= 400:
        try:
            error = json.loads(text)["error"]
        except (ValueError, KeyError, TypeError):
            return f"{response.status_code} without an OpenAI error body: {text[:200]}"
        if set(error) != {"message", "type", "param", "code"} or not error["message"]:
            return f"{response.status_code} with a malformed error: {error}"
        return None
    content_type = response.headers.get("content-type", [""])
    if (content_type[0] if isinstance(content_type, list) else content_type).startswith("text/event-stream"):
        frames = [line[6:] for line in text.splitlines() if line.startswith("data: ")]
        if not response.stream_cut_short and (not frames or frames[-1] != "[DONE]"):
            return f"a stream that does not end with [DONE]: {frames[-2:]}"
        if any(f != "[DONE]" and "error" in json.loads(f) for f in frames):
            return f"an error frame in a 200 stream: {frames}"
    return None


def fuzz(
    schema: dict[str, Any], base_url: str, budget: dict[str, int], default: int, counts: FuzzCounts | None = None
) -> FuzzCounts:
    """Every operation of `schema` in both modes, `budget.get("METHOD path", default)` examples each
    (derandomized: the same run every time), against the server at `base_url`."""
    counts = counts or FuzzCounts()
    loaded = schemathesis.openapi.from_dict(schema)
    for method, path in operations(schema):
        for mode in MODES:
            examples = budget.get(f"{method} {path}", default)
            _fuzz_one(loaded[path][method], base_url, mode, examples, f"{method} {path} {mode.value}", counts)
        health = httpx.get(f"{base_url}/health", timeout=30)
        if health.status_code != 200:
            counts.problems.append(f"/health answered {health.status_code} after {method} {path}")
    return counts


def _fuzz_one(operation: Any, base_url: str, mode: Any, examples: int, key: str, counts: FuzzCounts) -> None:
    @settings(
        max_examples=examples,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(case=operation.as_strategy(generation_mode=mode))
    def draw(case: Any) -> None:
        response = case.call(base_url=base_url, timeout=60)
        counts.examples[key] += 1
        counts.statuses[response.status_code] += 1
        found = problem(response)
        if found is not None:
            counts.problems.append(f"{key}: {found}")

    try:
        draw()
    except Unsatisfiable:  # an operation without parameters or body has no invalid input to draw
        if mode is not GenerationMode.NEGATIVE:
            raise
