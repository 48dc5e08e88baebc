"""A server whose outputs are made beside the next forward (`--overlap-outputs`, engine/output_overlap.py) answers
the official `openai` client as the plain server does: the same texts, streamed or not, stop strings and n
included, and its engine loop flushes the last step's held outputs."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from diffuserve.server.config import ServerConfig
from tests.server.conftest import MODEL_NAME, LiveServer


@pytest.fixture(scope="module")
def overlapped(tiny_model_dir: Path, single_threaded_torch: None) -> Iterator[LiveServer]:
    config = ServerConfig(served_model_name=MODEL_NAME, max_n=4)
    server = LiveServer(tiny_model_dir, config, num_pages=256, max_model_len=192, overlap_outputs=True).start()
    yield server
    server.stop()


def test_overlapped_outputs_are_the_plain_servers(overlapped: LiveServer, live_server: LiveServer):
    args = {"model": MODEL_NAME, "prompt": "hello there", "max_tokens": 16, "n": 2, "seed": 5, "temperature": 0.8}
    want = live_server.client().completions.create(**args)
    client = overlapped.client()
    got = client.completions.create(**args)
    assert [c.text for c in got.choices] == [c.text for c in want.choices]
    streamed = ["", ""]
    for chunk in client.completions.create(**args, stream=True):
        for choice in chunk.choices:
            streamed[choice.index] += choice.text
    assert streamed == [c.text for c in want.choices]
    stop = want.choices[0].text[5:7]  # a stop string the first completion reaches
    stopped = client.completions.create(**args, stop=[stop])
    assert stopped.choices[0].text == want.choices[0].text[: want.choices[0].text.index(stop)]
    assert stopped.choices[0].finish_reason == "stop"
    assert stopped == live_server.client().completions.create(**args, stop=[stop]).model_copy(
        update={"id": stopped.id, "created": stopped.created}
    )
    overlapped.wait_for(lambda: not overlapped.engine.has_unfinished_requests())
    assert overlapped.engine.pool.usage == 0
