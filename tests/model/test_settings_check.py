"""Unknown settings are never silent: a config.json key or checkpoint tensor that looks like a diffusion or routing
setting the engine does not implement is one warning line at load naming it; `--strict-config` (and
`LLM(strict_config=True)`) makes it an error, exit 1 with that line. Checkpoints as transformers writes them
raise nothing."""

from __future__ import annotations

import json
import logging

import pytest
import torch
from safetensors.torch import load_file, save_file

from diffuserve.cli.main import main
from diffuserve.model.loader import load_args, load_model
from diffuserve.model.settings_check import StrictConfigError
from diffuserve.reference.clover_moe_checkpoint import make_clover_moe_config, write_clover_moe_checkpoint

INSTEAD = "per-token top-k routing over all experts"


def _clover(tmp_path, name: str, **extra):
    config = make_clover_moe_config(**extra)
    return write_clover_moe_checkpoint(tmp_path / name, config, seed=0)


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def test_a_coreset_key_is_one_warning_naming_it(tmp_path, caplog):
    model_dir = _clover(tmp_path, "m", coreset_temperature=48, bd_softmax_temperature=0.5, frobnicate=1)
    with caplog.at_level(logging.WARNING):
        load_model(model_dir)
        load_args(model_dir)  # a second load of the same directory says nothing new
    lines = _warnings(caplog)
    assert len(lines) == 3, lines
    coreset = next(line for line in lines if "`coreset_temperature` = 48" in line)
    assert "diffusion or routing setting" in coreset and INSTEAD in coreset and "\n" not in coreset
    assert any("`bd_softmax_temperature` = 0.5" in line for line in lines)
    assert any("does not read `frobnicate`" in line for line in lines)


def test_an_unimplemented_diffusion_tensor_is_reported_and_not_loaded(tmp_path, caplog):
    model_dir = _clover(tmp_path, "t")
    state = load_file(model_dir / "model.safetensors")
    state["model.layers.0.mlp.coreset_logit_bias"] = torch.zeros(8)
    save_file(state, str(model_dir / "model.safetensors"), metadata={"format": "pt"})
    with caplog.at_level(logging.WARNING):
        load_model(model_dir)  # loads: the tensor is left out instead of an "unexpected weight" error
    (line,) = _warnings(caplog)
    assert "tensor `model.layers.0.mlp.coreset_logit_bias`" in line and "not loaded" in line
    with pytest.raises(StrictConfigError, match="coreset_logit_bias"):
        load_args(model_dir, strict_config=True)


def test_strict_config_exits_1_with_the_line(tmp_path, capsys):
    model_dir = _clover(tmp_path, "s", coreset_temperature=48)
    code = main(["generate", "hello", "--model", str(model_dir), "--strict-config", "--max-tokens", "4"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1
    assert len(err) == 1 and "`coreset_temperature` = 48" in err[0] and "--strict-config" in err[0], err


def test_llm_option(tmp_path):
    from diffuserve import LLM

    with pytest.raises(StrictConfigError, match="bd_softmax_temperature"):
        LLM(str(_clover(tmp_path, "l", bd_softmax_temperature=0.5)), strict_config=True)


def test_known_layouts_are_quiet(tmp_path, caplog):
    """config.json as transformers writes it (every default key), ours and the Hub's nested text_config."""
    transformers = pytest.importorskip("transformers")
    config = transformers.Qwen3_5MoeTextConfig(
        vocab_size=96,
        hidden_size=32,
        num_hidden_layers=4,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        linear_num_key_heads=1,
        linear_num_value_heads=2,
        linear_key_head_dim=8,
        linear_value_head_dim=8,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=16,
        shared_expert_intermediate_size=16,
    )
    transformers.Qwen3_5MoeForCausalLM(config).save_pretrained(tmp_path / "hf")
    nested = _clover(tmp_path, "nested")
    flat = json.loads((nested / "config.json").read_text())
    top = {k: flat.pop(k) for k in ("architectures", "model_type", "torch_dtype", "block_length", "mask_token_id")}
    (nested / "config.json").write_text(json.dumps({**top, "text_config": flat}))
    with caplog.at_level(logging.WARNING):
        load_args(tmp_path / "hf", strict_config=True)
        load_args(nested, strict_config=True)
    assert not _warnings(caplog)
