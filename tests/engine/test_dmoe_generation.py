"""dMoE (LLaDA2 with block-expert routing: config.json's `mode` "aggregate" and `core_threshold`) through the
engine, token for token against dMoE's own `generate` (its modeling file loaded from ../shared/reference-code) and
against the naive reference's independent restatement of the rule (reference_dmoe.py): batched, prompt lengths
around the 32-position windows, several thresholds (the guard of 16 included), prefix-cache hits, chunked
prefill and preemption; and the unique experts per block as `generate` reports them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from diffuserve import LLM, SamplingParams
from diffuserve.reference.llada2_checkpoint import DMOE, write_llada2_checkpoint
from diffuserve.reference.parity import check_parity
from diffuserve.reference.reference_model import load_reference
from tests.engine.dmoe_official import load_official, official_generate

LENGTHS = [1, 5, 31, 32, 33, 40, 63, 64, 65, 70]


@pytest.fixture(scope="module")
def dmoe_dir(tmp_path_factory) -> Path:
    return write_llada2_checkpoint(tmp_path_factory.mktemp("dmoe") / "tiny", DMOE, seed=1, logit_scale=40.0)


def _prompt(length: int, seed: int) -> list[int]:
    return [(seed * 131 + i * 17) % 250 + 1 for i in range(length)]


def _answers(llm: LLM, prompts: list[list[int]], lengths: list[int]) -> list[list[int]]:
    params = [SamplingParams(max_tokens=n, ignore_eos=True) for n in lengths]
    return [o.outputs[0].token_ids for o in llm.generate([{"prompt_token_ids": p} for p in prompts], params)]


def _check_official(llm: LLM, model, prompts: list[list[int]], lengths: list[int]) -> None:
    mask = llm.engine.args.mask_token_id
    for prompt, n, got in zip(prompts, lengths, _answers(llm, prompts, lengths)):
        expected = official_generate(model, prompt, n, mask)[0]
        assert got == expected, f"prompt length {len(prompt)}, {n} tokens: {got} != dMoE generate {expected}"


@pytest.mark.parametrize("threshold", [0.6, 0.3, 0.9])
def test_batched_engine_equals_dmoe_generate(dmoe_dir, threshold):
    """0.6 is config.json's; the others come from the flag. At 0.3 most windows keep fewer than 16 experts by the
    share, so the guard decides."""
    model = load_official(dmoe_dir, core_threshold=threshold)
    flag = None if threshold == 0.6 else f"cumulative:{threshold}"
    llm = LLM(str(dmoe_dir), num_pages=256, max_num_seqs=16, block_expert_coreset=flag)
    prompts = [_prompt(n, seed=i) for i, n in enumerate(LENGTHS)]
    _check_official(llm, model, prompts, [8 + (i * 13) % 60 for i in range(len(prompts))])


def test_prefix_hits_chunked_prefill_and_preemption_equal_dmoe_generate(dmoe_dir):
    model = load_official(dmoe_dir)
    shared = _prompt(96, seed=7)
    prompts = [shared + _prompt(n, seed=i) for i, n in enumerate([3, 40, 33])] + [_prompt(150, seed=9)]
    lengths = [40, 24, 33, 20]
    llm = LLM(str(dmoe_dir), num_pages=256, max_num_seqs=4, max_num_batched_tokens=64)
    _check_official(llm, model, prompts[:1], lengths[:1])
    _check_official(llm, model, prompts, lengths)  # the shared 96 positions now come from the prefix cache
    stats = llm.engine.stats()
    assert stats.num_steps > 0 and llm.engine.scheduler.num_prefix_hit_tokens >= 3 * 96
    # pages of 32: each request takes 1 or 2 pages when admitted and 3 or 4 by its end; 7 pages preempt
    tight = LLM(str(dmoe_dir), num_pages=7, max_num_seqs=8, enable_prefix_caching=False)
    _check_official(tight, model, [_prompt(n, seed=n) for n in (5, 20, 33, 40, 10, 31)], [60] * 6)
    assert tight.engine.stats().num_preemptions > 0


def test_unique_experts_per_block_equal_those_generate_reports(dmoe_dir):
    """Answers that end at a block's end: `generate` keeps denoising a last block's positions past gen_length,
    which the engine does not compute (their tokens are not asked for), so only then are the forwards the same."""
    model = load_official(dmoe_dir)
    for length, n in [(5, 59), (45, 51)]:
        llm = LLM(str(dmoe_dir), num_pages=64, max_num_seqs=1, expert_stats=True)
        mask = llm.engine.args.mask_token_id
        prompt = _prompt(length, seed=length)
        _answers(llm, [prompt], [n])
        experts = llm.engine.stats().experts
        assert experts is not None
        reported = official_generate(model, prompt, n, mask)[1]
        assert experts.experts_per_block_forward == pytest.approx(reported, rel=1e-12)
        assert 4 < reported < 16  # top-4 routing inside coresets of at least 16 experts


def test_engine_equals_the_independent_oracle(dmoe_dir):
    """Runs without the official files: the naive reference with its own restatement of the rule."""
    llm = LLM(str(dmoe_dir), num_pages=256, max_num_seqs=8, block_expert_coreset="cumulative:0.5")
    reference = load_reference(dmoe_dir, core_threshold=0.5)
    prompts = [_prompt(n, seed=i) for i, n in enumerate([5, 33, 64])]
    params = [SamplingParams(max_tokens=n, ignore_eos=True) for n in (30, 12, 9)]
    run = check_parity(llm, reference, prompts, params)
    assert not run.mismatches, "\n".join(run.mismatches)
    per_token = _answers(LLM(str(dmoe_dir), num_pages=256, block_expert_coreset=0), prompts, [30, 12, 9])
    assert per_token != run.engine_tokens  # the rule changes the answers: the comparison can fail


def test_the_gate_keys_are_read_not_reported(dmoe_dir, tmp_path, caplog):
    shutil.copytree(dmoe_dir, tmp_path / "fresh")  # settings are reported once per directory
    LLM(str(tmp_path / "fresh"), num_pages=16)
    assert "ignored" not in caplog.text and "core_threshold" not in caplog.text
    config = json.loads((dmoe_dir / "config.json").read_text())
    shutil.copytree(dmoe_dir, tmp_path / "other-mode")
    (tmp_path / "other-mode" / "config.json").write_text(json.dumps({**config, "mode": "token"}))
    with pytest.raises(ValueError, match=r"config\.json: `mode` is 'token'; dMoE's gate runs only 'aggregate'"):
        LLM(str(tmp_path / "other-mode"), num_pages=16)
    with pytest.raises(ValueError, match="block_length: 16 is not a multiple of the coreset window 32"):
        LLM(str(dmoe_dir), num_pages=16, block_length=16)
