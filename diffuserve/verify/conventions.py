"""Which attention-mask convention a reference reads, found by running it: the additive 0 / -inf mask first
(transformers' convention), the boolean one where that parts (SDAR's eval attention reads `mask.bool()`, so an
additive mask is read inside out and every layer would part: a false failure). The convention kept is the one
whose checks agree longest from layer 0 (all of them, where one agrees); the report says which agreed, and what
the other gave where both ran. A model with recurrent layers gets no mask (its transformers code builds the
causal one). Knows nothing of models.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from diffuserve.verify.compare import TensorCheck, first_parting, layer_checks, logits_check
from diffuserve.verify.runners import MASK_CONVENTIONS, CausalRun, ReferenceRunner


@dataclass
class ConventionChoice:
    runner: ReferenceRunner
    layer_checks: list[TensorCheck]
    logits: TensorCheck
    note: str


def _agreeing_prefix(checks: list[TensorCheck]) -> int:
    return next((i for i, c in enumerate(checks) if not c.agrees), len(checks))


def _outcome(checks: list[TensorCheck]) -> str:
    parting = first_parting(checks)
    return "agreed" if parting is None else f"parted at {parting.what}"


def choose_convention(
    runner_for: Callable[[str], ReferenceRunner],
    prompts: list[list[int]],
    ours: list[CausalRun],
    names: list[str],
    dtype: torch.dtype,
    recurrent: bool,
) -> ConventionChoice:
    tried: list[ConventionChoice] = []
    for convention in ("none",) if recurrent else ("additive", "boolean"):
        runner = runner_for(convention)
        runs = [runner.run(p) for p in prompts]
        checks, logits = layer_checks(ours, runs, names, dtype), logits_check(ours, runs, dtype)
        tried.append(ConventionChoice(runner, checks, logits, MASK_CONVENTIONS[convention]))
        if first_parting([*checks, logits]) is None:
            break
    best = max(tried, key=lambda c: _agreeing_prefix([*c.layer_checks, c.logits]))
    verdicts = [
        f"{c.note}: "
        + ("agreed" if (p := first_parting([*c.layer_checks, c.logits])) is None else f"parted at {p.what}")
        for c in tried
    ]
    best.note = f"attention mask given the reference: {best.note} (tried: {'; '.join(verdicts)})"
    return best
