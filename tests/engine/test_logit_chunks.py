"""The step's decoding computes and decodes a step's logits a chunk of blocks at a time
(decoding/step_decoding.py `logit_chunks`): under a budget of a few rows no `compute_logits` call sees more rows
than the budget allows, and the tokens are those of the unchunked run (a mask family with mixed decoders and a
sampled request, and DiffusionGemma's renoise canvases with their self-conditioning), batched with mixed prompt and
output lengths."""

from __future__ import annotations

import pytest

from diffuserve.decoding.step_decoding import PlannedBlock, logit_chunks
from diffuserve.llm import LLM
from diffuserve.reference.diffusion_gemma_checkpoint import (
    make_diffusion_gemma_config,
    write_diffusion_gemma_checkpoint,
)
from diffuserve.reference.random_checkpoint import make_config, write_random_checkpoint
from diffuserve.sampling_params import SamplingParams

MASK_PARAMS = [
    SamplingParams(max_tokens=9, temperature=0.0, ignore_eos=True),
    SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True, decoder="fixed", steps=2),
    SamplingParams(max_tokens=11, temperature=0.8, seed=3, ignore_eos=True),
    SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True, decoder="entropy"),
]
GEMMA_PARAMS = [SamplingParams(max_tokens=n, seed=s, steps=3, ignore_eos=True) for n, s in ((20, 1), (12, 2), (32, 3))]
PROMPTS = [[5, 6, 7], [9, 10, 11, 12, 13, 14, 15], [20], [30, 31, 32, 33, 34]]


def _generate(model_dir, params: list[SamplingParams], budget_rows: int | None) -> tuple[list[list[int]], int]:
    """(each request's tokens, the most rows one compute_logits call saw) with the runner's budget set to
    `budget_rows` fp32 logit rows (None: the default budget, one chunk at these sizes)."""
    llm = LLM(str(model_dir), max_num_seqs=8)
    runner = llm.engine.runner
    if budget_rows is not None:
        runner.logits_budget_bytes = budget_rows * 4 * runner.decoding.vocab_size
    seen = [0]
    compute = runner.model.compute_logits

    def counted(hidden):
        seen[0] = max(seen[0], hidden.shape[0])
        return compute(hidden)

    runner.model.compute_logits = counted
    outputs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS[: len(params)]], params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outputs], seen[0]


@pytest.fixture(scope="module")
def mask_model(tmp_path_factory):
    return write_random_checkpoint(tmp_path_factory.mktemp("chunks") / "sdar", make_config("sdar-moe-tiny"), seed=4)


@pytest.fixture(scope="module")
def gemma_model(tmp_path_factory):
    out = tmp_path_factory.mktemp("chunks") / "gemma"
    return write_diffusion_gemma_checkpoint(out, make_diffusion_gemma_config(), seed=5, feedback=0.1)


@pytest.mark.parametrize("family", ["mask", "gemma"])
def test_chunked_logits_decode_the_same_tokens(family, mask_model, gemma_model):
    model_dir, params = (mask_model, MASK_PARAMS) if family == "mask" else (gemma_model, GEMMA_PARAMS)
    whole, whole_rows = _generate(model_dir, params, None)
    chunked, chunk_rows = _generate(model_dir, params, 1)  # one block per chunk
    assert chunked == whole
    assert [len(t) for t in whole] == [p.max_tokens for p in params]
    assert whole_rows > chunk_rows  # the unchunked run computed several blocks' rows at once
    block = 16 if family == "gemma" else 4
    assert chunk_rows <= block


def _block(rows: int) -> PlannedBlock:
    return PlannedBlock(None, None, list(range(rows)), [])  # type: ignore[arg-type]  # only the row count matters


def test_logit_chunks_cut_at_the_row_bound_keeping_the_order():
    blocks = [_block(n) for n in (3, 2, 4, 1, 6)]
    chunks = logit_chunks(blocks, 5)
    assert [[len(b.read) for b in c] for c in chunks] == [[3, 2], [4, 1], [6]]  # an oversized block alone
    assert [b for c in chunks for b in c] == blocks
    assert len(logit_chunks(blocks, 100)) == 1
