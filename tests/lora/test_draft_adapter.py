"""A draft adapter (`draft_adapter`) under verified decoding, on a tiny random Clover: it changes the drafts (the
acceptance differs from the base model's drafts) and never the output, which stays the model's autoregressive one
(the same weights without the diffusion tensors), in a batch mixing verified, auto and plain requests and one with an
adapter of its own. Applied to the causal rows as well, it would change the tokens."""

from __future__ import annotations

import pytest

from diffuserve import LLM, LoRARequest, SamplingParams
from diffuserve.worker import model_runner
from tests.engine.test_oracle_mutations import apply_source_mutation
from tests.engine.test_verified_decoding import PROMPTS, _checkpoints, _generate, _greedy
from tests.lora.adapters import adapter_for_checkpoint


@pytest.fixture(scope="module")
def clover(tmp_path_factory):
    root = tmp_path_factory.mktemp("draft-adapter")
    bd, ar = _checkpoints(root, 4)
    return bd, ar, adapter_for_checkpoint(bd, root / "draft", rank=4, seed=3)


def _drafts(outputs) -> list:
    """Every request's denoising trace: the tokens each step drafted."""
    return [[step.writes for step in o.outputs[0].denoising_steps] for o in outputs]


def test_a_draft_adapter_changes_the_drafts_not_the_output(clover):
    bd, ar, draft = clover
    want, _ = _generate(ar, PROMPTS, _greedy(16))
    params = _greedy(16, decoder="verified", record_denoising=True)
    base: list = []
    plain, _ = _generate(bd, PROMPTS, params, base)
    adapted: list = []
    got, _ = _generate(bd, PROMPTS, params, adapted, draft_adapter=str(draft))
    assert plain == want and got == want
    assert _drafts(adapted) != _drafts(base)  # the adapter reached the drafts


def test_a_mixed_batch_with_a_draft_adapter_keeps_every_reading(clover, tmp_path):
    bd, _, draft = clover
    own = adapter_for_checkpoint(bd, tmp_path / "own", rank=2, seed=7)
    llm = LLM(str(bd), device="cpu", max_model_len=128, draft_adapter=str(draft), enable_lora=True)
    params = [_greedy(12, decoder=d) for d in ("verified", "auto", "threshold", "verified")]
    lora = [None, None, None, LoRARequest("own", 1, str(own))]
    mixed = [list(o.outputs[0].token_ids) for o in llm.generate(PROMPTS[:4], params, lora_request=lora)]
    base = LLM(str(bd), device="cpu", max_model_len=128, enable_lora=True)
    alone = [
        list(base.generate([p], [s], lora_request=r)[0].outputs[0].token_ids)
        for p, s, r in zip(PROMPTS[:4], params, lora, strict=True)
    ]
    assert mixed == alone


def test_the_draft_adapter_on_the_causal_rows_changes_the_tokens(clover, monkeypatch):
    bd, ar, draft = clover
    want, _ = _generate(ar, PROMPTS, _greedy(16))
    apply_source_mutation(
        monkeypatch,
        model_runner,
        "runs.append((len(ids), adapter_slot(request)))",
        "runs.append((len(ids), draft_slot or adapter_slot(request)))",
    )
    got, _ = _generate(bd, PROMPTS, _greedy(16, decoder="verified"), draft_adapter=str(draft))
    assert got != want


def test_without_enable_lora_a_draft_adapter_serves_no_request_adapter(clover):
    bd, _, draft = clover
    llm = LLM(str(bd), device="cpu", max_model_len=128, draft_adapter=str(draft))
    with pytest.raises(ValueError, match="--enable-lora"):
        llm.generate([PROMPTS[0]], _greedy(4), lora_request=LoRARequest("x", 1, str(draft)))


def test_the_bundled_draft_adapter_keeps_the_replies_and_raises_the_tokens_per_forward():
    from diffuserve.eval.harness import evaluate
    from diffuserve.eval.tasks import heldout_examples
    from diffuserve.model.default_model import DEFAULT_DRAFT_ADAPTER_DIR, DEFAULT_DRAFT_BLOCK_LENGTH, DEFAULT_MODEL_DIR

    examples, verified = heldout_examples(4), SamplingParams(decoder="verified")
    model, block = str(DEFAULT_MODEL_DIR), DEFAULT_DRAFT_BLOCK_LENGTH
    default = evaluate(LLM(model), examples, verified)
    without = evaluate(LLM(model, block_length=block), examples, verified)
    adapted = evaluate(LLM(model, block_length=block, draft_adapter=str(DEFAULT_DRAFT_ADAPTER_DIR)), examples, verified)
    assert default.replies == without.replies == adapted.replies
    assert adapted.tokens_per_forward > max(default.tokens_per_forward, without.tokens_per_forward)
