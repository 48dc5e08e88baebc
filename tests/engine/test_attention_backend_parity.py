"""Every CPU attention backend through the whole engine: at temperature 0 each gives the naive reference's tokens
(and forwards, where the prefill is not split), on an attention family with chunked prefills, fused commits and
batching, and on the hybrid clover_moe (causal commit rows beside whole blocks; an autoregressive checkpoint's
causal rows); prompt scores (extra variant sequences per step) agree across backends. An off-by-one in the
block-causal rule the runner builds its masks with fails the parity check."""

from __future__ import annotations

import pytest

from diffuserve import LLM, SamplingParams
from diffuserve.model.families.clover_moe.dense import DenseClover
from diffuserve.model.families.clover_moe.gated_attention import GatedAttention
from diffuserve.model.layers import attention
from diffuserve.model.layers.attention import Attention
from diffuserve.model.loader import load_model
from diffuserve.reference.clover_moe_checkpoint import make_clover_moe_config, write_clover_moe_checkpoint
from diffuserve.reference.parity import check_parity
from diffuserve.reference.reference_clover_moe import ReferenceSettings, reference_block_decode
from diffuserve.reference.reference_model import load_reference
from diffuserve.worker.cache import paged_step
from tests.engine.test_generation_parity import PROMPT_LENGTHS, parity_cases
from tests.engine.test_oracle_mutations import apply_source_mutation

BACKENDS = ("loop", "batched")
PROMPTS = [[72, 101, 108, 108, 111, 44, 32], [87, 111, 114, 108, 100, 33, 10, 5, 9], [1, 2, 3], list(range(1, 14))]


def _llm(model_dir, backend: str, **kwargs) -> LLM:
    llm = LLM(str(model_dir), attention_backend=backend, **{"num_pages": 512, "max_num_seqs": 8, **kwargs})
    layers = [m for m in llm.engine.runner.model.modules() if isinstance(m, Attention | GatedAttention)]
    assert layers and all(layer.attention_backend.name == backend for layer in layers)
    return llm


@pytest.mark.parametrize("budget", [4096, 24], ids=["whole-prefill", "chunked-prefill"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_each_backend_gives_the_reference_tokens(tiny_model_dir, backend, budget):
    reference = load_reference(tiny_model_dir)
    prompts, params = parity_cases(SamplingParams(decoder="threshold", threshold=0.7), PROMPT_LENGTHS[::2])
    run = check_parity(_llm(tiny_model_dir, backend, max_num_batched_tokens=budget), reference, prompts, params)
    if budget >= 4096:
        assert not run.mismatches, "\n".join(run.mismatches)
    # A prefill split over steps costs forwards the one-pass reference never makes: there only tokens must agree.
    assert run.engine_tokens == [r.token_ids for r in run.references]


@pytest.fixture(scope="module")
def hybrid_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("hybrid-attention")
    config = make_clover_moe_config(block_length=4)
    return {
        "diffusion": write_clover_moe_checkpoint(root / "bd", config, seed=12, init_std=0.1, logit_scale=20.0),
        "autoregressive": write_clover_moe_checkpoint(
            root / "ar", config, seed=11, init_std=0.1, logit_scale=10.0, diffusion=False
        ),
    }


@pytest.mark.parametrize("backend", BACKENDS)
def test_hybrid_blocks_give_the_reference_tokens(hybrid_dirs, backend):
    params = SamplingParams(temperature=0.0, max_tokens=9, ignore_eos=True, decoder="threshold", threshold=0.5)
    llm = _llm(hybrid_dirs["diffusion"], backend, device="cpu", max_model_len=256, max_num_batched_tokens=16)
    got = [list(out.outputs[0].token_ids) for out in llm.generate(PROMPTS, params)]
    _, model = load_model(hybrid_dirs["diffusion"])
    settings = ReferenceSettings(max_new_tokens=9, threshold=0.5)
    assert got == [reference_block_decode(DenseClover(model), p, settings) for p in PROMPTS]


def test_hybrid_autoregressive_tokens_agree_across_backends(hybrid_dirs):
    params = SamplingParams(temperature=0.0, max_tokens=11, ignore_eos=True)
    tokens = {
        backend: [
            o.outputs[0].token_ids for o in _llm(hybrid_dirs["autoregressive"], backend).generate(PROMPTS, params)
        ]
        for backend in BACKENDS
    }
    assert tokens["batched"] == tokens["loop"]


def test_prompt_scores_agree_across_backends(tiny_model_dir):
    """Variants of several blocks per step beside generating requests; the scores equal within float rounding."""
    requests = [{"prompt_token_ids": p} for p in PROMPTS]
    scores = {}
    for backend in BACKENDS:
        llm = _llm(tiny_model_dir, backend, max_model_len=128, page_size=8, max_num_batched_tokens=40)
        outs = llm.generate(requests, SamplingParams(prompt_logprobs=2, max_tokens=6, ignore_eos=True))
        scores[backend] = [
            [None if e is None else {t: lp.logprob for t, lp in e.items()} for e in o.prompt_logprobs] for o in outs
        ]
    for loop_scores, batched_scores in zip(scores["loop"], scores["batched"]):
        for a, b in zip(loop_scores, batched_scores):
            assert (a is None) == (b is None)
            if a is not None:
                assert a.keys() == b.keys() and all(abs(a[t] - b[t]) < 1e-5 for t in a)


def test_an_off_by_one_block_rule_fails_parity(tiny_model_dir, monkeypatch):
    """Queries no longer seeing their own block (q // B > k // B): the batched default drifts off the reference."""
    reference = load_reference(tiny_model_dir)
    prompts, params = parity_cases(SamplingParams(decoder="threshold", threshold=0.7), PROMPT_LENGTHS[::3])
    apply_source_mutation(monkeypatch, attention, ">= (keys // block_length)", "> (keys // block_length)")
    monkeypatch.setattr(paged_step, "block_causal_mask", attention.block_causal_mask)  # its own binding
    run = check_parity(_llm(tiny_model_dir, "batched"), reference, prompts, params)
    assert len(run.mismatches) >= len(prompts) // 2, run.mismatches
