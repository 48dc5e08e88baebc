"""Documented request fields, each checked against what it must change: the chat template's inputs
(`chat_template_kwargs`, `add_generation_prompt`, `continue_final_message`), `skip_special_tokens`, and the
per-completion seeds of `n > 1` (completion i uses seed + i).

A chat request is checked by rendering the expected prompt here, by hand, and sending its token ids to
/v1/completions: at temperature 0 both answers (and prompt token counts) agree only if the server rendered
exactly that prompt.
"""

from __future__ import annotations

import pytest

from diffuserve.reference.byte_tokenizer import CHATML_TEMPLATE, SPECIAL_TOKENS
from tests.server.conftest import MODEL_NAME, LiveServer

GREEDY = {"temperature": 0, "max_tokens": 8}
FREE = {"ignore_eos": True}
HI = [{"role": "user", "content": "hi"}]


def _chat_matches_prompt(server: LiveServer, messages: list[dict], expected_prompt: str, **fields) -> None:
    """The chat answer equals the completion of `expected_prompt`, rendered by hand."""
    client = server.client()
    chat = client.chat.completions.create(model=MODEL_NAME, messages=messages, **GREEDY, extra_body={**FREE, **fields})
    token_ids = server.serving.tokenizer.encode(expected_prompt, add_special_tokens=False)
    completion = client.completions.create(model=MODEL_NAME, prompt=token_ids, **GREEDY, extra_body=FREE)
    assert chat.usage.prompt_tokens == len(token_ids), "the server rendered another prompt"
    assert chat.choices[0].message.content == completion.choices[0].text


def test_add_generation_prompt_false_leaves_out_the_assistant_header(live_server: LiveServer):
    _chat_matches_prompt(live_server, HI, "<|im_start|>user\nhi<|im_end|>\n", add_generation_prompt=False)
    _chat_matches_prompt(live_server, HI, "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")


def test_continue_final_message_extends_the_last_assistant_turn(live_server: LiveServer):
    messages = [*HI, {"role": "assistant", "content": "Once upon"}]
    _chat_matches_prompt(
        live_server,
        messages,
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nOnce upon",
        add_generation_prompt=False,
        continue_final_message=True,
    )


def test_chat_template_kwargs_reach_the_template(live_server: LiveServer, monkeypatch):
    # A template with one variable of its own; the shipped ChatML template has none.
    template = "{% if persona %}<|im_start|>system\nYou are a {{ persona }}.<|im_end|>\n{% endif %}" + CHATML_TEMPLATE
    monkeypatch.setattr(live_server.serving.tokenizer.hf, "chat_template", template)
    header = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    _chat_matches_prompt(
        live_server,
        HI,
        "<|im_start|>system\nYou are a pirate.<|im_end|>\n" + header,
        chat_template_kwargs={"persona": "pirate"},
    )
    _chat_matches_prompt(live_server, HI, header)


def _completion_texts(server: LiveServer, extra: dict | None = None, **fields) -> list[str]:
    response = server.client().completions.create(
        model=MODEL_NAME, prompt="hi", max_tokens=32, temperature=5.0, extra_body={**FREE, **(extra or {})}, **fields
    )
    return [c.text for c in response.choices]


def test_skip_special_tokens(live_server: LiveServer):
    # Sampled gibberish holds a special token (e.g. <|endoftext|>, kept by ignore_eos) for some seed: find one.
    for seed in range(16):
        [raw] = _completion_texts(live_server, seed=seed, extra={"skip_special_tokens": False})
        if any(token in raw for token in SPECIAL_TOKENS):
            break
    else:
        pytest.fail("no seed gave a special token with skip_special_tokens=false")
    [skipped] = _completion_texts(live_server, seed=seed, extra={"skip_special_tokens": True})
    assert not any(token in skipped for token in SPECIAL_TOKENS) and skipped != raw
    assert _completion_texts(live_server, seed=seed) == [skipped], "skip_special_tokens defaults to true"


def test_completion_i_of_n_uses_seed_plus_i(live_server: LiveServer):
    together = _completion_texts(live_server, n=3, seed=77)
    apart = [text for i in range(3) for text in _completion_texts(live_server, seed=77 + i)]
    assert together == apart
    assert len(set(together)) == 3, "the n completions are distinct draws"
