"""Training matches inference for the hybrid (`clover_moe`) default model: every noisy block of a training batch
gets exactly the output rows the reference decode computes for that block (causal prefix, then a preview against
its state), with and without the prediction shift, and only answer positions are ever masked; the next-token loss
reads every reply token (of every turn) from the causal row before it, as `DenseClover.forward_causal` gives it."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from diffuserve.eval.tasks import Example
from diffuserve.model.families.clover_moe.config import hybrid_args
from diffuserve.model.families.clover_moe.dense import DenseClover
from scripts.training.clover_moe_model import clover_moe_config, init_clover_moe
from scripts.training.diffusion_batch import IM_END, MASK, encode_conversation, encode_example, encode_prompt
from scripts.training.hybrid_batch import build_hybrid_batch
from scripts.training.hybrid_forward import hybrid_losses, hybrid_training_forward, next_token_rows, predicting_rows

TINY_HYBRID = dict(
    hidden_size=32,
    num_hidden_layers=4,
    full_attention_interval=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    partial_rotary_factor=0.5,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    linear_key_head_dim=8,
    linear_value_head_dim=8,
    linear_conv_kernel_dim=4,
    num_experts=4,
    num_experts_per_tok=2,
    moe_intermediate_size=16,
    shared_expert_intermediate_size=16,
    vocab_size=272,
    block_length=4,
    max_position_embeddings=256,
)
EXAMPLES = [
    Example("t", "Copy abcdefghij", "abcdefghij"),
    Example("t", "What is 1+2?", "3"),
    Example("t", "Sort 3 1 2", "1 2 3"),
]
CONVERSATIONS = [[EXAMPLES[0]], EXAMPLES[1:], [EXAMPLES[2], EXAMPLES[1], EXAMPLES[0]]]
"""One, two and three turns: only the last turn is noised, the earlier ones are its prompt."""


def _perturbed_model(shift: bool):
    """A tiny model whose preview tensors are away from their neutral init, so every term is exercised."""
    _, model = init_clover_moe(clover_moe_config({**TINY_HYBRID, "diffusion_prediction_shift": shift}), seed=0)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(("conv_right_weight", "bd_softmax_history_bias", "bd_softmax_history_c")):
                param.copy_(torch.randn(param.shape, generator=generator))
    return model.eval()


@pytest.mark.parametrize("shift", [True, False])
def test_noisy_blocks_get_the_rows_the_reference_decode_reads(shift):
    model = _perturbed_model(shift)
    assert hybrid_args(model.args).prediction_shift is shift
    block = model.args.block_length
    encoded = [encode_conversation(turns, block) for turns in CONVERSATIONS]
    batch = build_hybrid_batch(encoded, block, torch.Generator().manual_seed(0), num_copies=2)
    with torch.no_grad():
        clean, noisy = hybrid_training_forward(model, batch)
        rows = predicting_rows(model, clean, noisy, batch)
        for m, (row, index) in enumerate(zip(batch.noisy_rows.tolist(), batch.noisy_blocks.tolist())):
            ids, start = encoded[row][0], index * block
            # The engine's view (reference_clover_moe): the clean prefix causally, then the noisy block previewed.
            hidden, state = DenseClover(model).forward_causal(torch.tensor([ids[:start]]))
            preview = DenseClover(model).forward_preview(batch.noisy_ids[m : m + 1], state)[0]
            expected = torch.cat([hidden[0, -1:], preview[:-1]]) if shift else preview
            torch.testing.assert_close(noisy[m], preview, rtol=1e-4, atol=1e-5)
            torch.testing.assert_close(rows[m], expected, rtol=1e-4, atol=1e-5)
        full, _ = DenseClover(model).forward_causal(batch.clean_ids)
        torch.testing.assert_close(clean, full, rtol=1e-4, atol=1e-5)
    assert len(batch.noisy_ids) == 2 * sum((len(ids) - n // block * block) // block for ids, n in encoded)


def test_only_answer_positions_are_masked():
    block = 4
    encoded = [encode_example(e, block) for e in EXAMPLES * 10]
    batch = build_hybrid_batch(encoded, block, torch.Generator().manual_seed(1), num_copies=3)
    positions = batch.noisy_blocks[:, None] * block + torch.arange(block)
    masked = batch.noisy_ids == MASK
    assert masked.any(dim=1).all()  # every noisy block masks at least one answer position
    for m, row in enumerate(batch.noisy_rows.tolist()):
        ids, num_prompt = encoded[row]
        assert (positions[m][masked[m]] >= num_prompt).all()
        clean = torch.tensor(ids)[positions[m]]
        assert (batch.targets[m][masked[m]] == clean[masked[m]]).all()
        assert (batch.targets[m][~masked[m]] == -100).all()
        assert (batch.noisy_ids[m][~masked[m]] == clean[~masked[m]]).all()
        assert (batch.clean_ids[row, : len(ids)] == torch.tensor(ids)).all()


def test_next_token_loss_reads_every_reply_token_from_the_causal_row_before_it():
    """The next-token logits are forward_causal's row p - 1 of each conversation alone (no padding), at every
    reply token p of every turn (its <|im_end|> included, no prompt token, no padding)."""
    model = _perturbed_model(True)
    block = model.args.block_length
    encoded = [encode_conversation(turns, block) for turns in CONVERSATIONS]
    batch = build_hybrid_batch(encoded, block, torch.Generator().manual_seed(0), num_copies=1)
    expected_logits, expected_tokens = [], []
    with torch.no_grad():
        rows, tokens = next_token_rows(hybrid_training_forward(model, batch)[0], batch)
        for (ids, _), turns in zip(encoded, CONVERSATIONS):
            hidden, _ = DenseClover(model).forward_causal(torch.tensor([ids]))
            for i, turn in enumerate(turns):
                start = len(encode_prompt(turn.prompt, turns[:i]))  # the turn's reply starts here
                reply = [*turn.answer.encode(), IM_END]
                assert ids[start : start + len(reply)] == reply
                expected_logits.append(model.compute_logits(hidden[0, start - 1 : start - 1 + len(reply)]))
                expected_tokens += reply
        expected = torch.cat(expected_logits)
        torch.testing.assert_close(model.compute_logits(rows), expected, rtol=1e-4, atol=1e-5)
        assert tokens.tolist() == expected_tokens
        loss = hybrid_losses(model, batch)["next_token"]
        torch.testing.assert_close(loss, F.cross_entropy(expected, torch.tensor(expected_tokens)), rtol=1e-4, atol=1e-5)
