"""The engine against the naive reference decode, request by request: the same answer tokens, and exactly the
forwards the reference needed until that answer was decided (the engine exits early, never late, and never
skips a denoising step). Returns what differs instead of asserting, so that a test can check both that a
correct engine passes and that a broken one (tests/engine/test_oracle_mutations.py) does not.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from diffuserve import LLM
from diffuserve.reference.reference_decode import ReferenceResult, reference_generate
from diffuserve.reference.reference_model import ReferenceModel
from diffuserve.sampling_params import SamplingParams


@dataclass(frozen=True)
class ParityRun:
    engine_tokens: list[list[int]]
    references: list[ReferenceResult]
    mismatches: list[str]
    """One line per request that differs from the reference (empty: parity)."""


def check_parity(
    llm: LLM, reference: ReferenceModel, prompts: list[list[int]], params: list[SamplingParams]
) -> ParityRun:
    """Generates every prompt in one batch on the engine and alone on the reference, greedy or seeded (n = 1: the
    engine seeds a request's generator with its seed, and so does this for the reference's)."""
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
    tokens, references, mismatches = [], [], []
    for prompt, p, out in zip(prompts, params, outputs):
        generator = None if p.seed is None else torch.Generator().manual_seed(p.seed)
        expected = reference_generate(reference, prompt, p, generator)
        got = out.outputs[0].token_ids
        if got != expected.token_ids:
            mismatches.append(f"prompt length {len(prompt)}: tokens {got} != reference {expected.token_ids}")
        elif out.num_forwards != expected.forwards_to_answer:
            mismatches.append(
                f"prompt length {len(prompt)}: {out.num_forwards} forwards != reference {expected.forwards_to_answer}"
            )
        tokens.append(got)
        references.append(expected)
    return ParityRun(tokens, references, mismatches)
