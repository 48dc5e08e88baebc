"""`diffuserve verify` on the models' official files, unmodified (SDAR's modeling file and generate.py, dFactory's
LLaDA2 files with their `generate`, the plain LLaDA2 files dMoE ships beside its block-expert ones), on tiny
seeded checkpoints that register them in `auto_map`: each agrees (exit 0), and a copy perturbed as a release
could differ from the engine parts (exit 1) at the layer the perturbation first acts in, or at the block step
for a perturbed block mask. The files are read from ../shared/reference-code/ beside the repository; without
that folder, the module skips in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from diffuserve.cli.main import main
from diffuserve.reference.official_checkpoints import official_generate, write_official_checkpoint

ROOT = Path(__file__).resolve().parents[2].parent / "shared" / "reference-code"
if not ROOT.is_dir():
    pytest.skip(
        f"no official files at {ROOT} (../shared/reference-code beside the repository)", allow_module_level=True
    )
transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.hf

# file -> (text in the official file, what a perturbed copy has instead)
SDAR_O_PROJ = (
    "modeling_sdar.py",
    "attn_output = self.o_proj(attn_output)",
    "attn_output = self.o_proj(attn_output) * (1.01 if self.layer_idx == 1 else 1.0)",
)
SDAR_NORM_EPS = (
    "modeling_sdar.py",
    "self.input_layernorm = SDARRMSNorm(\n            config.hidden_size, eps=config.rms_norm_eps)",
    "self.input_layernorm = SDARRMSNorm(\n            config.hidden_size, "
    "eps=config.rms_norm_eps * (1e4 if layer_idx == 2 else 1))",
)
LLADA2_SHARED = ("modeling_llada2_moe.py", "y = y + self.shared_experts(identity)", "y = y")
LLADA2_TOPK = (
    "modeling_llada2_moe.py",
    "topk_weight = scores / (scores.sum(dim=-1, keepdim=True) + 1e-20) if self.top_k > 1 else scores",
    "topk_weight = scores",
)
LLADA2_DENSE = (
    "modeling_llada2_moe.py",
    "attn_output = self.dense(attn_output)",
    "attn_output = self.dense(attn_output) * (1.01 if self.layer_idx == 2 else 1.0)",
)
# the block mask causal inside the block (it is bidirectional there)
SDAR_BLOCK_MASK = (
    "generate.py",
    ".repeat_interleave(block_length, dim=1).unsqueeze(0)",
    ".repeat_interleave(block_length, dim=1).tril().unsqueeze(0)",
)
LLADA2_BLOCK_MASK = (
    "modeling_llada2_moe.py",
    ".repeat_interleave(block_length, dim=1)\n            .unsqueeze(0)",
    ".repeat_interleave(block_length, dim=1)\n            .tril()\n            .unsqueeze(0)",
)


def _edit(perturbation: tuple[str, str, str] | None):
    if perturbation is None:
        return None
    file, official, perturbed = perturbation

    def edit(name: str, text: str) -> str:
        if name != file:
            return text
        assert official in text, f"{file} no longer holds {official!r}: update the perturbation"
        return text.replace(official, perturbed)

    return edit


def _verify(tmp_path: Path, capsys, name: str, perturbation=None) -> tuple[int, dict]:
    edit = _edit(perturbation)
    # a directory name of its own: transformers keeps the modules it imported by their directory's name
    model_dir = write_official_checkpoint(name, ROOT, tmp_path / f"{name}_{tmp_path.name[-24:]}", edit=edit)
    generate = official_generate(name, ROOT, tmp_path, edit=edit)
    flags = ["--reference-generate", str(generate)] if generate is not None else []
    code = main(
        [
            "verify",
            str(model_dir),
            "--trust-remote-code",
            "--dtype",
            "float32",
            "--max-new-tokens",
            "3",
            "--json",
            *flags,
        ]
    )
    return code, json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("name", ["sdar", "llada2", "dmoe_llada2"])
def test_the_official_files_agree(tmp_path, capsys, name):
    code, result = _verify(tmp_path, capsys, name)
    assert code == 0, result["verdict"]
    assert all(c["max_diff"] <= c["tolerance"] for c in result["hidden_states"])
    block = result["block_steps"]
    assert block["compared"] and block["agrees"], block
    assert any("multinomial" in note for note in block["notes"]), block["notes"]  # said how it was made greedy
    stood_in = " ".join(result["notes"])
    if name == "sdar":
        assert block["entry"] == "block_diffusion_generate of generate.py"
        assert "flash-attn" in stood_in and "boolean (True = attend) (tried: additive" in stood_in
    else:
        assert block["entry"] == "generate(block_length=...)" and ("veomni" in stood_in) == (name == "llada2")
        assert any("bfloat16 attention mask" in note for note in block["notes"])


@pytest.mark.parametrize(
    "name, perturbation, layer",
    [
        ("sdar", SDAR_O_PROJ, 1),
        ("sdar", SDAR_NORM_EPS, 2),
        ("llada2", LLADA2_SHARED, 1),
        ("llada2", LLADA2_TOPK, 1),
        ("llada2", LLADA2_DENSE, 2),
    ],
    ids=["sdar-o_proj", "sdar-norm-eps", "llada2-shared-expert", "llada2-topk-norm", "llada2-dense"],
)
def test_a_perturbed_copy_parts_at_its_layer(tmp_path, capsys, name, perturbation, layer):
    code, result = _verify(tmp_path, capsys, name, perturbation)
    assert code == 1
    assert result["verdict"].startswith(f"part at hidden state, layer {layer}:"), result["verdict"]
    agrees = [c["agrees"] for c in result["hidden_states"]]
    assert agrees[:layer] == [True] * layer and not agrees[layer]


@pytest.mark.parametrize("name, perturbation", [("sdar", SDAR_BLOCK_MASK), ("llada2", LLADA2_BLOCK_MASK)])
def test_a_perturbed_block_mask_parts_at_the_block_step(tmp_path, capsys, name, perturbation):
    code, result = _verify(tmp_path, capsys, name, perturbation)
    assert code == 1 and all(c["agrees"] for c in result["hidden_states"])
    assert result["verdict"] == "part at one block of block-diffusion decoding", result["verdict"]
