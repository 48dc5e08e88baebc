"""Typed errors for bad requests, raised by `LLMEngine.add_request` (the single authority for context length,
token-id range and stop-token checks) and by `SamplingParams` validation; and `GenerationFailed`, what the
offline API raises when requests failed inside the engine.

Each carries the field it is about (`param`) and an OpenAI-style error `code`, so that the server maps it to an
HTTP 400 without parsing messages. Every class is a `ValueError`, so offline callers keep catching ValueError.
Messages name the field, the value, the limit and the fix. No torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from diffuserve.core.outputs import RequestOutput


class RequestError(ValueError):
    """A request the engine refuses as given; `param` names the field, `code` is the OpenAI error code."""

    code = "invalid_value"

    def __init__(self, param: str | None, message: str) -> None:
        super().__init__(f"{param}: {message}" if param else message)
        self.param = param


class ContextLengthExceeded(RequestError):
    """The prompt (plus what must be generated) cannot fit within max_model_len or the KV cache."""

    code = "context_length_exceeded"


class InvalidTokenIds(RequestError):
    """Prompt or stop token ids outside the model's vocabulary. Its code is OpenAI's `invalid_value`, which the
    server has always answered for out-of-vocabulary ids (the class, not the code, tells it apart)."""

    code = "invalid_value"


class DuplicateRequestId(RequestError):
    """A request id that is already in use."""

    code = "duplicate_request_id"


class UnsupportedParameter(RequestError):
    """A field this model or engine configuration cannot honour (e.g. prompt_logprobs on a hybrid model)."""

    code = "unsupported_parameter"


class GenerationFailed(RuntimeError):
    """Requests of one `LLM.generate` / `LLM.chat` call that failed inside the engine (an exception in a step they
    were in, a grammar that failed): raised once every request of the call has finished. `failures` maps each
    failed request id to its cause; `outputs` holds every output of the call in prompt order (the failed ones
    with finish_reason "error" and their `error`), so the requests that succeeded are not lost."""

    def __init__(self, failures: dict[str, str], outputs: list[RequestOutput]) -> None:
        (first, cause), *rest = failures.items()
        more = f"; {len(rest)} more failed ({', '.join(r for r, _ in rest[:5])})" if rest else ""
        super().__init__(f"request {first} failed inside the engine: {cause}{more}")
        self.failures, self.outputs = failures, outputs
