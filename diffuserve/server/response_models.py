"""The OpenAI wire format (and vLLM's extensions) as pydantic models: responses, stream chunks, errors (the
requests are `protocol.py`). Models only; `responses.py` builds them.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class ResponseModel(BaseModel):
    model_config = ConfigDict(use_attribute_docstrings=True)


class PromptTokensDetails(ResponseModel):
    cached_tokens: int = 0


class Usage(ResponseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    num_forwards: int
    """NFE: denoising forwards over all choices."""
    tokens_per_forward: float
    """TPF: completion_tokens / num_forwards."""
    prompt_tokens_details: PromptTokensDetails | None = None


class TopLogprob(ResponseModel):
    """A token and its logprob (OpenAI's chat shape). `bytes`: the UTF-8 bytes of `token`."""

    token: str
    logprob: float
    bytes: list[int] | None = None


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob] = Field(default_factory=list)
    """The most probable tokens at this position, most probable first."""


class ChatLogprobs(ResponseModel):
    content: list[TokenLogprob] | None = None


class CompletionLogprobs(ResponseModel):
    """OpenAI's legacy completions shape: parallel lists, one entry per token."""

    tokens: list[str] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = Field(default_factory=list)
    text_offset: list[int] = Field(default_factory=list)
    """Character offset of each token in the choice's text."""


class PromptLogprob(ResponseModel):
    """vLLM's shape of one token's entry in `prompt_logprobs`."""

    logprob: float
    rank: int
    """1 + the tokens strictly more likely at this position."""
    decoded_token: str | None = None


class ChoiceFields(ResponseModel):
    """What every choice carries, whole or streamed."""

    index: int
    finish_reason: str | None = None
    stop_reason: int | str | None = None


class ResponseFields(ResponseModel):
    """What every completion response and chunk carries besides its choices."""

    id: str
    created: int
    model: str
    usage: Usage | None = None


class CompletionChoice(ChoiceFields):
    text: str
    logprobs: CompletionLogprobs | None = None
    prompt_logprobs: list[dict[int, PromptLogprob] | None] | None = None
    """With the request's prompt_logprobs: per prompt position (None at the first), token id -> its entry."""


class CompletionResponse(ResponseFields):
    object: Literal["text_completion"] = "text_completion"
    choices: list[CompletionChoice]
    system_fingerprint: str | None = None


class FunctionCallOut(ResponseModel):
    name: str
    arguments: str


class ToolCallOut(ResponseModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCallOut


class AssistantMessage(ResponseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None
    reasoning_content: str | None = None
    """The model's thinking (`<think> ... </think>`), for templates that think; None otherwise."""
    tool_calls: list[ToolCallOut] = Field(default_factory=list)


class ChatChoice(ChoiceFields):
    message: AssistantMessage
    logprobs: ChatLogprobs | None = None


class ChatCompletionResponse(ResponseFields):
    object: Literal["chat.completion"] = "chat.completion"
    choices: list[ChatChoice]
    system_fingerprint: str | None = None


class DeltaFunctionCall(ResponseModel):
    name: str | None = None
    arguments: str | None = None


class DeltaToolCall(ResponseModel):
    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: DeltaFunctionCall


class DeltaMessage(ResponseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[DeltaToolCall] | None = None


class ChatChunkChoice(ChoiceFields):
    delta: DeltaMessage
    logprobs: ChatLogprobs | None = None


class ChatCompletionChunk(ResponseFields):
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    choices: list[ChatChunkChoice]


class CompletionChunk(ResponseFields):
    object: Literal["text_completion"] = "text_completion"
    choices: list[CompletionChoice]


class DraftCheckOut(ResponseModel):
    """What the forward that committed a drafted block found (decoder=verified), in output positions."""

    accepted_positions: list[int]
    """The drafts it kept (the leading checked positions)."""
    rejected_positions: list[int]
    """The drafts it did not keep: the first differed from the causal path, the rest were drafted after it and
    are drafted again; empty when every checked draft was kept."""
    rejected_token_ids: list[int]
    """The rejected drafts' tokens, in the order of `rejected_positions`."""
    rejected_tokens: list[str] | None
    """Their texts (null without a tokenizer)."""
    causal_position: int | None
    """Where the causal path's token replaced the first rejected draft (its token is in the step's `token_ids`);
    null when none was rejected."""


class DenoisingStepOut(ResponseModel):
    """One denoising step of one choice (`stream_options.include_denoising`), in output positions: 0 is the
    choice's first generated token."""

    index: int
    """The choice."""
    block: int
    """The block's index among the choice's generated blocks, from 0."""
    step: int
    """The step's number within its block, from 1."""
    block_start: int
    block_end: int
    """The block's generated positions are [block_start, block_end) (the first block may be shorter: the
    prompt's tail fills its start)."""
    positions: list[int]
    """The positions this step decided (or, with decoder edit, rewrote)."""
    token_ids: list[int]
    """Their tokens, in the order of `positions`."""
    tokens: list[str] | None
    """Each token's text, special tokens spelled out (null without a tokenizer)."""
    check: DraftCheckOut | None = None
    """decoder=verified: on the entry that reports the causal check of the block's draft (its `positions` are
    then the kept drafts and the causal token); null for a denoising step."""


class ChatCompletionDenoisingChunk(ChatCompletionChunk):
    """A chunk of the denoising extension: `choices` is empty."""

    denoising: list[DenoisingStepOut]


class CompletionDenoisingChunk(CompletionChunk):
    """A chunk of the denoising extension: `choices` is empty."""

    denoising: list[DenoisingStepOut]


class ModelCard(ResponseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "diffuserve"
    root: str
    parent: str | None = None
    max_model_len: int


class ModelList(ResponseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class TokenizeResponse(ResponseModel):
    count: int
    max_model_len: int
    tokens: list[int]


class DetokenizeResponse(ResponseModel):
    prompt: str


class VersionResponse(ResponseModel):
    version: str


class DecodingDefaults(ResponseModel):
    temperature: float
    decoder: str
    threshold: float


class ConsoleConfig(ResponseModel):
    """What the web console needs to know of the served model (GET /console/config)."""

    model: str
    max_model_len: int
    block_length: int
    decoders: list[str]
    defaults: DecodingDefaults
    """The knobs a request that sets none is decoded with (the model's generation config, else built in)."""
    api_key_required: bool


class ErrorInfo(ResponseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(ResponseModel):
    error: ErrorInfo
