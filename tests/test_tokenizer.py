"""The tokenizer wrapper: never runs (or asks to run) a checkpoint's code; knows its special tokens and which of
them the chat template emits; encodes spelled special tokens in chat text as plain text; and bounds the tokens of
a text from its length alone, a bound that real encodings never break."""

from __future__ import annotations

import builtins
import json
import random
import sys
from pathlib import Path

import pytest

from diffuserve.reference.byte_tokenizer import SPECIAL_TOKENS, write_byte_tokenizer
from diffuserve.text.tokenizer import Tokenizer
from diffuserve.text.tokenizer_bounds import chars_per_token_bound

AUTO_MAP = {"AutoConfig": "configuration_sdar.SDARConfig", "AutoModelForCausalLM": "modeling_sdar.SDARForCausalLM"}


def _tokenizer_dir(root: Path, special_tokens: tuple[str, ...] = SPECIAL_TOKENS, **config: object) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    write_byte_tokenizer(root, 320, special_tokens=special_tokens)
    (root / "config.json").write_text(json.dumps({"model_type": "sdar", **config}))
    return root


@pytest.fixture()
def no_prompts(monkeypatch):
    """Any interactive question (transformers' "Do you wish to run the custom code?") fails the test."""

    def refuse(prompt: str = "") -> str:
        raise AssertionError(f"asked interactively: {prompt[:80]}")

    monkeypatch.setattr(builtins, "input", refuse)


@pytest.mark.parametrize("drop_class", [False, True], ids=["tokenizer_class", "no_tokenizer_class"])
def test_auto_map_in_config_never_prompts(tmp_path: Path, no_prompts, drop_class: bool):
    model_dir = _tokenizer_dir(tmp_path / "m", auto_map=AUTO_MAP, architectures=["SDARForCausalLM"])
    if drop_class:
        config = json.loads((model_dir / "tokenizer_config.json").read_text())
        del config["tokenizer_class"]
        (model_dir / "tokenizer_config.json").write_text(json.dumps(config))
    assert Tokenizer(model_dir).encode("hi") == [104, 105]


def test_a_tokenizer_that_needs_remote_code_is_a_one_line_error(tmp_path: Path, no_prompts):
    model_dir = _tokenizer_dir(tmp_path / "m", auto_map=AUTO_MAP)
    config = json.loads((model_dir / "tokenizer_config.json").read_text())
    config.update(
        tokenizer_class="SDARTokenizer", auto_map={"AutoTokenizer": ["tokenization_sdar.SDARTokenizer", None]}
    )
    (model_dir / "tokenizer_config.json").write_text(json.dumps(config))
    (model_dir / "tokenizer.json").unlink()
    with pytest.raises(ValueError, match="never runs") as error:
        Tokenizer(model_dir)
    assert "\n" not in str(error.value) and str(model_dir) in str(error.value)


def test_special_ids_and_the_templates_own(tmp_path: Path):
    tokenizer = Tokenizer(_tokenizer_dir(tmp_path / "m", (*SPECIAL_TOKENS, "<|fim|>")))
    ids = {token: tokenizer.hf.convert_tokens_to_ids(token) for token in (*SPECIAL_TOKENS, "<|fim|>")}
    assert tokenizer.special_ids == frozenset(ids.values())
    assert tokenizer.template_special_ids == {ids["<|im_start|>"], ids["<|im_end|>"]}


def test_spelled_special_tokens_in_chat_text_are_plain_text(tmp_path: Path):
    tokenizer = Tokenizer(_tokenizer_dir(tmp_path / "m"))
    reference_tokenizer = Tokenizer(tmp_path / "m")  # split_special_tokens=True changes the tokenizer's state
    content = "a<|im_end|>b<|MASK|>"
    messages = [{"role": "user", "content": content}]
    rendered = tokenizer.apply_chat_template(messages)
    reference = tokenizer.apply_chat_template([{"role": "user", "content": tokenizer.defuse(content)}])
    start, end = tokenizer.hf.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>"])
    plain = reference_tokenizer.hf(content, add_special_tokens=False, split_special_tokens=True)["input_ids"]
    expected = [start, *b"user\n", *plain, end, *b"\n", start, *b"assistant\n"]
    assert plain == list(content.encode())  # a byte tokenizer: plain text is its bytes
    assert tokenizer.encode_rendered(rendered, reference) == expected
    assert tokenizer.encode(rendered, add_special_tokens=False) != expected  # what plain encoding would give


def test_a_template_that_changes_text_cannot_be_told_apart(tmp_path: Path):
    tokenizer = Tokenizer(_tokenizer_dir(tmp_path / "m"))
    content = " <|im_end|> "
    with pytest.raises(ValueError, match="changes message text"):
        tokenizer.encode_rendered(content.strip(), tokenizer.defuse(content))


def test_length_bound_of_the_byte_tokenizer_holds(tmp_path: Path):
    tokenizer = Tokenizer(_tokenizer_dir(tmp_path / "m"))
    assert tokenizer.chars_per_token == len("<|endoftext|>")  # the longest token: an added one
    rng = random.Random(0)
    alphabet = ["a", " ", "é", "日", "\n", "<|x300|>", "<|im_end|>", "🙂"]
    for _ in range(200):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randrange(1, 200)))
        assert len(tokenizer.encode(text, add_special_tokens=False)) >= tokenizer.min_num_tokens(len(text))


BYTE_LEVEL = {"type": "BPE", "vocab": {}, "merges": []}


def _spec(normalizer=None, pre_tokenizer=None, model=None) -> dict:
    from diffuserve.text.tokenizer_bounds import _byte_level_alphabet

    vocab = {symbol: i for i, symbol in enumerate(_byte_level_alphabet())} | {"abcdef": 300}
    return {
        "normalizer": normalizer,
        "pre_tokenizer": pre_tokenizer or {"type": "ByteLevel"},
        "model": model or {**BYTE_LEVEL, "vocab": vocab},
        "added_tokens": [{"content": "<s>"}],
    }


@pytest.mark.parametrize(
    ("spec", "bound"),
    [
        (_spec(), 6),
        (_spec({"type": "NFC"}), 24),
        (_spec({"type": "Sequence", "normalizers": [{"type": "NFD"}, {"type": "Lowercase"}]}), 6),
        (_spec({"type": "Replace", "pattern": {"String": "  "}, "content": " "}), 12),
        (_spec({"type": "Replace", "pattern": {"Regex": "\\s+"}, "content": " "}), None),
        (_spec({"type": "Strip"}), None),
        (_spec(pre_tokenizer={"type": "Whitespace"}), None),
        (_spec(pre_tokenizer={"type": "Split", "behavior": "Removed"}), None),
        (
            _spec(
                pre_tokenizer={
                    "type": "Sequence",
                    "pretokenizers": [{"type": "Split", "behavior": "Isolated"}, {"type": "ByteLevel"}],
                }
            ),
            6,
        ),
        (_spec(model={"type": "WordPiece", "vocab": {"a": 0}}), None),
        (_spec(model={"type": "BPE", "vocab": {"a": 0}}), None),  # unknown bytes would be dropped
    ],
    ids=lambda v: str(v)[:40],
)
def test_length_bound_rules(spec: dict, bound: float | None):
    assert chars_per_token_bound(spec) == bound


@pytest.mark.parametrize("skip_special_tokens", [True, False])
def test_decode_equals_transformers_decode(tmp_path: Path, skip_special_tokens: bool):
    """The wrapper's decode (the Rust tokenizer's, where transformers' adds nothing) is transformers' decode, on
    random ids mixing bytes, merges and special tokens."""
    tokenizer = Tokenizer(_tokenizer_dir(tmp_path / "m"))
    assert tokenizer._rust_decode is not None  # the shortcut is what is tested here
    rng = random.Random(4)
    for _ in range(200):
        ids = [rng.randrange(tokenizer.vocab_size) for _ in range(rng.randrange(0, 12))]
        expected = tokenizer.hf.decode(ids, skip_special_tokens=skip_special_tokens)
        assert tokenizer.decode(ids, skip_special_tokens) == expected


def test_decode_needs_no_transformers_5_module(tmp_path: Path, monkeypatch):
    """transformers 4.x has no `transformers.tokenization_utils_tokenizers` (5.x's home of the tokenizers-backed
    class): with that module unimportable, the decode shortcut is still found and decoding still works."""
    tokenizer = Tokenizer(_tokenizer_dir(tmp_path / "m"))
    monkeypatch.setitem(sys.modules, "transformers.tokenization_utils_tokenizers", None)  # import -> ImportError
    assert tokenizer._rust_decode is not None
    ids = [104, 105, *range(256, 262)]
    assert tokenizer.decode(ids, skip_special_tokens=False) == tokenizer.hf.decode(ids, skip_special_tokens=False)
