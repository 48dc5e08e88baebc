"""`--recurrent-state rescan` (the gdn-rescan baseline of `bench compare`): K/V cached, no GDN state carried
between steps, every step's state rebuilt by scanning the kept projections of the committed prefix. At
temperature 0 its tokens equal the engine's that keeps the state, through batching, chunked prefill and
preemption, even with the state pool overwritten by noise before every forward (so nothing carried is read)."""

from __future__ import annotations

import pytest
import torch

from diffuserve import LLM, SamplingParams
from diffuserve.bench.baselines.engines import baseline_llm
from diffuserve.reference.clover_moe_checkpoint import make_clover_moe_config, write_clover_moe_checkpoint


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory) -> dict[bool, object]:
    """Block 4; with and without the block-diffusion tensors (the latter decodes autoregressively)."""
    root = tmp_path_factory.mktemp("rescan")
    return {
        diffusion: write_clover_moe_checkpoint(
            root / f"d{int(diffusion)}",
            make_clover_moe_config(block_length=4),
            seed=21,
            init_std=0.1,
            logit_scale=20.0,
            diffusion=diffusion,
        )
        for diffusion in (True, False)
    }


def _prompts(lengths: list[int], seed: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(10, 250, (n,), generator=generator).tolist() for n in lengths]


def _generate(
    model_dir, prompts: list[list[int]], max_tokens: int, noise: bool = False, baseline: str | None = None, **kwargs
) -> list[list[int]]:
    kwargs = {"device": "cpu", "max_model_len": 160, **kwargs}
    llm = LLM(str(model_dir), **kwargs) if baseline is None else baseline_llm(str(model_dir), baseline, **kwargs)
    if noise:
        _overwrite_state_before_every_forward(llm)
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, threshold=0.5)
    return [list(out.outputs[0].token_ids) for out in llm.generate(prompts, params)]


def _overwrite_state_before_every_forward(llm: LLM) -> None:
    """Noise in every slot's conv ring and S before each forward: a step may only read what it rebuilds."""
    executor = llm.engine.runner.executor
    forward = executor.forward

    def noisy_forward(inputs):
        for t in executor.caches.state.conv_caches + executor.caches.state.recurrent_caches:
            t.normal_()
        return forward(inputs)

    executor.forward = noisy_forward


@pytest.mark.parametrize("diffusion", [True, False])
def test_rescan_equals_the_kept_state(model_dirs, diffusion):
    # Mixed lengths around blocks, pages (16) and delta-rule chunks (64); prompts over 3 blocks are prefilled in
    # chunks, so a prefill chunk too starts from a rescanned prefix.
    prompts = _prompts([1, 3, 5, 16, 17, 33, 70], seed=1)
    max_tokens = 14 if diffusion else 6
    kept = _generate(model_dirs[diffusion], prompts, max_tokens, max_num_batched_tokens=12)
    rescan = _generate(
        model_dirs[diffusion], prompts, max_tokens, noise=True, max_num_batched_tokens=12, baseline="rescan"
    )
    assert rescan == kept


def test_the_noise_breaks_the_kept_state(model_dirs):
    """The check above can fail: the same noise changes the tokens of the engine that carries its state."""
    prompts = _prompts([5, 17, 33], seed=1)
    assert _generate(model_dirs[True], prompts, 14, noise=True) != _generate(model_dirs[True], prompts, 14)


def test_rescan_under_preemption_equals_an_unconstrained_run(model_dirs):
    prompts = _prompts([5, 17, 30, 9, 22, 13], seed=6)
    free = _generate(model_dirs[True], prompts, 24)
    # 8 pages of 16 tokens for 6 requests of up to 54 positions: some are preempted and rescan what they rewrite.
    llm = baseline_llm(str(model_dirs[True]), "rescan", device="cpu", max_model_len=160, num_pages=8)
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, threshold=0.5)
    assert [list(o.outputs[0].token_ids) for o in llm.generate(prompts, params)] == free
    assert llm.engine.stats().num_preemptions > 0
    assert llm.engine.state_pool.num_snapshots_taken == 0  # a rescan keeps no prefix snapshot
