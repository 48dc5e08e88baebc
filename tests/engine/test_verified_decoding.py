"""Verified decoding (decoder=verified) on tiny random Clover checkpoints with the block-diffusion tensors: at
temperature 0 its tokens equal transformers' greedy `generate` on the same weights and the engine's own
autoregressive decoding (the same weights without the diffusion tensors), for a batch of mixed-length prompts
sharing a prefix, blocks of 4 (under a page and state budget that forces preemption) and of 32. The drafts of
random weights are mostly wrong, so most blocks are rejected somewhere and rolled back: keeping one token past the
first disagreement, or leaving the GDN state advanced over a rejected draft, changes the tokens."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from diffuserve import LLM, SamplingParams
from diffuserve.core.writes import BlockWrite
from diffuserve.decoding import registry, verified
from diffuserve.decoding.protocol import BlockDecode
from diffuserve.decoding.registry import DecoderRegistry
from diffuserve.errors import RequestError, UnsupportedParameter
from diffuserve.model.families.clover_moe.gdn_preview import DIFFUSION_TENSORS
from diffuserve.model.interface import StepRules
from diffuserve.reference.clover_moe_checkpoint import make_clover_moe_config, write_clover_moe_checkpoint
from diffuserve.structured_outputs import StructuredOutputsParams
from diffuserve.worker.cache import state_step
from tests.engine.test_oracle_mutations import apply_source_mutation

PREFIX = [5, 9, 11, 40, 41, 42, 7, 8, 100, 101, 102, 103, 13, 14, 15, 16, 17]
PROMPTS = [PREFIX + [60 + i] * (i % 5) + [i] for i in range(8)]
MUTATIONS = {  # (module, code, mutated code, the verified requests' parameters: plain drafts are checked together)
    "one token past the first disagreement": (
        verified,
        "else (rejected, target[rejected])",
        "else (min(rejected + 1, len(drafts) - 1), target[rejected])",
        {},
    ),
    "one token past the first disagreement, drafts checked alone": (
        verified,
        "else (rejected, target[rejected])",
        "else (min(rejected + 1, len(drafts) - 1), target[rejected])",
        dict(logprobs=1),
    ),
    "no GDN rollback": (
        state_step,
        "t.index_copy_(0, slots, copy[index])",
        "pass",
        {},
    ),
}


def _checkpoints(root, block_length: int):
    """(with the diffusion tensors, the same weights without them)."""
    config = make_clover_moe_config(block_length=block_length)
    bd = write_clover_moe_checkpoint(root / "bd", config, seed=12, init_std=0.1, logit_scale=10.0)
    ar = root / "ar"
    shutil.copytree(bd, ar)
    state = load_file(str(ar / "model.safetensors"))
    kept = {name: t for name, t in state.items() if name.rsplit(".", 1)[-1] not in DIFFUSION_TENSORS}
    save_file(kept, str(ar / "model.safetensors"), metadata={"format": "pt"})
    return bd, ar


@pytest.fixture(scope="module")
def block4(tmp_path_factory):
    return _checkpoints(tmp_path_factory.mktemp("verified4"), 4)


def _generate(model_dir, prompts, params, outputs: list | None = None, **kwargs) -> tuple[list[list[int]], LLM]:
    """Each prompt's tokens and the LLM; the RequestOutputs are appended to `outputs` when given."""
    llm = LLM(str(model_dir), device="cpu", **{"max_model_len": 128, **kwargs})
    results = llm.generate(prompts, params)
    if outputs is not None:
        outputs += results
    return [list(out.outputs[0].token_ids) for out in results], llm


def _greedy(max_tokens: int, **changes) -> SamplingParams:
    return SamplingParams(
        **{"temperature": 0.0, "max_tokens": max_tokens, "ignore_eos": True, "threshold": 0.5, **changes}
    )


def _verified_under_preemption(model_dir, outputs: list | None = None, **changes):
    """Block 4, 16-token pages: 5 pages and 4 state slots for 8 requests of up to 34 positions (3 pages each)."""
    probe = LLM(str(model_dir), device="cpu", max_model_len=128)
    slot = probe.engine.state_pool.slot_bytes
    params = _greedy(12, decoder="verified", **changes)
    return _generate(model_dir, PROMPTS, params, outputs, num_pages=5, state_cache_memory=4 * slot)


def test_verified_equals_autoregressive_decoding_under_preemption(block4):
    bd, ar = block4
    want, _ = _generate(ar, PROMPTS, _greedy(12))
    outputs: list = []
    got, llm = _verified_under_preemption(bd, outputs)
    assert got == want
    stats = llm.engine.stats()
    spec = stats.spec_decode
    # per request usage adds up to the engine's counters
    assert sum(o.outputs[0].num_draft_tokens for o in outputs) == spec.num_draft_tokens
    assert sum(o.outputs[0].num_accepted_tokens for o in outputs) == spec.num_accepted_tokens
    assert stats.num_preemptions > 0
    assert spec.num_accepted_tokens < spec.num_draft_tokens  # random weights: one-forward drafts mostly wrong
    assert spec.num_discarded_steps > 0 and stats.prefix_hit_rate > 0
    verifiers = [d for d in llm.engine.runner.decoding.registry.decoders() if isinstance(d, verified.VerifiedDecoder)]
    assert verifiers and not any(d._draft_params for d in verifiers)  # the drafts' parameters leave with the requests
    diffusion, _ = _generate(bd, PROMPTS, _greedy(12, decoder="threshold"))
    assert diffusion != want  # the drafts alone are not the autoregressive output


@pytest.mark.parametrize(
    "engine, changes",
    [
        (dict(fused_commit=False), {}),  # a draft's commit forward carries no block
        (dict(max_num_batched_tokens=8, max_num_seqs=3), {}),  # commits without the block when the budget is short
        ({}, dict(ignore_eos=False, stop_token_ids=[17, 55, 100, 3, 200], min_tokens=3)),  # stops: verified only
    ],
)
def test_verified_equals_autoregressive_decoding_with_engine_options(block4, engine, changes):
    bd, ar = block4
    want, _ = _generate(ar, PROMPTS, _greedy(12, **changes), **engine)
    got, llm = _generate(bd, PROMPTS, _greedy(12, decoder="verified", **changes), **engine)
    assert got == want and llm.engine.stats().spec_decode.num_drafts > 0


def test_drafts_kept_whole_or_cut_anywhere_give_the_same_tokens(block4, monkeypatch):
    """Drafts written by an oracle that knows the autoregressive answer and gets every position p with p % 5 == 3
    wrong: whole blocks are kept (the fused next block goes on), others are cut at any index, the last included."""
    bd, ar = block4
    want, _ = _generate(ar, PROMPTS, _greedy(12))
    answers = {tuple(p): w + [0] * 8 for p, w in zip(PROMPTS, want, strict=True)}

    def oracle(self, request, rows, positions, generators):
        first = request.block_start - request.num_prompt_tokens  # output position of canvas index 0
        answer = answers[tuple(request.prompt_token_ids)]
        accepted = [(i, answer[first + i] + (1 if (request.block_start + i) % 5 == 3 else 0)) for i in positions]
        return BlockDecode(BlockWrite(accepted))

    monkeypatch.setattr(verified.VerifiedDecoder, "decode", oracle)
    got, llm = _verified_under_preemption(bd)
    assert got == want
    spec = llm.engine.stats().spec_decode
    assert 0 < spec.num_discarded_steps < spec.num_drafts  # some blocks kept whole, some cut


def test_verified_is_refused_where_no_causal_row_predicts_the_next_token():
    """SDAR and LLaDA2 (no AR shift) refuse it in one line; logprobs combine with it, and structured output does
    wherever a tokenizer can compile the grammar (the refusal is structured output's own)."""
    params = SamplingParams(decoder="verified", max_tokens=4)
    own_row = DecoderRegistry(StepRules(), 4, torch.device("cpu"), 32)
    with pytest.raises(UnsupportedParameter, match=r"^decoder: verified checks drafts .* from its own row"):
        own_row.resolve(params.with_defaults({}))
    shifted = DecoderRegistry(StepRules(prediction_shift=True, causal_commits=True), 4, torch.device("cpu"), 32)
    assert shifted.resolve(params.with_defaults({})).name == "verified"
    assert shifted.resolve(params.replace(logprobs=2).with_defaults({})).name == "verified"
    regex = params.replace(structured_outputs=StructuredOutputsParams(regex="[ab]+"))
    with pytest.raises(RequestError, match=r"^structured_outputs: this model directory has no tokenizer"):
        shifted.resolve(regex.with_defaults({}))


def test_penalised_verified_decoding_is_the_penalised_autoregressive_output(block4):
    """Each causal row that verifies a position is penalised by the counts of every token before that position:
    the output is the engine's autoregressive reading (block length 1, every token counted before the next) under
    the same penalties, which tests/engine/test_penalties.py checks against the plain-arithmetic reference."""
    bd, ar = block4
    penalties = {"presence_penalty": 1.5, "frequency_penalty": 0.8, "repetition_penalty": 1.3}
    want, _ = _generate(ar, PROMPTS, _greedy(12, **penalties), block_length=1)
    plain, _ = _generate(ar, PROMPTS, _greedy(12), block_length=1)
    got, _ = _generate(bd, PROMPTS, _greedy(12, decoder="verified", **penalties))
    assert want != plain  # the penalties change the autoregressive output
    assert got == want


@pytest.mark.parametrize("mutation", sorted(MUTATIONS))
def test_the_equality_catches_broken_verification(block4, monkeypatch, mutation):
    bd, ar = block4
    want, _ = _generate(ar, PROMPTS, _greedy(12))
    module, code, mutated, changes = MUTATIONS[mutation]
    assert _verified_under_preemption(bd, **changes)[0] == want
    apply_source_mutation(monkeypatch, module, code, mutated)
    got, _ = _verified_under_preemption(bd, **changes)
    assert got != want


@pytest.mark.hf
@pytest.mark.parametrize("block_length", [4, 32])
def test_verified_equals_transformers_greedy(tmp_path, block_length):
    """transformers may pick the mask token, which no engine decoder writes: it is suppressed there too."""
    pytest.importorskip("transformers")
    from tests.model.test_clover_moe_parity import _hf_model

    bd, ar = _checkpoints(tmp_path, block_length)
    prompts = [*PROMPTS[:3], PREFIX * 3]
    got, _ = _generate(bd, prompts, _greedy(36, decoder="verified"))
    hf = _hf_model(bd)
    mask = json.loads((bd / "config.json").read_text())["mask_token_id"]
    with torch.no_grad():
        want = [
            hf.generate(
                torch.tensor([p]),
                attention_mask=torch.ones(1, len(p), dtype=torch.long),
                max_new_tokens=36,
                do_sample=False,
                eos_token_id=None,
                pad_token_id=0,
                suppress_tokens=[mask],
            )[0, len(p) :].tolist()
            for p in prompts
        ]
    assert got == want
    assert _generate(ar, prompts, _greedy(36))[0] == want


@pytest.mark.parametrize("block_length", [4, 32])
def test_every_forward_decides_a_token_so_verified_never_takes_more_forwards(tmp_path, block_length):
    """Random diffusion tensors draft mostly wrong tokens, yet each forward of a verified request decides at least
    one token (its block's head, read from a causal row), so no request takes more forwards than the same
    request decoded autoregressively; and the tokens are the same."""
    bd, ar = _checkpoints(tmp_path, block_length)
    prompts = [*PROMPTS, PREFIX * 2]
    params = _greedy(24, decoder="verified")
    verified_outputs: list = []
    autoregressive_outputs: list = []
    got, _ = _generate(bd, prompts, params, verified_outputs)
    want, _ = _generate(ar, prompts, _greedy(24), autoregressive_outputs)
    assert got == want
    for v, a in zip(verified_outputs, autoregressive_outputs, strict=True):
        assert a.num_forwards == len(a.outputs[0].token_ids) == 24
        assert v.num_forwards <= a.num_forwards


def test_forwards_that_decide_nothing_fail_the_count(tmp_path, monkeypatch):
    """The mutation: the default draft takes several forwards (the threshold policy, one token a step at the least),
    so a forward may decide nothing: the tokens stay right, the forward count does not."""
    bd, ar = _checkpoints(tmp_path, 4)
    want, _ = _generate(ar, PROMPTS, _greedy(24))
    default = 'self._plain["verified"] = VerifiedDecoder(block_length)'
    apply_source_mutation(monkeypatch, registry, default, default.replace("(block_length)", "(block_length, False)"))
    outputs: list = []
    got, _ = _generate(bd, PROMPTS, _greedy(24, decoder="verified"), outputs)
    assert got == want
    assert any(o.num_forwards > 24 for o in outputs)


def test_verified_at_block_length_1_is_the_autoregressive_reading(block4):
    """A block of one position is its head, verified when written: nothing is left to check, so each block ends as
    output at once, in the autoregressive reading's forwards."""
    bd, _ = block4
    verified_outputs: list = []
    reading_outputs: list = []
    got, _ = _generate(bd, PROMPTS, _greedy(12, decoder="verified"), verified_outputs, block_length=1)
    want, _ = _generate(bd, PROMPTS, _greedy(12), reading_outputs, block_length=1)
    assert got == want
    assert [o.num_forwards for o in verified_outputs] == [o.num_forwards for o in reading_outputs]
