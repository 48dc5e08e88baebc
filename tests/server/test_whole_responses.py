"""A whole (non-streamed) response's stream is handed each engine request's first and finished outputs only, not the
steps between (server/bridge.py, server/output_stream.py): the answer is the streamed one's, and the metrics, which
see every step's output, count the same inter-token latencies for both."""

from __future__ import annotations

from collections import Counter

import pytest

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
def handed_over(monkeypatch: pytest.MonkeyPatch) -> Counter[tuple[str, bool]]:
    """(engine request id, finished) of every output handed to a stream."""
    counts: Counter[tuple[str, bool]] = Counter()
    put = OutputStream.put

    def counting_put(self: OutputStream, item: object) -> None:
        if not isinstance(item, Exception):
            counts[(item.request_id, item.finished)] += 1
        put(self, item)

    monkeypatch.setattr(OutputStream, "put", counting_put)
    return counts


def _streamed_texts(live_server: LiveServer) -> list[str]:
    texts = ["", ""]
    for chunk in live_server.client().completions.create(stream=True, **REQUEST):
        for choice in chunk.choices:
            texts[choice.index] += choice.text
    return texts


def test_a_whole_response_takes_the_first_and_finished_outputs_only(live_server, handed_over):
    itl = live_server.metric("inter_token_latency_seconds_count")
    whole = live_server.client().completions.create(**REQUEST)
    whole_itl = live_server.metric("inter_token_latency_seconds_count") - itl
    assert sorted(handed_over.values()) == [1, 1], handed_over  # one engine request: its first, its finished output
    assert {finished for _, finished in handed_over} == {False, True}
    handed_over.clear()
    itl = live_server.metric("inter_token_latency_seconds_count")
    streamed = _streamed_texts(live_server)
    assert live_server.metric("inter_token_latency_seconds_count") - itl == whole_itl > 2
    assert sum(count for (_, finished), count in handed_over.items() if not finished) > 2  # every step
    assert [choice.text for choice in sorted(whole.choices, key=lambda c: c.index)] == streamed
