"""A position is never given the mask token: a model that ranks it first everywhere (random weights can) still
finishes every block, with tokens that are the model's best other choice. Before this rule a block decoded
autoregressively, or by a fixed schedule, kept writing the mask token into the same position and never ended.
"""

from __future__ import annotations

import pytest
import torch

from diffuserve import LLM, SamplingParams
from diffuserve.reference.clover_moe_checkpoint import make_clover_moe_config, write_clover_moe_checkpoint
from diffuserve.reference.random_checkpoint import make_config, write_random_checkpoint

MAX_STEPS = 200


def _mask_first(llm: LLM) -> int:
    """Makes the mask token every row's argmax by a wide margin; returns its id."""
    model = llm.engine.runner.model
    mask_id = llm.engine.args.mask_token_id
    compute_logits = model.compute_logits

    def favour_mask(hidden: torch.Tensor) -> torch.Tensor:
        logits = compute_logits(hidden).clone()
        logits[:, mask_id] += 1e4
        return logits

    model.compute_logits = favour_mask
    return mask_id


def _run(llm: LLM, params: SamplingParams) -> list[list[int]]:
    for i, prompt in enumerate(([5, 6, 7], [8, 9, 10, 11, 12])):
        llm.engine.add_request(f"r{i}", prompt, params)
    finished = {}
    for _ in range(MAX_STEPS):
        finished.update((o.request_id, o) for o in llm.engine.step() if o.finished)
        if not llm.engine.has_unfinished_requests():
            return [list(finished[f"r{i}"].outputs[0].token_ids) for i in range(2)]
    raise AssertionError(f"requests unfinished after {MAX_STEPS} steps")


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True),
        SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True, decoder="fixed", steps=2),
        SamplingParams(max_tokens=8, temperature=0.7, seed=1, ignore_eos=True),
    ],
    ids=["threshold", "fixed", "sampled"],
)
def test_block_diffusion_never_writes_the_mask_token(tmp_path, params):
    llm = LLM(str(write_random_checkpoint(tmp_path / "m", make_config("sdar-moe-tiny"), seed=0)))
    mask_id = _mask_first(llm)
    outputs = _run(llm, params)
    assert [len(o) for o in outputs] == [8, 8] and all(mask_id not in o for o in outputs)


def test_autoregressive_hybrid_never_writes_the_mask_token(tmp_path):
    """clover_moe without the diffusion tensors decodes one position at a time: the case that looped."""
    model = write_clover_moe_checkpoint(tmp_path / "m", make_clover_moe_config(), seed=0, diffusion=False)
    llm = LLM(str(model))
    mask_id = _mask_first(llm)
    outputs = _run(llm, SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True))
    assert [len(o) for o in outputs] == [6, 6] and all(mask_id not in o for o in outputs)
