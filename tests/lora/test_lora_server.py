"""Adapters and weight updates over HTTP with the official `openai` client: `/v1/models` lists adapters with
their base as `parent`, the `model` field selects one (the same text as the offline API with that adapter), an
unknown model is a 404 naming the served ones, `/v1/load_lora_adapter` / `/v1/unload_lora_adapter` with vLLM's
bodies (a bad adapter: one 400, and the server keeps serving; in use: 409), and `/update_weights_from_disk`
(SGLang's body) with requests in flight: each finishes on the weights it started with, later ones are served by
the new weights (equal to a fresh engine on them)."""

from __future__ import annotations

import asyncio

import openai
import pytest

from diffuserve import LLM, LoRARequest, SamplingParams
from diffuserve.server.config import ServerConfig
from tests.conftest import tiny_checkpoint
from tests.lora.adapters import random_adapter
from tests.server.conftest import LiveServer

BASE = "tiny"
SHAPES = {
    "model.layers.0.self_attn.q_proj": (64, 64),
    "model.layers.0.self_attn.v_proj": (64, 32),
    "model.layers.0.mlp.up_proj": (64, 128),
    "model.layers.1.mlp.shared_expert.down_proj": (48, 64),
}


@pytest.fixture(scope="module")
def setup(tmp_path_factory, single_threaded_torch):
    root = tmp_path_factory.mktemp("lora-server")
    base, other = tiny_checkpoint(root, "base"), tiny_checkpoint(root, "other", seed=7)
    adapters = [random_adapter(root / f"a{i}", SHAPES, seed=i, std=0.3) for i in range(2)]
    config = ServerConfig(served_model_name=BASE)
    server = LiveServer(
        base, config, enable_lora=True, max_loras=2, max_lora_rank=4, lora_modules=[f"sql={adapters[0]}"]
    )
    yield server.start(), base, other, adapters
    server.stop()


def _offline(model_dir, prompt: str, lora: LoRARequest | None = None) -> str:
    llm = LLM(str(model_dir), enable_lora=lora is not None, max_lora_rank=4)
    return llm.generate(prompt, SamplingParams(max_tokens=12, temperature=0.0), lora_request=lora)[0].outputs[0].text


def _complete(client: openai.OpenAI, model: str, prompt: str) -> str:
    return client.completions.create(model=model, prompt=prompt, max_tokens=12, temperature=0.0).choices[0].text


def test_models_selection_load_and_unload(setup):
    server, base, _, adapters = setup
    client = server.client()
    cards = {card.id: card for card in client.models.list().data}
    assert set(cards) == {BASE, "sql"} and cards["sql"].parent == BASE and cards["sql"].root == str(adapters[0])
    prompt = "hello adapters"
    with_sql = _complete(client, "sql", prompt)
    assert with_sql == _offline(base, prompt, LoRARequest("sql", 1, str(adapters[0])))
    assert _complete(client, BASE, prompt) == _offline(base, prompt) != with_sql
    chat = client.chat.completions.create(model="sql", messages=[{"role": "user", "content": "hi"}], max_tokens=4)
    assert chat.model == "sql" and client.models.retrieve("sql").parent == BASE
    with pytest.raises(openai.NotFoundError) as missing:
        _complete(client, "nope", prompt)
    assert "'nope' does not exist; this server serves 'tiny', 'sql'" in missing.value.message
    bad = server.post("/v1/load_lora_adapter", {"lora_name": "bad", "lora_path": str(base)})
    assert bad.status_code == 400 and "has no adapter_config.json" in bad.json()["error"]["message"]
    loaded = server.post("/v1/load_lora_adapter", {"lora_name": "chat", "lora_path": str(adapters[1])})
    assert loaded.status_code == 200, loaded.text
    assert _complete(client, "chat", prompt) == _offline(base, prompt, LoRARequest("chat", 1, str(adapters[1])))
    full = server.post("/v1/load_lora_adapter", {"lora_name": "third", "lora_path": str(adapters[1])})
    assert full.status_code == 400 and "the limit (max_loras); unload one or restart with --max-loras 3" in full.text
    assert server.post("/v1/unload_lora_adapter", {"lora_name": "chat"}).status_code == 200
    unknown = server.post("/v1/unload_lora_adapter", {"lora_name": "chat"})
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "model_not_found"
    assert {card.id for card in client.models.list().data} == {BASE, "sql"}
    assert _complete(client, BASE, prompt) == _offline(base, prompt)  # still serving


def test_unload_in_use_is_refused(setup):
    server = setup[0]

    async def run() -> int:
        client = server.async_client()
        request = asyncio.create_task(
            client.completions.create(model="sql", prompt="a long one", max_tokens=160, extra_body={"ignore_eos": True})
        )
        await asyncio.to_thread(server.wait_for, lambda: server.engine.scheduler.running)
        status = (await asyncio.to_thread(server.post, "/v1/unload_lora_adapter", {"lora_name": "sql"})).status_code
        await request
        return status

    assert asyncio.run(run()) == 409
    assert "sql" in server.engine.adapters.loaded


def test_update_weights_from_disk_with_requests_in_flight(setup):
    server, base, other, _ = setup
    prompt, long = "update me", SamplingParams(max_tokens=96, temperature=0.0, ignore_eos=True)

    async def run() -> tuple[str, bool, int, str]:
        client = server.async_client()
        old = asyncio.create_task(
            client.completions.create(
                model=BASE, prompt=prompt, max_tokens=96, temperature=0.0, extra_body={"ignore_eos": True}
            )
        )
        await asyncio.to_thread(server.wait_for, lambda: server.engine.scheduler.running)
        update = asyncio.create_task(
            asyncio.to_thread(server.post, "/update_weights_from_disk", {"model_path": str(other)})
        )
        await asyncio.to_thread(server.wait_for, lambda: server.serving.bridge.num_held)  # waiting for `old`
        new = await client.completions.create(model=BASE, prompt=prompt, max_tokens=12, temperature=0.0)
        status = (await update).status_code
        return (await old).choices[0].text, old.done(), status, new.choices[0].text

    old_text, old_done_first, status, new_text = asyncio.run(run())
    assert status == 200 and old_done_first
    assert old_text == LLM(str(base)).generate(prompt, long)[0].outputs[0].text  # all on the old weights
    assert new_text == _offline(other, prompt) != _offline(base, prompt)  # all on the new ones
    assert _complete(server.client(), BASE, prompt) == new_text
    back = server.post("/update_weights_from_disk", {"model_path": str(base)})
    assert back.json() == {"success": True, "message": f"Succeeded to update model weights from {base}"}
    bad = server.post("/update_weights_from_disk", {"model_path": str(base), "load_format": "pt"})
    assert bad.status_code == 400 and "load_format: 'pt' is not supported" in bad.text
