"""The outputs a request's stream is handed are snapshots of their step: the engine grows its completions' token
and logprob lists in place step after step (engine/completion.py), and the bridge copies them as it hands an
output over (server/bridge.py), so an output read after later steps still shows its own step's tokens."""

from __future__ import annotations

import pytest

from diffuserve.core.outputs import RequestOutput
from diffuserve.server.output_stream import OutputStream
from tests.server.conftest import MODEL_NAME


@pytest.fixture
def handed(monkeypatch: pytest.MonkeyPatch) -> list[RequestOutput]:
    """Every output the streams were handed, as handed (read only after the request ends)."""
    kept: list[RequestOutput] = []
    put = OutputStream.put

    def keeping_put(self: OutputStream, item: object) -> None:
        if isinstance(item, RequestOutput):
            kept.append(item)
        put(self, item)

    monkeypatch.setattr(OutputStream, "put", keeping_put)
    return kept


def test_each_handed_output_keeps_its_own_steps_tokens_and_logprobs(live_server, handed):
    stream = live_server.client().completions.create(
        model=MODEL_NAME,
        prompt="Once upon 4",
        max_tokens=24,
        n=2,
        temperature=0.0,
        logprobs=1,
        stream=True,
        extra_body={"ignore_eos": True, "decoder": "fixed", "steps": 4},
    )
    assert sum(len(choice.text) for chunk in stream for choice in chunk.choices) > 0
    tokens = [sum(len(c.token_ids) for c in out.outputs) for out in handed]
    assert len(handed) > 2 and tokens == sorted(tokens) and tokens[0] < tokens[-1] == 48
    logprobs = [sum(len(c.logprobs or ()) for c in out.outputs) for out in handed]
    assert logprobs == sorted(logprobs) and logprobs[0] < logprobs[-1] == 48
