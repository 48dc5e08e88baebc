"""The sdar family's names: our writers name `SDARMoeForCausalLM` / `SDARForCausalLM`; directories written under the
family's old name `CloverForBlockDiffusion` (before Clover meant the published `clover_moe` model) still load,
exactly as before, with one deprecation line; the old preset names `clover-*` map to the `sdar-moe-*` shapes."""

from __future__ import annotations

import json
import logging

import torch

from diffuserve import LLM, SamplingParams
from diffuserve.model.loader import load_args, load_model
from diffuserve.reference.random_checkpoint import make_config, resolve_preset, write_random_checkpoint

PARAMS = SamplingParams(max_tokens=12, ignore_eos=True, threshold=0.7)
PROMPTS = [{"prompt_token_ids": [5, 9, 200, 17, 3]}, {"prompt_token_ids": [44, 1]}]


def _deprecation_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "deprecated" in r.getMessage()]


def test_writers_name_the_sdar_architectures():
    moe = make_config("sdar-moe-tiny")
    dense = make_config("sdar-moe-tiny", num_experts=0)
    assert (moe["architectures"], moe["model_type"]) == (["SDARMoeForCausalLM"], "sdar_moe")
    assert (dense["architectures"], dense["model_type"]) == (["SDARForCausalLM"], "sdar")


def test_an_old_clover_directory_loads_as_before_with_one_deprecation_line(tmp_path, caplog):
    new = write_random_checkpoint(tmp_path / "new", make_config("sdar-moe-tiny"), seed=3, logit_scale=40.0)
    old_config = make_config("sdar-moe-tiny", architecture="CloverForBlockDiffusion", model_type="clover")
    old = write_random_checkpoint(tmp_path / "old", old_config, seed=3, logit_scale=40.0)
    assert json.loads((old / "config.json").read_text())["architectures"] == ["CloverForBlockDiffusion"]
    with caplog.at_level(logging.WARNING):
        old_llm = LLM(str(old), num_pages=64)  # reads the config twice: the args, then the executor's load
        old_tokens = [o.outputs[0].token_ids for o in old_llm.generate(PROMPTS, PARAMS)]
    lines = _deprecation_lines(caplog)
    assert len(lines) == 1, lines
    assert "\n" not in lines[0]
    assert "'CloverForBlockDiffusion'" in lines[0] and '"architectures": ["SDARMoeForCausalLM"]' in lines[0]
    assert '"model_type": "sdar_moe"' in lines[0]

    caplog.clear()
    with caplog.at_level(logging.WARNING):
        new_tokens = [o.outputs[0].token_ids for o in LLM(str(new), num_pages=64).generate(PROMPTS, PARAMS)]
    assert _deprecation_lines(caplog) == []
    assert old_tokens == new_tokens
    (old_family, old_args), (new_family, new_args) = load_args(old), load_args(new)
    assert old_family is new_family and old_family.name == "sdar"
    assert old_args.replace(architecture="SDARMoeForCausalLM") == new_args
    old_state, new_state = load_model(old)[1].state_dict(), load_model(new)[1].state_dict()
    assert old_state.keys() == new_state.keys()
    assert all(torch.equal(old_state[k], new_state[k]) for k in old_state)


def test_an_old_dense_clover_directory_is_told_the_dense_name(tmp_path, caplog):
    config = make_config("sdar-moe-tiny", architecture="CloverForBlockDiffusion", num_experts=0)
    old = write_random_checkpoint(tmp_path / "old-dense", config)
    with caplog.at_level(logging.WARNING):
        load_args(old)
    (line,) = _deprecation_lines(caplog)
    assert '"architectures": ["SDARForCausalLM"]' in line and '"model_type": "sdar"' in line


def test_an_old_preset_name_maps_to_the_new_one_with_one_deprecation_line(caplog):
    with caplog.at_level(logging.WARNING):
        assert resolve_preset("clover-bench") == "sdar-moe-bench"
    (line,) = _deprecation_lines(caplog)
    assert "'clover-bench'" in line and "'sdar-moe-bench'" in line and "\n" not in line
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        assert make_config("clover-tiny", block_length=8) == make_config("sdar-moe-tiny", block_length=8)
    assert len(_deprecation_lines(caplog)) == 1
    assert resolve_preset("sdar-moe-tiny") == "sdar-moe-tiny"
