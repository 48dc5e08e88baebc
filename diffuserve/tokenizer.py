"""The model directory's tokenizer and chat template (via transformers' AutoTokenizer, offline).

Owns text <-> token ids and chat formatting; knows nothing of the engine. Special tokens of the chat template
are already in the rendered text, so chat prompts are encoded without adding them again (vLLM's convention).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


class Tokenizer:
    def __init__(self, model_dir: str | Path) -> None:
        from transformers import AutoTokenizer
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()  # transformers warns about our non-HF model_type
        self.hf = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)

    @property
    def vocab_size(self) -> int:
        return len(self.hf)

    @property
    def eos_token_id(self) -> int | None:
        return self.hf.eos_token_id

    @property
    def has_chat_template(self) -> bool:
        return bool(self.hf.chat_template)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(self.hf.encode(text, add_special_tokens=add_special_tokens))

    def decode(self, token_ids: list[int], skip_special_tokens: bool = True) -> str:
        return self.hf.decode(token_ids, skip_special_tokens=skip_special_tokens)

    def apply_chat_template(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
                            **template_kwargs: Any) -> str:
        """Renders a conversation with the model's template; ValueError if the model has none."""
        if not self.has_chat_template:
            raise ValueError("messages: this model has no chat template (tokenizer_config.json `chat_template`); "
                             "use the completions API with a plain prompt")
        return self.hf.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=add_generation_prompt, **template_kwargs
        )

    def encode_chat(self, messages: list[dict[str, Any]], **template_kwargs: Any) -> list[int]:
        return self.encode(self.apply_chat_template(messages, **template_kwargs), add_special_tokens=False)
