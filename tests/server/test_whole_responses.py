"""A whole (non-streamed) response's engine requests ask for their finished outputs only (server/serving.py,
server/bridge.py): the engine makes no text while they run and the stream is told once that each started, then
handed its finished output. The answer is the streamed one's, and the metrics, which read the final-only
requests' progress step by step, count the same latencies for both."""

from __future__ import annotations

import pytest

from diffuserve.engine.completion import Completion
from diffuserve.server.output_stream import OutputStream
from tests.server.conftest import MODEL_NAME, LiveServer

REQUEST = dict(
    model=MODEL_NAME,
    prompt="Once upon 4",
    max_tokens=24,
    n=2,
    temperature=0.0,
    extra_body={"ignore_eos": True, "decoder": "fixed", "steps": 4},
)


@pytest.fixture
def events(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, bool]]:
    """What the streams were given, in order: ("started", False) for each `mark_started`, ("output", finished)
    for each output, ("text", False) for each completion update the engine made."""
    seen: list[tuple[str, bool]] = []
    put, mark_started, update = OutputStream.put, OutputStream.mark_started, Completion.update

    def counting_put(self: OutputStream, item: object) -> None:
        if not isinstance(item, Exception):
            seen.append(("output", item.finished))
        put(self, item)

    def counting_mark_started(self: OutputStream, request_id: str) -> None:
        seen.append(("started", False))
        mark_started(self, request_id)

    def counting_update(self: Completion, *args: object) -> bool:
        seen.append(("text", False))
        return update(self, *args)

    monkeypatch.setattr(OutputStream, "put", counting_put)
    monkeypatch.setattr(OutputStream, "mark_started", counting_mark_started)
    monkeypatch.setattr(Completion, "update", counting_update)
    return seen


def _streamed_texts(live_server: LiveServer) -> list[str]:
    texts = ["", ""]
    for chunk in live_server.client().completions.create(stream=True, **REQUEST):
        for choice in chunk.choices:
            texts[choice.index] += choice.text
    return texts


def _counts(live_server: LiveServer) -> tuple[float, ...]:
    names = ["inter_token_latency_seconds", "time_to_first_token_seconds", "request_queue_time_seconds"]
    return tuple(live_server.metric(f"{name}_count") for name in names)


def test_a_whole_response_is_made_once_and_counted_step_by_step(live_server, events):
    before = _counts(live_server)
    whole = live_server.client().completions.create(**REQUEST)
    whole_counts = [after - b for after, b in zip(_counts(live_server), before)]
    # started once, no text until the finish (one update per completion), then the one finished output
    assert events == [("started", False), ("text", False), ("text", False), ("output", True)], events
    assert live_server.serving.bridge.num_unstarted == 0
    events.clear()
    before = _counts(live_server)
    streamed = _streamed_texts(live_server)
    assert [after - b for after, b in zip(_counts(live_server), before)] == whole_counts
    assert whole_counts[0] > 2 and whole_counts[1:] == [1, 1]
    assert sum(1 for kind, finished in events if kind == "output" and not finished) > 2  # every step
    assert [choice.text for choice in sorted(whole.choices, key=lambda c: c.index)] == streamed
