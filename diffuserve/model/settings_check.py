"""Unknown settings are never silent: every config.json key (top level and `text_config`) is understood by the
family, known to be irrelevant (known_settings.py and the family's settings.py), or reported; so is every
checkpoint tensor that looks like a block-diffusion or routing setting and that no parameter of the model takes.

A key or tensor that looks like a diffusion or routing setting (`bd_*`, `*coreset*`, `block_*`, `mask*`,
`*router*`, ...) is one line naming it and saying what the engine does instead; the other unknown keys are one
line listing them. At load these lines are logged as warnings (once per model directory); with
`strict_config` the first is raised instead, as a `StrictConfigError` (a ValueError; the CLI exits 1 with it).
Reported tensors are left unloaded (`is_setting_tensor`). Standard library only: the loader hands it the
tensor names and which of them the model takes.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable

from diffuserve.model.known_settings import COMMON_IRRELEVANT, COMMON_UNDERSTOOD, FamilySettings

logger = logging.getLogger(__name__)

_SETTING_WORDS = (
    "bd|coreset|block|mask|masked|diffusion|denoise|denoising|canvas|renoise|remask|remasking|unmask|noise|"
    "router|routing|route|routed|expert|experts|topk|threshold|steps|confidence|editing|schedule|penalty"
)
SETTING_KEY = re.compile(rf"(?:^|_)(?:{_SETTING_WORDS})(?:_|$)|coreset", re.IGNORECASE)
"""A config key that looks like a diffusion or routing setting (one of its `_`-separated words)."""
SETTING_TENSOR = re.compile(
    r"(?:^|[._])(?:bd|coreset|block|mask|diffusion|denoise|canvas|renoise|remask|unmask)(?:[._]|$)|coreset",
    re.IGNORECASE,
)
"""A tensor name that looks like a diffusion setting (narrower than the keys: experts and routers are weights)."""


class StrictConfigError(ValueError):
    """A setting the engine does not implement, under strict_config."""

    exit_code = 1


def is_setting_tensor(name: str) -> bool:
    return SETTING_TENSOR.search(name) is not None


def key_lines(config: dict, settings: FamilySettings) -> list[str]:
    """One line per unimplemented diffusion / routing key, then one for the other unknown keys (if any)."""
    known = COMMON_UNDERSTOOD | COMMON_IRRELEVANT | settings.understood | settings.irrelevant
    fields = {**config, **(config.get("text_config") or {})}
    unknown = sorted(key for key in fields if key not in known)
    lines = [
        f"config.json: `{key}` = {_short(fields[key])} looks like a diffusion or routing setting diffuserve does "
        f"not implement; it is ignored: {settings.instead}"
        for key in unknown
        if SETTING_KEY.search(key)
    ]
    others = [key for key in unknown if not SETTING_KEY.search(key)]
    if others:
        lines.append(
            f"config.json: diffuserve does not read {', '.join(f'`{k}`' for k in others)} (not known to be "
            "irrelevant to inference); check the model card"
        )
    return lines


def tensor_lines(names: Iterable[str], is_loaded: Callable[[str], bool], settings: FamilySettings) -> list[str]:
    """One line per checkpoint tensor that looks like a diffusion setting and that no parameter takes."""
    return [
        f"checkpoint: tensor `{name}` looks like a diffusion or routing setting diffuserve does not implement; it "
        f"is not loaded: {settings.instead}"
        for name in names
        if is_setting_tensor(name) and not is_loaded(name)
    ]


def report(lines: list[str], strict: bool, seen: set[str]) -> None:
    """Raises the first line under `strict`; otherwise logs each line not in `seen` (and adds it there)."""
    if strict and lines:
        raise StrictConfigError(f"{lines[0]} (--strict-config)")
    for line in lines:
        if line not in seen:
            seen.add(line)
            logger.warning("%s", line)


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
