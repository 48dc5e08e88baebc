"""A bounded property-based fuzz over the server's own OpenAPI schema (schemathesis, 100 examples in all).

For every POST endpoint, schemathesis draws requests that fit the published schema (positive: though often not
the server's further rules) and requests that violate it (negative: wrong types, missing fields, out-of-range
values). Whatever comes in, the server must never answer 5xx, every error must be in the OpenAI shape, and a
streamed answer must never carry an error frame. Derandomized, so it is deterministic, and bounded in time: a
48-token context and n <= 2 keep every generation short.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode

from diffuserve.server.config import ServerConfig
from tests.server.conftest import LiveServer

EXAMPLES = {
    ("/v1/completions", GenerationMode.POSITIVE): 25,
    ("/v1/completions", GenerationMode.NEGATIVE): 15,
    ("/v1/chat/completions", GenerationMode.POSITIVE): 25,
    ("/v1/chat/completions", GenerationMode.NEGATIVE): 15,
    ("/tokenize", GenerationMode.POSITIVE): 5,
    ("/tokenize", GenerationMode.NEGATIVE): 5,
    ("/detokenize", GenerationMode.POSITIVE): 5,
    ("/detokenize", GenerationMode.NEGATIVE): 5,
    ("/plan", GenerationMode.POSITIVE): 10,
    ("/plan", GenerationMode.NEGATIVE): 10,
}


@pytest.fixture(scope="module")
def fuzz_server(tiny_model_dir: Path, single_threaded_torch: None):
    server = LiveServer(tiny_model_dir, ServerConfig(max_n=2), num_pages=256, max_num_seqs=8, max_model_len=48)
    yield server.start()
    server.stop()


def _check(response: schemathesis.Response) -> None:
    text = response.content.decode()
    assert response.status_code < 500, text
    if response.status_code >= 400:
        error = json.loads(text)["error"]
        assert set(error) == {"message", "type", "param", "code"} and error["message"], error
    elif response.headers["content-type"][0].startswith("text/event-stream"):
        frames = [line[6:] for line in text.splitlines() if line.startswith("data: ")]
        assert response.stream_cut_short or frames[-1] == "[DONE]"
        assert not any(f != "[DONE]" and "error" in json.loads(f) for f in frames), frames


@pytest.mark.parametrize(("path", "mode"), list(EXAMPLES), ids=[f"{p}-{m.value}" for p, m in EXAMPLES])
def test_fuzzed_requests_never_get_a_5xx(fuzz_server: LiveServer, path: str, mode: GenerationMode):
    operation = schemathesis.openapi.from_dict(fuzz_server.app.openapi())[path]["POST"]

    @settings(
        max_examples=EXAMPLES[path, mode],
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(case=operation.as_strategy(generation_mode=mode))
    def fuzz(case) -> None:
        _check(case.call(base_url=fuzz_server.url, timeout=60))

    fuzz()
    assert fuzz_server.metric("kv_cache_usage_perc") == 0
    assert httpx.get(f"{fuzz_server.url}/health").status_code == 200
