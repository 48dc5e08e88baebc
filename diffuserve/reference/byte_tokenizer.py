"""Writes a byte-level tokenizer (tokenizer.json + tokenizer_config.json with a ChatML chat template).

Ids 0..255 are the bytes, then the special tokens, then filler tokens up to the model's vocabulary size, so
every id a random model can emit decodes. Used by random checkpoints in tests, benchmarks and demos; other
families pass their own special tokens and tokenizer_config fields (e.g. LLaDA2's, in llada2_checkpoint).
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from tokenizers.pre_tokenizers import ByteLevel

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|MASK|>")
CHATML_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def special_token_ids(special_tokens: tuple[str, ...] = SPECIAL_TOKENS) -> dict[str, int]:
    return {token: 256 + i for i, token in enumerate(special_tokens)}


def write_byte_tokenizer(
    out_dir: str | Path,
    vocab_size: int,
    special_tokens: tuple[str, ...] = SPECIAL_TOKENS,
    tokenizer_config: dict | None = None,
) -> dict[str, int]:
    """Writes the tokenizer files; returns the special token ids by name. `tokenizer_config` replaces fields
    of the default tokenizer_config.json (ChatML template, `<|endoftext|>` EOS, `<|MASK|>` mask)."""
    if vocab_size < 256 + len(special_tokens):
        minimum = 256 + len(special_tokens)
        raise ValueError(f"vocab_size: {vocab_size} is too small for a byte tokenizer; need >= {minimum}")
    out = Path(out_dir)
    byte_symbols = list(ByteLevel.alphabet())
    byte_symbols.sort(key=lambda s: _byte_of(s))
    tokenizer = Tokenizer(models.BPE(vocab={s: i for i, s in enumerate(byte_symbols)}, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(list(special_tokens))
    tokenizer.add_tokens([f"<|x{i}|>" for i in range(256 + len(special_tokens), vocab_size)])
    tokenizer.save(str(out / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": "<|endoftext|>",
        "pad_token": "<|endoftext|>",
        "mask_token": "<|MASK|>",
        "chat_template": CHATML_TEMPLATE,
        "model_max_length": 1 << 20,
        "clean_up_tokenization_spaces": False,
        **(tokenizer_config or {}),
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    return special_token_ids(special_tokens)


def _byte_of(symbol: str) -> int:
    """The byte a ByteLevel alphabet symbol stands for (GPT-2's printable remapping)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    remapped = [b for b in range(256) if b not in printable]
    code = ord(symbol)
    return code if code in printable else remapped[code - 256]
