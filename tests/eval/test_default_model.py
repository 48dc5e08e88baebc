"""The bundled default model loads and still solves its held-out tasks at its default decoding: a floor that a
broken engine or checkpoint falls through."""

from __future__ import annotations

import json

from diffuserve import LLM, SamplingParams
from diffuserve.default_model import DEFAULT_MODEL_DIR, resolve_model
from diffuserve.eval.harness import evaluate
from diffuserve.eval.tasks import heldout_examples

ACCURACY_FLOOR = 0.8
"""Well below the ~0.9+ the model reaches on the full held-out set, so sampling noise never trips it."""


def test_bundled_model_is_complete_and_small():
    files = {p.name: p.stat().st_size for p in DEFAULT_MODEL_DIR.iterdir()}
    for name in (
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "generation_config.json",
    ):
        assert name in files, name
    assert sum(files.values()) <= 25 * 2**20
    assert json.loads((DEFAULT_MODEL_DIR / "tokenizer_config.json").read_text())["chat_template"]
    assert resolve_model(None) == str(DEFAULT_MODEL_DIR)


def test_bundled_model_solves_heldout_tasks_in_parallel():
    llm = LLM(resolve_model(None))
    result = evaluate(llm, heldout_examples(8, seed=7), SamplingParams())
    assert result.accuracy >= ACCURACY_FLOOR, result
    for task, accuracy in result.accuracy_by_task.items():
        assert accuracy >= 0.5, (task, result)
    assert result.tokens_per_forward > 1.0, result
    chat = llm.chat([{"role": "user", "content": "Reverse abc"}])
    assert chat.outputs[0].text == "cba"
    assert chat.outputs[0].finish_reason == "stop"
