"""A bounded property-based fuzz of the server on the bundled model, from its own OpenAPI schema (schemathesis,
diffuserve/testing/http_fuzz.py): every operation the schema lists, with requests that fit it and requests that
violate it. Whatever comes in, the answer is a 2xx or a 4xx in the OpenAI error shape, never a 5xx; a stream
never carries an error frame; /health answers 200 after each operation. Derandomized, so deterministic, and
bounded in time: a 48-token context and n <= 2 keep every generation short. scripts/fuzz_http.py runs the same
with a larger budget (its counts are in docs/internals/testing.md)."""

from __future__ import annotations

import pytest

from diffuserve.model.default_model import DEFAULT_MODEL_DIR
from diffuserve.reference.http_fuzz import fuzz, operations
from diffuserve.server.config import ServerConfig
from tests.server.conftest import LiveServer

BUDGET = {"POST /v1/completions": 20, "POST /v1/chat/completions": 20, "POST /plan": 8}
"""Examples per operation and mode; every other operation gets DEFAULT."""
DEFAULT = 4


@pytest.fixture(scope="module")
def fuzz_server(single_threaded_torch: None):
    server = LiveServer(DEFAULT_MODEL_DIR, ServerConfig(max_n=2), num_pages=256, max_num_seqs=8, max_model_len=48)
    yield server.start()
    server.stop()


def test_every_operation_answers_2xx_or_an_openai_4xx(fuzz_server: LiveServer):
    schema = fuzz_server.app.openapi()
    counts = fuzz(schema, fuzz_server.url, BUDGET, DEFAULT)
    assert counts.problems == [], "\n".join(counts.problems)
    assert counts.as_json()["operations"] == len(operations(schema)) >= 12
    assert not any(status >= 500 for status in counts.statuses)
    assert fuzz_server.metric("kv_cache_usage_perc") == 0
