"""The model directory's tokenizer and chat template (via transformers' AutoTokenizer, offline, never running the
checkpoint's own code).

Owns text <-> token ids, rendering the chat template, and what the tokenizer says about its special tokens: which
ids are special, which of them the chat template itself emits, how to encode text that merely spells a special
token as plain text (what transformers' `split_special_tokens` does), and a lower bound on the token count of a
text from its length alone (`min_num_tokens`), so that a server can refuse a prompt that cannot fit without
tokenizing it. Knows nothing of the engine. A conversation's prompt ids are `text/chat_template.py`'s (it uses these
pieces).

Thread safety: every method only reads the tokenizer (transformers changes the Rust tokenizer's settings only
when asked for truncation, padding or `split_special_tokens`, which nothing here does; plain-text encoding uses a
second Rust tokenizer of its own), so one instance may encode on several threads at once.
"""

from __future__ import annotations

import json
import math
import re
from functools import cached_property
from pathlib import Path
from typing import Any, cast

from diffuserve.errors import RequestError
from diffuserve.text.tokenizer_bounds import chars_per_token_bound

DEFUSED_CHAR = "\ue000"
"""Private-use character that stands in for a spelled special token when locating the template's own ones."""

PROBE_CONVERSATIONS = (
    [
        {"role": "system", "content": "a"},
        {"role": "user", "content": "b"},
        {"role": "assistant", "content": "c"},
        {"role": "user", "content": "d"},
    ],
    [{"role": "user", "content": "b"}, {"role": "assistant", "content": "c"}, {"role": "user", "content": "d"}],
)
"""Conversations rendered once to learn which special tokens the chat template emits (some templates refuse a
system turn, hence the second)."""


class Tokenizer:
    def __init__(self, model_dir: str | Path) -> None:
        from transformers import AutoTokenizer
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()  # transformers warns about our non-HF model_type
        try:
            # trust_remote_code=False, explicitly: with None, transformers asks "Do you wish to run the custom
            # code? [y/N]" on a terminal whenever config.json has an `auto_map` (as SDAR's Hub checkpoints do).
            self.hf = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True, trust_remote_code=False)
        except ValueError as e:
            if "trust_remote_code" not in str(e):
                raise
            raise ValueError(
                f"tokenizer: {str(model_dir)!r} needs the checkpoint's own Python code to load its tokenizer "
                "(`auto_map` in tokenizer_config.json), which diffuserve never runs; add a tokenizer.json "
                "(a fast tokenizer) to the model directory"
            ) from None

    @property
    def vocab_size(self) -> int:
        return len(self.hf)

    @property
    def eos_token_id(self) -> int | None:
        return self.hf.eos_token_id

    @property
    def bos_token_id(self) -> int | None:
        return self.hf.bos_token_id

    @property
    def has_chat_template(self) -> bool:
        return bool(self.hf.chat_template)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(self.hf.encode(text, add_special_tokens=add_special_tokens))

    def decode(self, token_ids: list[int], skip_special_tokens: bool = True) -> str:
        if self._rust_decode is not None:  # what transformers' decode would return, without its per-call Python
            return cast(str, self._rust_decode(token_ids, skip_special_tokens=skip_special_tokens))
        # transformers types decode for a batch too (-> list[str]); one list of ids decodes to one string
        return cast(str, self.hf.decode(token_ids, skip_special_tokens=skip_special_tokens))

    @cached_property
    def _rust_decode(self) -> Any:
        """The Rust tokenizer's own decode where transformers' decode adds nothing to it: a tokenizers-backed
        class whose `_decode` is the base one, with no clean-up of tokenization spaces. The engine decodes every
        completion at every step that gives it tokens, and transformers' wrapper costs several times the decode."""
        # The top-level name is the tokenizers-backed base class in transformers 4.x and 5.x alike (5.x moved it
        # to tokenization_utils_tokenizers.TokenizersBackend, a module 4.x does not have).
        from transformers import PreTrainedTokenizerFast

        base = PreTrainedTokenizerFast
        plain = type(self.hf)._decode is base._decode and not self.hf.clean_up_tokenization_spaces
        if not (isinstance(self.hf, base) and plain):
            return None
        rust: Any = self.hf._tokenizer
        return rust.decode

    def apply_chat_template(
        self, messages: list[dict[str, Any]], add_generation_prompt: bool = True, **template_kwargs: Any
    ) -> str:
        """Renders a conversation with the model's template; ValueError if the model has none."""
        if not self.has_chat_template:
            raise ValueError(
                "messages: this model has no chat template (tokenizer_config.json `chat_template`); "
                "use the completions API with a plain prompt"
            )
        # transformers types every form of the result; with tokenize=False it is the rendered string
        rendered = self.hf.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=add_generation_prompt, **template_kwargs
        )
        return cast(str, rendered)

    # ---- special tokens ------------------------------------------------------------------------------------
    @cached_property
    def special_ids(self) -> frozenset[int]:
        """Ids the tokenizer marks special: its named ones (bos, eos, mask, ...) and every added token flagged
        special (ChatML markers are often only the latter)."""
        added = {i for i, token in self.hf.added_tokens_decoder.items() if token.special}
        return frozenset(added | set(self.hf.all_special_ids))

    @cached_property
    def template_special_ids(self) -> frozenset[int]:
        """Special ids the chat template itself emits (learned by rendering small conversations); empty without
        a template."""
        if not self.has_chat_template:
            return frozenset()
        found: set[int] = set()
        for conversation in PROBE_CONVERSATIONS:
            try:
                found |= set(self.encode(self.apply_chat_template(conversation), add_special_tokens=False))
            except Exception:  # a template may refuse a probe (roles, alternation): try the next one
                continue
        return frozenset(found & self.special_ids)

    @cached_property
    def _special_pattern(self) -> re.Pattern[str] | None:
        # One id converts to one token (None for an id outside the vocabulary); transformers types the list form too.
        tokens = {cast("str | None", self.hf.convert_ids_to_tokens(i)) for i in self.special_ids}
        strings = sorted((t for t in tokens if t), key=len, reverse=True)
        return re.compile("|".join(map(re.escape, strings))) if strings else None

    def spells_special(self, text: str) -> bool:
        """True if `text` contains the written form of a special token."""
        return self._special_pattern is not None and self._special_pattern.search(text) is not None

    def defuse(self, text: str) -> str:
        """`text` with every spelled special token replaced by as many private-use characters (same length)."""
        if self._special_pattern is None:
            return text
        return self._special_pattern.sub(lambda m: DEFUSED_CHAR * len(m.group()), text)

    @cached_property
    def _plain(self) -> Any:
        """A second Rust tokenizer that encodes special-token text as plain text (split_special_tokens)."""
        from tokenizers import Tokenizer as RustTokenizer

        plain = RustTokenizer.from_str(self.hf.backend_tokenizer.to_str())
        plain.encode_special_tokens = True
        return plain

    def encode_plain(self, text: str) -> list[int]:
        """Token ids of `text` with special-token spellings encoded as ordinary text, no special tokens added."""
        return list(self._plain.encode(text, add_special_tokens=False).ids)

    def encode_rendered(self, rendered: str, reference: str) -> list[int]:
        """Token ids of a rendered chat whose messages spell special tokens: the template's own special tokens
        stay special, spelled ones are plain text. `reference` is the same conversation rendered with its
        contents `defuse`d, so a special token is the template's iff the two renderings agree on its span; the
        text between two of the template's special tokens is encoded as one plain-text piece (as transformers
        encodes the pieces between special tokens). RequestError if the template does not copy contents verbatim
        (the renderings differ in length): then the spans cannot be told apart."""
        if len(rendered) != len(reference):
            raise RequestError(
                "messages",
                "a message spells a special token and this model's chat template changes "
                "message text, so it cannot be encoded as plain text; remove the special token",
            )
        encoding = self.hf(rendered, add_special_tokens=False, return_offsets_mapping=True)
        ids: list[int] = []
        piece: list[int] = []
        piece_start, spelled = 0, False
        for token, (start, end) in zip(encoding["input_ids"], encoding["offset_mapping"]):
            if token in self.special_ids and rendered[start:end] == reference[start:end]:
                ids += self.encode_plain(rendered[piece_start:start]) if spelled else piece
                ids.append(token)
                piece, piece_start, spelled = [], end, False
            else:
                piece.append(token)
                spelled = spelled or token in self.special_ids
        ids += self.encode_plain(rendered[piece_start:]) if spelled else piece
        return ids

    # ---- length bound --------------------------------------------------------------------------------------
    @cached_property
    def chars_per_token(self) -> float | None:
        """At most this many characters of input text per token, or None when the tokenizer may drop or merge
        unbounded text (then no bound holds; see tokenizer_bounds)."""
        return chars_per_token_bound(json.loads(self.hf.backend_tokenizer.to_str()))

    def min_num_tokens(self, num_chars: int) -> int:
        """A lower bound on the tokens of any text of `num_chars` characters (0 when none is known)."""
        bound = self.chars_per_token
        return math.ceil(num_chars / bound) if bound else 0
