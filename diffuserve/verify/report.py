"""What `diffuserve verify` found, as one result, a table and a JSON document, and the exit code it means:
0 the engine and the reference agree, 1 they part (the first check that parts is named), 2 no reference could
run. Knows nothing of how the checks were made.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from diffuserve.verify.block_steps import BlockStepsCheck
from diffuserve.verify.compare import GreedyCheck, TensorCheck, first_parting

AGREE, PART, NO_REFERENCE = 0, 1, 2


@dataclass(frozen=True)
class VerifyResult:
    model: str
    dtype: str
    layers: int | None
    """--layers K (None: the whole model)."""
    reference: str | None
    """What ran as the reference (None: nothing could)."""
    reason: str = ""
    """Why no reference ran."""
    notes: list[str] = field(default_factory=list)
    layer_checks: list[TensorCheck] = field(default_factory=list)
    logits: TensorCheck | None = None
    greedy: list[GreedyCheck] = field(default_factory=list)
    block_steps: BlockStepsCheck | None = None

    @property
    def exit_code(self) -> int:
        if self.reference is None:
            return NO_REFERENCE
        tensors = [*self.layer_checks, *([self.logits] if self.logits else [])]
        block = self.block_steps is None or self.block_steps.agrees
        return AGREE if all(c.agrees for c in tensors) and all(g.agrees for g in self.greedy) and block else PART

    @property
    def verdict(self) -> str:
        if self.reference is None:
            return f"no reference: {self.reason}"
        parting = first_parting([*self.layer_checks, *([self.logits] if self.logits else [])])
        if parting is not None:
            return f"part at {parting.what}: max |diff| {parting.max_diff:.3g} > tolerance {parting.tolerance:.3g}"
        greedy = next((g for g in self.greedy if not g.agrees), None)
        if greedy is not None:
            return f"part at greedy continuation of prompt {greedy.prompt}, token {greedy.first_difference}"
        if self.block_steps is not None and not self.block_steps.agrees:
            return "part at one block of block-diffusion decoding"
        return "agree"


def _greedy_line(check: GreedyCheck) -> tuple[str, str, str, str]:
    what = f"greedy continuation, prompt {check.prompt} ({len(check.reference)} tokens)"
    if check.agrees:
        return what, "identical", "", "agree"
    i = check.first_difference
    detail = f"token {i}: {check.ours[i] if i is not None else '-'} vs {check.reference[i] if i is not None else '-'}"
    return what, detail, "", "PART"


def render_table(result: VerifyResult) -> list[str]:
    scope = "whole model" if result.layers is None else f"first {result.layers} layers"
    lines = [f"model: {result.model} ({scope}, {result.dtype})", f"reference: {result.reference or 'none'}"]
    lines += result.notes
    rows = [("check", "max |diff|", "tolerance", "result")]
    tensors = [*result.layer_checks, *([result.logits] if result.logits else [])]
    rows += [(c.what, f"{c.max_diff:.3g}", f"{c.tolerance:.3g}", "agree" if c.agrees else "PART") for c in tensors]
    rows += [_greedy_line(g) for g in result.greedy]
    if result.reference is not None:
        widths = [max(len(r[i]) for r in rows) for i in range(3)]
        lines += ["", *(f"{r[0]:<{widths[0]}}  {r[1]:>{widths[1]}}  {r[2]:>{widths[2]}}  {r[3]}" for r in rows)]
    if result.block_steps is not None:
        lines.append(f"block-diffusion denoising steps: {result.block_steps.summary}")
        lines += [f"  {note}" for note in result.block_steps.notes]
    return [*lines, "", f"verdict: {result.verdict}"]


def to_json(result: VerifyResult) -> dict[str, Any]:
    def tensor(c: TensorCheck) -> dict[str, Any]:
        return {"what": c.what, "max_diff": c.max_diff, "tolerance": c.tolerance, "agrees": c.agrees}

    return {
        "model": result.model,
        "dtype": result.dtype,
        "layers": result.layers,
        "reference": result.reference,
        "reason": result.reason or None,
        "notes": result.notes,
        "hidden_states": [tensor(c) for c in result.layer_checks],
        "logits": tensor(result.logits) if result.logits else None,
        "greedy": [
            {"prompt": g.prompt, "ours": g.ours, "reference": g.reference, "agrees": g.agrees} for g in result.greedy
        ],
        "block_steps": None
        if result.block_steps is None
        else {
            "tried": list(result.block_steps.tried),
            "found": list(result.block_steps.found),
            "compared": result.block_steps.compared,
            "ours": result.block_steps.ours,
            "reference": result.block_steps.reference,
            "agrees": result.block_steps.agrees,
            "entry": result.block_steps.entry or None,
            "notes": list(result.block_steps.notes),
            "summary": result.block_steps.summary,
        },
        "verdict": result.verdict,
        "exit_code": result.exit_code,
    }
