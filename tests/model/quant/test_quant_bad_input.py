"""Bad quantization input: each a one-line error naming the field and the value, never a silent 16-bit load."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from diffuserve import EngineConfig
from diffuserve.model.loader import load_model
from diffuserve.model.quant.checkpoint_gptq_awq import GptqAwqCheckpoint
from diffuserve.model.quant.scheme import make_scheme
from tests.model.quant.test_prequantized import fp8_blocks


def _with_quant_config(src, dst, quant: dict | None, edit=None):
    shutil.copytree(src, dst)
    config = json.loads((dst / "config.json").read_text())
    if quant is not None:
        config["quantization_config"] = quant
    (dst / "config.json").write_text(json.dumps(config))
    if edit is not None:
        with safe_open(str(dst / "model.safetensors"), framework="pt") as f:
            tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118
        save_file(edit(tensors), str(dst / "model.safetensors"))
    return dst


def _fp8_q_proj(tensors: dict, scale: bool = True) -> dict:
    name = "model.layers.3.self_attn.q_proj.weight"
    q, s = fp8_blocks(tensors[name], 16)
    return {**tensors, name: q, **({name + "_scale_inv": s} if scale else {})}


@pytest.mark.parametrize(
    ("quant", "message"),
    [
        ({"quant_method": "bitsandbytes"}, "quantization_config.quant_method: 'bitsandbytes' is not supported"),
        ({"quant_method": "fp8", "fmt": "e5m2"}, "quantization_config.fmt: 'e5m2' is not supported"),
        ({"quant_method": "fp8", "activation_scheme": "static"}, "activation_scheme: 'static' is not supported"),
        ({"quant_method": "gptq", "bits": 8}, "quantization_config.bits: 8 is not supported"),
        ({"quant_method": "gptq", "bits": 4, "desc_act": True}, "desc_act: true"),
        ({"quant_method": "awq", "version": "gemv"}, "quantization_config.version: 'gemv' is not supported"),
    ],
)
def test_unsupported_checkpoint_quantization(family_dirs, tmp_path, quant, message):
    path = _with_quant_config(family_dirs["clover"], tmp_path / "m", quant, _fp8_q_proj)
    with pytest.raises(ValueError, match=message):
        load_model(path, max_model_len=64)


def test_quantized_values_without_their_scale_never_load_as_16_bit(family_dirs, tmp_path):
    no_scale = _with_quant_config(family_dirs["clover"], tmp_path / "a", None, lambda t: _fp8_q_proj(t, False))
    with pytest.raises(ValueError, match=r"q_proj.weight' is float8_e4m3fn but nothing says how to dequantize"):
        load_model(no_scale, max_model_len=64)
    quant = {"quant_method": "fp8", "weight_block_size": [16, 16]}
    no_config = _with_quant_config(family_dirs["clover"], tmp_path / "b", None, _fp8_q_proj)
    with pytest.raises(ValueError, match=r"no quantization_config in config\.json"):
        load_model(no_config, max_model_len=64)
    nothing_quantized = _with_quant_config(family_dirs["clover"], tmp_path / "c", quant)
    with pytest.raises(ValueError, match="holds no quantized tensors"):
        load_model(nothing_quantized, max_model_len=64)


def _fp8_qkv(tensors: dict) -> dict:
    out = dict(tensors)
    for part in "qkv":
        name = f"model.layers.0.self_attn.{part}_proj.weight"
        out[name], out[name + "_scale_inv"] = fp8_blocks(tensors[name], 24)
    return out


def test_fp8_blocks_a_packing_would_split_are_refused(family_dirs, tmp_path):
    """sdar packs q | k | v rows (64 | 32 | 32): k_proj's 24-row blocks would start inside a block of qkv_proj."""
    path = _with_quant_config(
        family_dirs["sdar"], tmp_path / "m", {"quant_method": "fp8", "weight_block_size": [24, 16]}, _fp8_qkv
    )
    with pytest.raises(ValueError, match="splits a block of 24"):
        load_model(path, max_model_len=64)


def test_act_order_g_idx_is_refused():
    reader = GptqAwqCheckpoint({"quant_method": "gptq", "bits": 4, "group_size": 32}, ["x.qweight", "x.g_idx"])
    tensors = {
        "qweight": torch.zeros(8, 16, dtype=torch.int32),
        "qzeros": torch.zeros(2, 2, dtype=torch.int32),
        "scales": torch.ones(2, 16).half(),
        "g_idx": torch.arange(64, dtype=torch.int32).flip(0) // 32,
    }
    with pytest.raises(ValueError, match=r"x\.weight has an act-order g_idx"):
        reader.decode("x.weight", tensors)


def test_group_size_that_does_not_divide_a_width(family_dirs):
    with pytest.raises(ValueError, match=r"quantization_group_size: 48 does not divide the input width 64 of model\."):
        load_model(family_dirs["sdar"], max_model_len=64, quantization=make_scheme("int4", group_size=48))


def test_quantizing_a_quantized_checkpoint(family_dirs, tmp_path):
    path = _with_quant_config(
        family_dirs["clover"], tmp_path / "m", {"quant_method": "fp8", "weight_block_size": [16, 16]}, _fp8_q_proj
    )
    with pytest.raises(ValueError, match=r"quantization: int8 asked for, but the checkpoint is already quantized"):
        load_model(path, max_model_len=64, quantization=make_scheme("int8"))


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"quantization": "int3"}, "quantization: 'int3' is not supported; use one of fp8, int8, int4"),
        (
            {"quantization": "int8", "quantization_targets": "experts,mlp"},
            "quantization_targets: 'experts,mlp' names mlp",
        ),
        ({"quantization": "int4", "quantization_group_size": 0}, "quantization_group_size: must be an even number"),
        ({"quantization": "int8", "expert_offload": True}, "expert_offload: offloading quantized experts"),
    ],
)
def test_engine_options(options, message):
    with pytest.raises(ValueError, match=message):
        EngineConfig.from_kwargs("m", **options)


def test_cli_prints_one_line(family_dirs):
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "diffuserve",
            "generate",
            "hi",
            "--model",
            str(family_dirs["sdar"]),
            "--quantization",
            "int3",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "diffuserve generate: error: quantization: 'int3' is not supported; use one of fp8, int8, int4"
    ]
