"""The OpenAI wire format (and vLLM's extensions) as pydantic models: the requests (the responses, stream chunks
and errors are `response_models.py`).

Models only: no logic beyond declarative constraints, which the published OpenAPI schema carries too. Request
models are strict (a string where a number is expected is a type error, not a coercion; only an integral number
such as 4.0 counts as an integer, as in JSON Schema) and reject NaN/infinity. Unknown request fields are kept in
`model_extra` (the server ignores them with a warning, as vLLM does). Fields that OpenAI or vLLM define but
diffuserve does not implement are declared with `unsupported()`, so that `parsing` can reject any
non-neutral value with a 400 naming the field instead of silently ignoring it.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from diffuserve.sampling_defaults import DECODERS
from diffuserve.sampling_params import MAX_LOGPROBS

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def _integral(value: Any) -> Any:
    return int(value) if isinstance(value, float) and value.is_integer() else value


# JSON integers: 4 or 4.0, never "4". (Constraints go before the validator, or the schema loses them.)
Int = Annotated[int, BeforeValidator(_integral)]
PositiveInt = Annotated[int, Field(ge=1), BeforeValidator(_integral)]
NonNegativeInt = Annotated[int, Field(ge=0), BeforeValidator(_integral)]
TopK = Annotated[int, Field(ge=-1), BeforeValidator(_integral)]
Seed = Annotated[int, Field(ge=INT64_MIN, le=INT64_MAX), BeforeValidator(_integral)]
NumLogprobs = Annotated[int, Field(ge=0, le=MAX_LOGPROBS), BeforeValidator(_integral)]
Text = Annotated[str, Field(min_length=1)]


def unsupported() -> Any:
    """A field diffuserve does not implement: the schema says null; any other value but a neutral one is a 400."""
    return Field(
        default=None,
        json_schema_extra={"type": "null"},
        description="Not supported by diffuserve: omit it (a non-neutral value is a 400).",
    )


class RequestModel(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow", allow_inf_nan=False, use_attribute_docstrings=True)


class StreamOptions(RequestModel):
    include_usage: bool = False
    """Send a final chunk with `usage` (and no choices) before `data: [DONE]`."""
    continuous_usage_stats: bool = False
    """vLLM extension: every chunk carries the usage so far."""
    include_denoising: bool = False
    """diffuserve extension: before each delta, a chunk with `denoising` (and no choices) listing, per denoising
    step, the output positions it decided and their tokens (docs/serving/index.md, "Denoising stream")."""


class JsonSchemaFormat(RequestModel):
    name: str = "response"
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    """The JSON schema the output must match (None: any JSON value)."""
    strict: bool | None = None
    """Accepted for compatibility: the output always matches the schema exactly."""


class ResponseFormat(RequestModel):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None
    """Required with type json_schema."""


class StructuredOutputsField(RequestModel):
    json_: dict[str, Any] | str | None = Field(default=None, alias="json")
    regex: str | None = None
    choice: Annotated[list[str], Field(min_length=1)] | None = None
    grammar: str | None = None
    """A Lark grammar (llguidance's dialect)."""


class SamplingFields(RequestModel):
    """Fields shared by completions and chat completions."""

    model: str | None = None
    """Served model name; None = the one model this server serves."""
    temperature: float | None = Field(default=None, ge=0)
    top_p: float = Field(default=1.0, gt=0, le=1)
    top_k: TopK = 0
    seed: Seed | None = None
    n: PositiveInt = 1
    stop: Text | list[Text] | None = None
    stop_token_ids: list[Int] | None = None
    ignore_eos: bool = False
    min_tokens: NonNegativeInt = 0
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    # Block-diffusion extensions (diffuserve), see docs/serving/index.md. None = the model's default.
    decoder: Literal[DECODERS] | None = None  # type: ignore[valid-type]  # pydantic reads the names at runtime
    """Which masked positions a denoising step accepts."""
    threshold: float | None = Field(default=None, ge=0, le=1)
    """Confidence a proposal must exceed to be accepted (threshold and edit decoders)."""
    steps: PositiveInt | None = None
    """Denoising steps per block of the schedule: each step accepts at least block_length // steps tokens."""
    entropy_bound: float | None = Field(default=None, ge=0)
    """EB-sampler gamma (entropy decoder)."""
    edit_threshold: float | None = Field(default=None, ge=0, le=1)
    """Confidence above which the edit decoder rewrites an accepted token of the open block."""
    max_post_edit_steps: NonNegativeInt | None = None
    """Steps the edit decoder may still take on a block once its masks are gone."""
    t_min: float | None = Field(default=None, ge=0)
    """The renoise decoder's last temperature end (DiffusionGemma: t_max -> t_min over the steps)."""
    t_max: float | None = Field(default=None, gt=0)
    """The renoise decoder's first-step temperature."""
    stability_threshold: NonNegativeInt | None = None
    """Renoise: a canvas may stop once its argmax repeated that of this many previous steps."""
    confidence_threshold: float | None = Field(default=None, gt=0)
    """Renoise: ... and its mean entropy (nats) is below this."""
    # Penalties (decoding/penalties.py): OpenAI's presence / frequency, vLLM's repetition. None = the model's.
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)
    repetition_penalty: float | None = Field(default=None, gt=0)
    penalize_prompt: bool = False
    """The penalties also count the prompt's tokens (default: the response's only)."""
    # Defined by OpenAI or vLLM, not implemented: any non-neutral value is a 400.
    logit_bias: Any = unsupported()
    min_p: Any = unsupported()
    use_beam_search: Any = unsupported()
    allowed_token_ids: Any = unsupported()
    bad_words: Any = unsupported()
    truncate_prompt_tokens: Any = unsupported()
    # Structured output (docs/decoding/structured-output.md, "Structured output"): at most one of these.
    response_format: ResponseFormat | None = None
    """OpenAI's: {"type": "text" | "json_object"} or {"type": "json_schema", "json_schema": {...}}."""
    structured_outputs: StructuredOutputsField | None = None
    """vLLM's: exactly one of json, regex, choice, grammar."""
    guided_json: dict[str, Any] | str | None = None
    """vLLM's former name of structured_outputs.json."""
    guided_regex: str | None = None
    guided_choice: Annotated[list[str], Field(min_length=1)] | None = None
    guided_grammar: str | None = None


class CompletionRequest(SamplingFields):
    prompt: (
        Text
        | Annotated[list[Text], Field(min_length=1)]
        | Annotated[list[Int], Field(min_length=1)]
        | Annotated[list[Annotated[list[Int], Field(min_length=1)]], Field(min_length=1)]
    )
    """Text, several texts, token ids, or several token-id lists (one choice group per prompt)."""
    max_tokens: NonNegativeInt | None = 16
    """0: nothing is generated (with echo and logprobs, the prompt is only scored)."""
    echo: bool = False
    logprobs: NumLogprobs | None = None
    """Per token, its logprob and this many top alternatives: the generated tokens' (docs/serving/logprobs.md),
    and with echo the prompt's first (docs/serving/logprobs.md, "Prompt scoring")."""
    prompt_logprobs: NumLogprobs | None = None
    """vLLM's: the prompt tokens' logprobs with this many top alternatives, as `choices[i].prompt_logprobs`."""
    suffix: Any = unsupported()
    best_of: Any = unsupported()


class TextPart(RequestModel):
    type: Literal["text"]
    text: str


class FunctionCall(RequestModel):
    name: str
    arguments: str
    """The arguments as JSON text."""


class ToolCall(RequestModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(RequestModel):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    """`developer` is OpenAI's newer name for `system`; `tool` carries a tool's result."""
    content: str | list[TextPart] | None = Field(...)
    """Text, or text parts (joined with newlines); may be null only in an assistant message with tool_calls."""
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    """An assistant message's calls."""
    tool_call_id: str | None = None
    """A tool message: the call it answers."""


class FunctionDefinition(RequestModel):
    name: Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.\-]+$")]
    description: str | None = None
    parameters: dict[str, Any] | None = None
    """The arguments' JSON schema (None: no arguments)."""
    strict: bool | None = None


class Tool(RequestModel):
    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(RequestModel):
    name: str


class NamedToolChoice(RequestModel):
    type: Literal["function"]
    function: NamedFunction


class ChatCompletionRequest(SamplingFields):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_tokens: PositiveInt | None = None
    """Deprecated by OpenAI in favour of max_completion_tokens; None = up to the context length."""
    max_completion_tokens: PositiveInt | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, Any] | None = None
    logprobs: bool | None = None
    """true: return each generated token's logprob (docs/serving/logprobs.md, "Logprobs")."""
    top_logprobs: NumLogprobs | None = None
    """With logprobs: this many top alternatives per token."""
    prompt_logprobs: Any = unsupported()
    tools: list[Tool] | None = None
    """Functions the model may call (rendered through the chat template; docs/decoding/structured-output.md)."""
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    """None: auto when tools are given, else none. required and a named function are enforced by a grammar."""
    parallel_tool_calls: bool = True
    """false: at most one call per reply."""
    functions: Any = unsupported()
    function_call: Any = unsupported()
    audio: Any = unsupported()
    modalities: Any = unsupported()
    prediction: Any = unsupported()
    reasoning_effort: Any = unsupported()
    web_search_options: Any = unsupported()
    chat_template: Any = unsupported()
    documents: Any = unsupported()
    echo: Any = unsupported()


class TokenizeRequest(RequestModel):
    model: str | None = None
    prompt: str | None = None
    messages: Annotated[list[ChatMessage], Field(min_length=1)] | None = None
    """Exactly one of prompt and messages."""
    add_special_tokens: bool = True
    add_generation_prompt: bool = True


class DetokenizeRequest(RequestModel):
    model: str | None = None
    tokens: list[Int]
