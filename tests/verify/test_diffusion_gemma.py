"""`diffuserve verify` on a DiffusionGemma checkpoint (written by transformers' own `save_pretrained`): against
transformers' DiffusionGemmaForBlockDiffusion, one canvas forward after each prompt, layer by layer; an engine
that puts layer 3's decoder scalar on the prompt rows (the encoder's role) parts at layer 3."""

from __future__ import annotations

import json

import pytest

from diffuserve.cli.main import main
from diffuserve.reference.diffusion_gemma_hf import write_hf_checkpoint
from diffuserve.verify import session

transformers = pytest.importorskip("transformers")
if not hasattr(transformers, "DiffusionGemmaForBlockDiffusion"):
    pytest.skip(f"transformers {transformers.__version__} has no DiffusionGemma (5.x has it)", allow_module_level=True)
pytestmark = pytest.mark.hf


def _verify(capsys, model_dir) -> tuple[int, dict]:
    code = main(["verify", str(model_dir), "--json"])
    return code, json.loads(capsys.readouterr().out)


def test_diffusion_gemma_agrees_with_transformers(tmp_path, capsys):
    code, result = _verify(capsys, write_hf_checkpoint(tmp_path / "m", canvas_length=16, seed=5))
    assert code == 0, result["verdict"]
    assert result["reference"] == "transformers DiffusionGemmaForBlockDiffusion (built-in class)"
    assert len(result["hidden_states"]) == 6 and result["logits"]["what"] == "canvas logits"


def test_a_wrong_layer_scalar_parts_at_its_layer(tmp_path, capsys, monkeypatch):
    load_model = session.load_model

    def one_scalar_at_layer_3(*args, **kwargs):
        model_args, model = load_model(*args, **kwargs)
        layer = model.model.layers[3]
        layer.encoder_layer_scalar.copy_(layer.layer_scalar)
        return model_args, model

    monkeypatch.setattr(session, "load_model", one_scalar_at_layer_3)
    code, result = _verify(capsys, write_hf_checkpoint(tmp_path / "m", canvas_length=16, seed=5))
    assert code == 1
    assert result["verdict"].startswith("part at hidden state, layer 3 (prompt: encoder, canvas: decoder):")
