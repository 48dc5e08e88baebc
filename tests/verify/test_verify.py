"""`diffuserve verify` against checkpoints that carry their own modeling code (tests/verify/remote_code.py): a
faithful copy agrees (exit 0), a copy that differs in one layer parts at that layer (exit 1), and without
--trust-remote-code the code is refused in one line and transformers' built-in class runs instead."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open

from diffuserve.cli.main import main
from diffuserve.reference.clover_moe_checkpoint import make_clover_moe_config, write_clover_moe_checkpoint
from diffuserve.reference.llada2_checkpoint import write_llada2_checkpoint
from diffuserve.verify.layer_view import layer_of, write_layer_view
from tests.verify.remote_code import add_remote_code

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.hf


def _needs_qwen3_5() -> None:
    if not hasattr(transformers, "Qwen3_5MoeForCausalLM"):
        pytest.skip(f"transformers {transformers.__version__} has no Qwen3.5-MoE (Clover's base; 5.x has it)")


def _clover(tmp_path, name: str, layers: int = 4, **perturb):
    _needs_qwen3_5()
    config = make_clover_moe_config(num_hidden_layers=layers)
    model_dir = write_clover_moe_checkpoint(tmp_path / name, config, seed=3, init_std=0.1)
    return add_remote_code(model_dir, "clover_moe", **perturb)


def _sdar_moe(tmp_path, name: str, **perturb):
    """A Qwen3-MoE checkpoint written by transformers, named as SDAR-MoE's are, with its own code."""
    config = transformers.Qwen3MoeConfig(
        vocab_size=96,
        hidden_size=64,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        intermediate_size=96,
        num_experts=8,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        norm_topk_prob=True,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    model = transformers.Qwen3MoeForCausalLM(config)
    with torch.no_grad():
        for param in model.parameters():
            param.normal_(0, 0.1)
    model.save_pretrained(tmp_path / name)
    fields = json.loads((tmp_path / name / "config.json").read_text())
    # model_type stays qwen3_moe: transformers keys its per-expert -> fused conversion on it, which the test's
    # code (a transformers 5 subclass) needs; the family is chosen by `architectures`.
    fields.update(architectures=["SDARMoeForCausalLM"], mask_token_id=95, block_length=4)
    (tmp_path / name / "config.json").write_text(json.dumps(fields))
    return add_remote_code(tmp_path / name, "qwen3_moe", **perturb)


def _verify(capsys, model_dir, *flags: str) -> tuple[int, dict, str]:
    code = main(["verify", str(model_dir), "--max-new-tokens", "3", "--json", *flags])
    out, err = capsys.readouterr()
    return code, json.loads(out), err


@pytest.mark.parametrize("kind", ["clover", "sdar_moe"])
def test_faithful_remote_code_agrees(tmp_path, capsys, kind):
    model_dir = _clover(tmp_path, "clover_ok") if kind == "clover" else _sdar_moe(tmp_path, "sdar_ok")
    code, result, _ = _verify(capsys, model_dir, "--trust-remote-code")
    assert code == 0, result["verdict"]
    assert "the checkpoint's own code, via auto_map" in result["reference"]
    assert result["verdict"] == "agree" and all(g["agrees"] for g in result["greedy"])
    assert len(result["hidden_states"]) == (4 if kind == "clover" else 3)
    assert result["block_steps"]["compared"] is False


@pytest.mark.parametrize(
    "kind, perturb, layer",
    [
        ("clover", dict(layer=2, norm_eps=1e-2), "layer 2 (linear_attention)"),
        ("clover", dict(layer=3, ungated_shared_expert=True), "layer 3 (full_attention)"),
        ("sdar_moe", dict(layer=1, norm_eps=1e-2), "layer 1"),
    ],
)
def test_perturbed_remote_code_parts_at_its_layer(tmp_path, capsys, kind, perturb, layer):
    model_dir = (
        _clover(tmp_path, f"clover_p{perturb['layer']}", **perturb)
        if kind == "clover"
        else _sdar_moe(tmp_path, "sdar_perturbed", **perturb)
    )
    code, result, _ = _verify(capsys, model_dir, "--trust-remote-code")
    assert code == 1
    assert result["verdict"].startswith(f"part at hidden state, {layer}:"), result["verdict"]
    earlier = [c["agrees"] for c in result["hidden_states"][: perturb["layer"]]]
    assert all(earlier) and not result["hidden_states"][perturb["layer"]]["agrees"]


@pytest.mark.parametrize("variant, code", [("faithful", 0), ("ar_shift", 1)])
def test_one_block_through_the_references_generate(tmp_path, capsys, variant, code):
    """The checkpoint's code carries LLaDA2's block-diffusion generate (restated in the test's module): one block
    of it against the engine, token for token; a loop that predicts each position from the row before it parts."""
    model_dir = _sdar_moe(tmp_path, f"sdar_generate_{variant}", block_generate=variant)
    got, result, _ = _verify(capsys, model_dir, "--trust-remote-code")
    block = result["block_steps"]
    assert block["found"] == ["generate(block_length=...)"] and block["compared"], block
    assert len(block["reference"]) == 4 and all(t != 95 for t in block["reference"])  # 4 tokens, no mask left
    assert got == code and block["agrees"] == (code == 0)
    if code:
        assert result["verdict"] == "part at one block of block-diffusion decoding"


def test_a_reference_that_reads_its_mask_as_booleans_agrees_and_says_so(tmp_path, capsys):
    """SDAR's convention: an additive mask read with `.bool()` is inside out; verify finds the boolean one agrees
    instead of reporting a false part at layer 0."""
    model_dir = _sdar_moe(tmp_path, "sdar_bool_mask", reads_bool_mask=True)
    code, result, _ = _verify(capsys, model_dir, "--trust-remote-code")
    assert code == 0, result["verdict"]
    said = [n for n in result["notes"] if n.startswith("attention mask given the reference")]
    assert said == [
        "attention mask given the reference: boolean (True = attend) (tried: additive 0 / -inf: parted at hidden "
        "state, layer 0; boolean (True = attend): agreed)"
    ]


def test_without_trust_remote_code_the_code_is_refused_in_one_line(tmp_path, capsys):
    """The perturbed code would part; refused, it never runs, and the built-in Qwen3.5-MoE agrees."""
    model_dir = _clover(tmp_path, "clover_refused", layer=2, norm_eps=1e-2)
    code, result, err = _verify(capsys, model_dir)
    refusal = [line for line in err.splitlines() if line.startswith("verify:")]
    assert len(refusal) == 1 and "--trust-remote-code" in refusal[0] and "auto_map" in refusal[0]
    assert code == 0 and result["reference"].startswith("transformers Qwen3_5MoeForCausalLM")


def test_layers_reads_only_the_first_k(tmp_path, capsys):
    model_dir = _clover(tmp_path, "clover_deep", layers=8, layer=5, norm_eps=1e-2)  # parts only past layer 4
    code, result, _ = _verify(capsys, model_dir, "--trust-remote-code", "--layers", "4")
    assert code == 0 and result["layers"] == 4 and len(result["hidden_states"]) == 4
    assert main(["verify", str(model_dir), "--trust-remote-code", "--layers", "3"]) == 2  # no attention layer
    assert "pass at least 4" in capsys.readouterr().err


def test_layer_view_holds_only_the_first_k_layers(tmp_path):
    _needs_qwen3_5()
    model_dir = write_clover_moe_checkpoint(
        tmp_path / "m", make_clover_moe_config(num_hidden_layers=8), max_shard_bytes=100_000
    )
    view = write_layer_view(model_dir, 4, tmp_path / "view")
    names = [n for file in view.glob("*.safetensors") for n in safe_open(str(file), "pt").keys()]  # noqa: SIM118
    layers = {layer_of(n) for n in names} - {None}
    assert layers == {0, 1, 2, 3} and "lm_head.weight" in names and "model.embed_tokens.weight" in names
    index = json.loads((view / "model.safetensors.index.json").read_text())["weight_map"]
    assert sorted(index) == sorted(names)
    assert json.loads((view / "config.json").read_text())["num_hidden_layers"] == 4
    assert (view / "tokenizer.json").is_symlink()


def test_no_reference_exits_2(tmp_path, capsys):
    """transformers has no LLaDA2 class, and this checkpoint names no code of its own."""
    code, result, _ = _verify(capsys, write_llada2_checkpoint(tmp_path / "llada2"))
    assert code == 2 and result["reference"] is None and "llada2" in result["reason"]
