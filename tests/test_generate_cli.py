"""`diffuserve generate` on the bundled model (which knows only its chat format): a bare prompt goes through the
chat template, as `--chat` does, and gets the model's answer; a prompt already templated by hand is sent as it
is (and gets the same answer); `--no-chat` sends the bare text as it is."""

from __future__ import annotations

import json

from diffuserve.cli.main import main

CHATML = "<|im_start|>user\nWhat is 27+15?<|im_end|>\n<|im_start|>assistant\n"


def _generate(capsys, *argv: str) -> dict:
    assert main(["generate", "--json", "--max-tokens", "8", *argv]) == 0
    return json.loads(capsys.readouterr().out.splitlines()[-1])


def test_a_bare_prompt_is_templated_when_the_model_has_a_chat_template(capsys):
    default = _generate(capsys, "What is 27+15?")
    assert default["text"] == "42"
    assert _generate(capsys, "--chat", "What is 27+15?")["token_ids"] == default["token_ids"]
    assert _generate(capsys, CHATML)["token_ids"] == default["token_ids"]  # templated by hand: not twice
    bare = _generate(capsys, "--no-chat", "What is 27+15?")
    assert bare["token_ids"] != default["token_ids"]
