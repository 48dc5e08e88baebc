"""How many characters of input text one token can stand for, at most, read from a tokenizer.json: the bound
behind the server's cheap "this prompt cannot fit" check, which runs before any tokenization.

The argument: a BPE model that covers every byte (byte-level, or byte fallback) never drops input, so every
character of the normalized text lies in some token, and a token covers at most as many characters as its
longest vocabulary entry or added token has (a byte-level entry has one character per byte, and a character
is at least one byte). Normalizers may shorten the text by a bounded factor (Unicode composition joins at most
four code points into one, a string replacement shortens by pattern length / replacement length). Anything that
can drop or merge unbounded text (whitespace-splitting pre-tokenizers, strip, accent stripping, unknown-token
merging, regex replacements, other models) gives no bound: None. Knows nothing of transformers or servers.
"""

from __future__ import annotations

from typing import Any

COMPOSITION_FACTOR = 4.0
"""Unicode NFC/NFKC composes at most four code points into one (e.g. Greek alpha with breathing, accent and
iota subscript)."""

SAME_LENGTH_NORMALIZERS = frozenset({"NFD", "NFKD", "Lowercase", "Prepend", "ByteLevel"})
"""Normalizers that never shorten text (character for character, or longer)."""

KEEPING_PRE_TOKENIZERS = frozenset({"ByteLevel", "Metaspace", "Digits", "UnicodeScripts"})
"""Pre-tokenizers that split text without dropping any of it."""

KEEPING_BEHAVIORS = frozenset({"Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous"})
"""Split behaviours that keep the delimiters (`Removed` drops them)."""


def chars_per_token_bound(spec: dict[str, Any]) -> float | None:
    """The most input characters one token can cover, for a tokenizer.json `spec`; None if unbounded."""
    shrink = _normalizer_factor(spec.get("normalizer"))
    model = spec.get("model") or {}
    if shrink is None or not _keeps_text(spec.get("pre_tokenizer")) or not _covers_every_byte(spec, model):
        return None
    longest = max((len(token) for token in model.get("vocab", {})), default=1)
    longest = max([longest, *(len(t.get("content", "")) for t in spec.get("added_tokens", []))])
    return shrink * longest


def _normalizer_factor(normalizer: dict[str, Any] | None) -> float | None:
    if normalizer is None:
        return 1.0
    kind = normalizer.get("type")
    if kind == "Sequence":
        factor = 1.0
        for part in normalizer.get("normalizers", []):
            part_factor = _normalizer_factor(part)
            if part_factor is None:
                return None
            factor *= part_factor
        return factor
    if kind in ("NFC", "NFKC"):
        return COMPOSITION_FACTOR
    if kind in SAME_LENGTH_NORMALIZERS:
        return 1.0
    if kind == "Replace":
        pattern, content = normalizer.get("pattern", {}), normalizer.get("content", "")
        if "String" not in pattern or not content:
            return None  # a regex may match unbounded text; an empty replacement deletes it
        return max(1.0, len(pattern["String"]) / len(content))
    return None


def _keeps_text(pre_tokenizer: dict[str, Any] | None) -> bool:
    if pre_tokenizer is None:
        return True
    kind = pre_tokenizer.get("type")
    if kind == "Sequence":
        return all(_keeps_text(p) for p in pre_tokenizer.get("pretokenizers", []))
    if kind in ("Split", "Punctuation"):
        return pre_tokenizer.get("behavior") in KEEPING_BEHAVIORS
    return kind in KEEPING_PRE_TOKENIZERS


def _covers_every_byte(spec: dict[str, Any], model: dict[str, Any]) -> bool:
    """A BPE model that can spell any byte: byte fallback with all 256 byte tokens, or a byte-level
    pre-tokenizer with its whole 256-symbol alphabet in the vocabulary."""
    if model.get("type") != "BPE":
        return False
    vocab = model.get("vocab", {})
    if model.get("byte_fallback"):
        return all(f"<0x{b:02X}>" in vocab for b in range(256))
    if "ByteLevel" in _pre_tokenizer_kinds(spec.get("pre_tokenizer")):
        return all(symbol in vocab for symbol in _byte_level_alphabet())
    return False


def _pre_tokenizer_kinds(pre_tokenizer: dict[str, Any] | None) -> set[str]:
    if pre_tokenizer is None:
        return set()
    if pre_tokenizer.get("type") == "Sequence":
        return set().union(*(_pre_tokenizer_kinds(p) for p in pre_tokenizer.get("pretokenizers", [])))
    return {pre_tokenizer.get("type", "")}


def _byte_level_alphabet() -> list[str]:
    """GPT-2's byte-to-character map: printable bytes stand for themselves, the others for 256 + k."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    others = [b for b in range(256) if b not in printable]
    return [chr(b) for b in printable] + [chr(256 + k) for k in range(len(others))]
