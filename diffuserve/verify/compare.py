"""What `diffuserve verify` compares, and when two sides agree.

A tensor agrees when its largest absolute difference is within the dtype's tolerance, relative to the
reference's largest magnitude (at least 1): 1e-4 in float32 (our tiny random models agree within 5e-6), 2e-2 in
bfloat16 and 5e-3 in float16 (one rounding of a different summation order is about 4e-3 in bfloat16). Layers are
compared in order and the first one that parts is named; the prefill logits likewise; a greedy continuation
agrees when every token is the same (the first differing position is named). Knows nothing of models.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from diffuserve.verify.runners import CausalRun

RELATIVE_TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 2e-2, torch.float16: 5e-3}


@dataclass(frozen=True)
class TensorCheck:
    what: str
    max_diff: float
    tolerance: float

    @property
    def agrees(self) -> bool:
        return self.max_diff <= self.tolerance


@dataclass(frozen=True)
class GreedyCheck:
    prompt: int
    ours: list[int]
    reference: list[int]

    @property
    def agrees(self) -> bool:
        return self.ours == self.reference

    @property
    def first_difference(self) -> int | None:
        """The first generated position whose tokens differ (None: identical)."""
        return next((i for i, (a, b) in enumerate(zip(self.ours, self.reference)) if a != b), None)


def tensor_check(what: str, ours: torch.Tensor, reference: torch.Tensor, dtype: torch.dtype) -> TensorCheck:
    if ours.shape != reference.shape:
        return TensorCheck(f"{what} (shape {tuple(ours.shape)} vs {tuple(reference.shape)})", float("inf"), 0.0)
    scale = max(1.0, reference.abs().max().item())
    return TensorCheck(what, (ours - reference).abs().max().item(), RELATIVE_TOLERANCE[dtype] * scale)


def _worst(checks: list[TensorCheck]) -> TensorCheck:
    """The prompts' checks of one tensor as one: the largest difference against its own tolerance."""
    return max(checks, key=lambda c: c.max_diff / c.tolerance if c.tolerance else float("inf"))


def layer_checks(
    ours: list[CausalRun], reference: list[CausalRun], layer_names: list[str], dtype: torch.dtype
) -> list[TensorCheck]:
    """One check per decoder layer's output, over every prompt."""
    checks = []
    for i, name in enumerate(layer_names):
        per_prompt = [
            tensor_check(f"hidden state, {name}", a.hidden[i], b.hidden[i], dtype) for a, b in zip(ours, reference)
        ]
        checks.append(_worst(per_prompt))
    return checks


def logits_check(
    ours: list[CausalRun], reference: list[CausalRun], dtype: torch.dtype, what: str = "prefill logits"
) -> TensorCheck:
    return _worst([tensor_check(what, a.logits, b.logits, dtype) for a, b in zip(ours, reference)])


def first_parting(checks: list[TensorCheck]) -> TensorCheck | None:
    return next((c for c in checks if not c.agrees), None)
