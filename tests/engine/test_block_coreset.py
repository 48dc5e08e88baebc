"""Block expert coreset routing: the rule on hand-set probabilities; the engine (requests batched, each block its own
coreset, fused commits routing per token; with expert offload too) against the naive reference's own coreset
routing; a coreset of every expert is today's routing exactly; config.json's key and the flag."""

from __future__ import annotations

import json
import logging
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from diffuserve import LLM, SamplingParams
from diffuserve.model.families.clover_moe.dense import DenseClover
from diffuserve.model.layers.moe.coreset import block_coreset, route_in_coreset
from diffuserve.model.loader import load_model
from diffuserve.reference.clover_moe_checkpoint import make_clover_moe_config, write_clover_moe_checkpoint
from diffuserve.reference.reference_clover_moe import ReferenceSettings, reference_block_decode
from diffuserve.reference.reference_decode import reference_generate
from diffuserve.reference.reference_model import load_reference
from tests.conftest import tiny_checkpoint

PARAMS = SamplingParams(max_tokens=16, ignore_eos=True)
PROMPTS = [[(i * 37 + j * 11) % 300 + 1 for j in range(n)] for i, n in enumerate([3, 6, 9, 5, 2, 7])]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    """16 experts, top-2, every layer MoE, a head soft enough that routing changes the tokens."""
    root = tmp_path_factory.mktemp("coreset")
    overrides = {"num_experts": 16, "num_experts_per_tok": 2, "first_k_dense_replace": 0}
    return tiny_checkpoint(root, "tiny16", block_length=4, logit_scale=10.0, **overrides)


def _tokens(model_dir: Path, **options) -> list[list[int]]:
    llm = LLM(str(model_dir), num_pages=128, max_num_seqs=8, **options)
    return [o.outputs[0].token_ids for o in llm.generate([{"prompt_token_ids": p} for p in PROMPTS], PARAMS)]


def test_the_rule_on_hand_set_probabilities():
    probs = torch.tensor([[0.5, 0.3, 0.1, 0.1], [0.1, 0.2, 0.3, 0.4], [0.1, 0.3, 0.2, 0.4]])
    assert block_coreset(probs, 2).tolist() == [3, 1]  # sums 0.7, 0.8, 0.6, 0.9
    weights, ids = route_in_coreset(probs, torch.tensor([3, 1, 0]), 2)
    assert ids.tolist() == [[0, 1], [3, 1], [3, 1]]
    assert torch.allclose(weights, torch.tensor([[0.625, 0.375], [2 / 3, 1 / 3], [4 / 7, 3 / 7]]))
    assert block_coreset(torch.tensor([[0.25, 0.25, 0.25, 0.25]]), 2).tolist() == [0, 1]  # ties: lower id


@pytest.mark.parametrize("size", [2, 5])
def test_coreset_routing_matches_the_reference_batched(model_dir, size):
    answers = _tokens(model_dir, block_expert_coreset=size)
    reference = load_reference(model_dir, block_expert_coreset=size)
    for prompt, answer in zip(PROMPTS, answers):
        assert answer == reference_generate(reference, prompt, PARAMS).token_ids
    per_token = _tokens(model_dir)
    assert sum(a != b for a, b in zip(answers, per_token)) >= 2


def test_coreset_routing_with_expert_offload(model_dir):
    answers = _tokens(model_dir, block_expert_coreset=2, expert_offload=True)
    reference = load_reference(model_dir, block_expert_coreset=2)
    assert answers == [reference_generate(reference, p, PARAMS).token_ids for p in PROMPTS]


def test_a_coreset_of_every_expert_is_per_token_routing(model_dir):
    per_token = _tokens(model_dir)
    assert _tokens(model_dir, block_expert_coreset=16) == per_token
    assert _tokens(model_dir, block_expert_coreset=0) == per_token


def test_config_json_sets_the_coreset_and_the_flag_overrides_it(model_dir, tmp_path, caplog):
    copy = Path(shutil.copytree(model_dir, tmp_path / "with-coreset"))
    config = json.loads((copy / "config.json").read_text())
    (copy / "config.json").write_text(json.dumps({**config, "expert_coreset_size": 2}))
    with caplog.at_level(logging.WARNING):
        from_config = _tokens(copy)
    assert not [r for r in caplog.records if "expert_coreset_size" in r.getMessage()]  # understood, not reported
    assert from_config == _tokens(model_dir, block_expert_coreset=2)
    assert _tokens(copy, block_expert_coreset=0) == _tokens(model_dir)
    reference = load_reference(copy)  # the reference reads the key on its own
    assert reference.block_expert_coreset == 2


def test_coresets_the_engine_cannot_route_are_refused(model_dir, tiny_llada2_dir):
    with pytest.raises(ValueError, match="block_expert_coreset: 1 is below the 2 experts per token"):
        LLM(str(model_dir), num_pages=16, block_expert_coreset=1)
    with pytest.raises(ValueError, match="block_expert_coreset: -1 is negative; give an integer C >= 0"):
        LLM(str(model_dir), num_pages=16, block_expert_coreset=-1)
    with pytest.raises(ValueError, match="GroupLimitedRouter has none; set 0"):  # a sigmoid router: no distribution
        LLM(str(tiny_llada2_dir), num_pages=16, block_expert_coreset=4)


def test_clover_coreset_routing_matches_its_reference_decoder(tmp_path):
    """The hybrid model: the block's preview routes by the coreset, the causal prefix (commits) per token."""
    config = make_clover_moe_config(block_length=4)  # 8 experts, top-2, a gated shared expert
    model_dir = write_clover_moe_checkpoint(tmp_path / "clover", config, seed=12, init_std=0.1, logit_scale=20.0)
    prompts = [[5, 9, 14], [7, 3, 22, 41, 8, 19], [11]]
    params = SamplingParams(max_tokens=9, ignore_eos=True, threshold=0.5)
    llm = LLM(str(model_dir), device="cpu", max_model_len=256, block_expert_coreset=2)
    got = [o.outputs[0].token_ids for o in llm.generate([{"prompt_token_ids": p} for p in prompts], params)]
    _, model = load_model(model_dir)
    settings = ReferenceSettings(max_new_tokens=9, threshold=0.5, block_expert_coreset=2)
    assert got == [reference_block_decode(DenseClover(model), p, settings) for p in prompts]
    per_token = replace(settings, block_expert_coreset=0)
    assert got != [reference_block_decode(DenseClover(model), p, per_token) for p in prompts]
