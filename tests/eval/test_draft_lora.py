"""The draft adapter's trainer drafts what the engine serves: a `DraftLoRA` on the bundled model, saved in the PEFT
format and loaded by the engine as its draft adapter, gives the engine's one-forward draft of a verified block
exactly the tokens the trainer's own preview predicts (block 8, the length the recipe trains), and the trainer's
loss reads only the preview (the causal trunk it drafts against is the base model's)."""

from __future__ import annotations

import torch

from diffuserve import LLM, SamplingParams
from diffuserve.model.default_model import DEFAULT_MODEL_DIR
from diffuserve.model.families.clover_moe.dense import DenseClover
from diffuserve.model.loader import load_model
from scripts.training.draft_lora import DraftLoRA, anchored_loss

BLOCK = 8


def _random_adapter(model, seed: int) -> DraftLoRA:
    lora = DraftLoRA(model, rank=4, alpha=8.0, seed=seed)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for b in lora.b.values():
            b.copy_(torch.randn(b.shape, generator=generator) * 10)  # B zero would be the base model
    return lora


def _trainer_drafts(model, lora: DraftLoRA, prompt: list[int], mask_token_id: int) -> list[int]:
    """The head (the prompt's last causal row, base weights) and the drafts of the block anchored after it."""
    dense = DenseClover(model)
    with torch.no_grad():
        hidden, state = dense.forward_causal(torch.tensor([prompt]))
        with lora.drafting():
            rows = dense.forward_preview(torch.full((1, BLOCK), mask_token_id), state)[0, : BLOCK - 1]
        logits = model.compute_logits(torch.cat([hidden[0, -1:], rows])).float()  # both before the final norm
    logits[:, mask_token_id] = float("-inf")
    return logits.argmax(-1).tolist()


def test_the_engine_serves_the_drafts_the_trainer_trained(tmp_path):
    args, model = load_model(str(DEFAULT_MODEL_DIR), dtype="float32")
    lora = _random_adapter(model, seed=1)
    lora.save(tmp_path / "draft", "default-model")
    llm = LLM(str(DEFAULT_MODEL_DIR), dtype="float32", block_length=BLOCK, draft_adapter=str(tmp_path / "draft"))
    params = SamplingParams(decoder="verified", max_tokens=BLOCK, ignore_eos=True, record_denoising=True)
    output = llm.chat([[{"role": "user", "content": "What is 27+15?"}]], params)[0]
    first = output.outputs[0].denoising_steps[0]  # the first block's one drafting step
    served = [token for _, token in sorted(first.writes)]
    prompt = list(output.prompt_token_ids or [])
    assert served == _trainer_drafts(model, lora, prompt, args.mask_token_id)
    with torch.no_grad():  # without the adapter (B zero) the draft differs: the adapter is what was compared
        for b in lora.b.values():
            b.zero_()
    assert served != _trainer_drafts(model, lora, prompt, args.mask_token_id)


def test_the_loss_trains_only_the_adapter(tmp_path):
    args, model = load_model(str(DEFAULT_MODEL_DIR), dtype="float32")
    model.requires_grad_(False)
    lora = _random_adapter(model, seed=2)
    ids = list(range(40, 60))
    loss, scored, _ = anchored_loss(model, lora, ids, reply_start=12, mask_token_id=args.mask_token_id, block=BLOCK)
    loss.backward()
    assert scored == sum(min(BLOCK - 1, len(ids) - 1 - a) for a in range(12, len(ids) - 1))
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in lora.parameters())
    assert all(p.grad is None for p in model.parameters())
