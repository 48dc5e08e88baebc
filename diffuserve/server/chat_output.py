"""A chat reply's text as OpenAI's assistant message: reasoning, content and tool calls, whole or as stream
deltas, and the finish reason ("tool_calls" when a reply that stopped by itself made calls).

The streamed deltas concatenate to the whole message's fields: each delta is the growth of a parse of the text
so far, with the parts that may still change (a half-written `</think>` or tool call) held back until they
settle or the reply ends. Knows nothing of the engine or HTTP.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from diffuserve.server.reasoning import split_reasoning
from diffuserve.server.response_models import (
    AssistantMessage,
    DeltaFunctionCall,
    DeltaMessage,
    DeltaToolCall,
    FunctionCallOut,
    ToolCallOut,
)
from diffuserve.server.tool_calls import call_id
from diffuserve.text.tool_format import ParsedCall, parse_calls


@dataclass(frozen=True)
class ChatOutputFormat:
    thinking: bool = False
    """Split `<think> ... </think>` off into reasoning_content."""
    tools: bool = False
    """Parse tool calls out of the content."""
    parallel_tool_calls: bool = True
    """false: only a reply's first call counts."""

    def parse(self, text: str, final: bool = True) -> tuple[str | None, str, list[ParsedCall]]:
        """(reasoning or None when not thinking, content, tool calls)."""
        reasoning, content = split_reasoning(text, final) if self.thinking else (None, text)
        calls: list[ParsedCall] = []
        if self.tools:
            content, calls = parse_calls(content, final)
            # Whitespace around calls is not content; stripping a growing text only ever holds back its trailing
            # whitespace, so streamed deltas still add up to the whole.
            content = content.strip()
            if not self.parallel_tool_calls:
                calls = calls[:1]
        return reasoning, content, calls

    def message(self, text: str) -> AssistantMessage:
        reasoning, content, calls = self.parse(text)
        tool_calls = [
            ToolCallOut(id=call_id(), function=FunctionCallOut(name=c.name, arguments=c.arguments)) for c in calls
        ]
        return AssistantMessage(
            content=content or (None if calls else ""), reasoning_content=reasoning, tool_calls=tool_calls
        )

    def finish_reason(self, text: str, finish_reason: str | None) -> str | None:
        if finish_reason == "stop" and self.tools and self.parse(text)[2]:
            return "tool_calls"
        return finish_reason


@dataclass
class ChatDeltas:
    """One choice's streaming state: how much of each field was sent."""

    format: ChatOutputFormat
    reasoning_sent: int = 0
    content_sent: int = 0
    calls_sent: list[str] = field(default_factory=list)
    """Ids of the calls sent, in order."""

    def delta(self, text: str, final: bool) -> DeltaMessage | None:
        """What `text` (the reply so far) adds to the deltas already sent; None if nothing."""
        reasoning, content, calls = self.format.parse(text, final)
        new_reasoning = None
        if reasoning is not None and len(reasoning) > self.reasoning_sent:
            new_reasoning, self.reasoning_sent = reasoning[self.reasoning_sent :], len(reasoning)
        new_content = None
        if len(content) > self.content_sent:
            new_content, self.content_sent = content[self.content_sent :], len(content)
        tool_calls = []
        for index in range(len(self.calls_sent), len(calls)):
            self.calls_sent.append(call_id())
            tool_calls.append(
                DeltaToolCall(
                    index=index,
                    id=self.calls_sent[index],
                    type="function",
                    function=DeltaFunctionCall(name=calls[index].name, arguments=calls[index].arguments),
                )
            )
        if new_reasoning is None and new_content is None and not tool_calls:
            return None
        return DeltaMessage(content=new_content, reasoning_content=new_reasoning, tool_calls=tool_calls or None)
