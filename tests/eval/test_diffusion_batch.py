"""Training matches inference for the SDAR-MoE-shaped family (`--family sdar`): the two-stream batch gives every
noisy block exactly the hidden states the engine's reference decode computes for that block, and only answer
positions are ever masked."""

from __future__ import annotations

import torch

from diffuserve.eval.tasks import Example, heldout_examples
from diffuserve.model.layers.attention import DenseAttentionInputs, block_causal_mask
from diffuserve.model.step_inputs import StepInputs
from diffuserve.reference.byte_tokenizer import write_byte_tokenizer
from diffuserve.text.chat_template import chat_token_ids
from diffuserve.text.tokenizer import Tokenizer
from scripts.training.diffusion_batch import MASK, build_batch, encode_example, encode_prompt
from scripts.training.sdar_model import init_sdar, sdar_config

TINY = dict(
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    num_experts=4,
    num_experts_per_tok=2,
    moe_intermediate_size=16,
    intermediate_size=32,
    vocab_size=272,
    block_length=4,
    max_position_embeddings=256,
)
EXAMPLES = [
    Example("t", "Copy abcdefghij", "abcdefghij"),
    Example("t", "What is 1+2?", "3"),
    Example("t", "Sort 3 1 2", "1 2 3"),
]


def test_prompt_encoding_matches_the_chat_template(tmp_path):
    write_byte_tokenizer(tmp_path, 272)
    tokenizer = Tokenizer(tmp_path)
    examples = heldout_examples(3)
    for example in examples:
        assert encode_prompt(example.prompt) == chat_token_ids(tokenizer, [{"role": "user", "content": example.prompt}])
    # A later turn: the history as `diffuserve chat` sends it back (each reply as the assistant's message).
    history = [
        {"role": role, "content": text}
        for e in examples[:2]
        for role, text in (("user", e.prompt), ("assistant", e.answer))
    ]
    messages = [*history, {"role": "user", "content": examples[2].prompt}]
    assert encode_prompt(examples[2].prompt, examples[:2]) == chat_token_ids(tokenizer, messages)


def test_noisy_blocks_see_what_the_engine_sees():
    block = TINY["block_length"]
    _, model = init_sdar(sdar_config(TINY), seed=0)
    encoded = [encode_example(e, block) for e in EXAMPLES]
    batch = build_batch(encoded, block, torch.Generator().manual_seed(0), num_copies=2)
    with torch.no_grad():
        hidden = model(batch.input_ids, batch.positions, StepInputs(batch.attention))
        checked = 0
        for row, (ids, num_prompt) in enumerate(encoded):
            noisy_start = len(ids)
            for start in [*range(num_prompt // block * block, len(ids), block)] * 2:
                end = start + block
                noisy = batch.input_ids[row, noisy_start : noisy_start + block]
                # The engine's view: clean tokens before the block, the noisy block, block-causal mask.
                tokens = torch.tensor(ids[:start] + noisy.tolist())
                positions = torch.arange(end)
                mask = block_causal_mask(positions, end, block)[None, None]
                expected = model(tokens[None], positions[None], StepInputs(DenseAttentionInputs(mask)))[0, start:end]
                torch.testing.assert_close(hidden[row, noisy_start : noisy_start + block], expected)
                noisy_start += block
                checked += 1
    assert checked == 16


def test_only_answer_positions_are_masked():
    block = 4
    encoded = [encode_example(e, block) for e in EXAMPLES * 20]
    batch = build_batch(encoded, block, torch.Generator().manual_seed(1), num_copies=3)
    num_masked = []
    for row, (ids, num_prompt) in enumerate(encoded):
        noisy_start = len(ids)
        noisy_positions = batch.positions[row, noisy_start:]
        masked = batch.input_ids[row, noisy_start:] == MASK
        assert (noisy_positions[masked] >= num_prompt).all()
        targets = batch.targets[row, noisy_start:]
        assert (targets[masked] == torch.tensor(ids)[noisy_positions[masked]]).all()
        assert (targets[~masked] == -100).all()
        assert (batch.targets[row, :noisy_start] == -100).all()
        num_masked.append(int(masked.sum()))
    # 3 copies of 2..4 blocks, each block with 1..n masked: every count in range occurs.
    assert min(num_masked) >= 6 and max(num_masked) > 20
