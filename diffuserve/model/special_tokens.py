"""Special-token ids that a model's config.json leaves to its tokenizer.

Released LLaDA2 directories name neither the mask token nor EOS in config.json (their reference code hard-codes
156895 and 156892). Rather than hard-coding ids, a family declares the *text* of such tokens (`<|mask|>`) and
the loader looks their ids up in the directory's tokenizer.json. Reads JSON only; knows nothing of models.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path


def tokenizer_ids_by_text(model_dir: Path) -> dict[str, int]:
    """tokenizer.json's vocabulary and added tokens, text -> id ({} without a tokenizer.json)."""
    path = model_dir / "tokenizer.json"
    if not path.is_file():
        return {}
    data = json.loads(path.read_text())
    vocab = (data.get("model") or {}).get("vocab")
    ids = dict(vocab) if isinstance(vocab, dict) else {}
    ids.update({token["content"]: token["id"] for token in data.get("added_tokens") or []})
    return ids


def fill_special_token_ids(
    config: dict, generation_config: dict, token_texts: Mapping[str, str], model_dir: Path
) -> dict:
    """config.json with each field of `token_texts` ({field: token text}) that neither config.json nor
    generation_config.json sets filled with that token's id from the tokenizer (left unset if it has none)."""
    missing = {f: t for f, t in token_texts.items() if config.get(f) is None and generation_config.get(f) is None}
    if not missing:
        return config
    ids = tokenizer_ids_by_text(model_dir)
    return {**config, **{field: ids[text] for field, text in missing.items() if text in ids}}
