"""The bundled default model is a tiny Clover (`clover_moe` in the published layer pattern), loads, and still
solves its held-out tasks at its default decoding: a floor that a broken engine or checkpoint falls through."""

from __future__ import annotations

import io
import json
import logging

import pytest

from diffuserve import LLM, SamplingParams
from diffuserve.cli.main import main
from diffuserve.eval.harness import evaluate
from diffuserve.eval.tasks import heldout_examples
from diffuserve.model.default_model import DEFAULT_MODEL_DIR
from diffuserve.model.families.clover_moe.config import hybrid_args
from diffuserve.model.hub import resolve_model
from diffuserve.model.loader import load_model
from diffuserve.structured_outputs import StructuredOutputsParams

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


def test_bundled_model_is_a_tiny_clover(caplog):
    """3 Gated DeltaNet layers then 1 gated attention layer, routed experts plus a shared expert, the
    block-diffusion GDN tensors; it loads without a warning."""
    config = json.loads((DEFAULT_MODEL_DIR / "config.json").read_text())
    assert (config["architectures"], config["model_type"]) == (["CloverMoeModelLM"], "clover_moe")
    with caplog.at_level(logging.WARNING):
        args, model = load_model(DEFAULT_MODEL_DIR)
    assert caplog.records == []
    hybrid = hybrid_args(args)
    assert [hybrid.is_gdn(i) for i in range(args.num_layers)] == [True, True, True, False]
    assert model.has_diffusion and config["shared_expert_intermediate_size"] > 0


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


def test_bundled_model_answers_a_json_request_as_it_does_free():
    """Asked for JSON (`27+15 in JSON`, a format it was trained on), the answer under a `{"answer": integer}`
    schema is the one it writes unconstrained."""
    llm = LLM(resolve_model(None))
    schema = {"type": "object", "properties": {"answer": {"type": "integer"}}, "required": ["answer"]}
    constrained = SamplingParams(max_tokens=24, structured_outputs=StructuredOutputsParams(json=schema))
    messages = [{"role": "user", "content": "27+15 in JSON"}]
    free, forced = llm.chat(messages).outputs[0], llm.chat(messages, constrained).outputs[0]
    assert json.loads(forced.text) == json.loads(free.text) == {"answer": 42}


def test_bundled_model_keeps_answering_in_a_chat(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture):
    """`diffuserve chat` sends the history back with each message: the second and third questions are answered as
    the first (the model bundled before, trained on single questions, answered `Sort 7 3 9 1 5` after `42` with
    `1k5uuq`). The sort has 5 digits: `Sort 7 3 9 1 5 2` is a sorting error of this model even asked alone
    (`1 2 4 5 7 9`, as the model before it)."""
    monkeypatch.setattr("sys.stdin", io.StringIO("What is 27+15?\nSort 7 3 9 1 5\nReverse hello\n\n"))
    assert main(["chat"]) == 0
    assert capsys.readouterr().out.splitlines() == ["42", "1 3 5 7 9", "olleh"]
