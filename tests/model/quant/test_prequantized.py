"""Pre-quantized checkpoints load without a 16-bit copy and mean what their format's reference says:

- compressed-tensors: tensors written by the `compressed-tensors` library itself decode to the library's own
  decompression; `diffuserve quantize` writes what the library decompresses to the values `--quantization` gives;
- Qwen / DeepSeek FP8 blocks: decode to transformers' fine-grained FP8 dequantization; a model (fused and
  per-expert experts) computes its block-dequantized weights;
- GPTQ (v1 and v2 zeros, symmetric or not) and AWQ: tensors packed by the formats' documented rules (packers
  written here) decode to the values packed.
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from compressed_tensors.compressors.naive_quantized.base import FloatQuantizationCompressor
from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor
from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme
from safetensors import safe_open
from safetensors.torch import save_file
from transformers.integrations.finegrained_fp8 import _dequantize_fp8_weight

from diffuserve.model.loader import load_model
from diffuserve.model.quant.apply import quant_weights
from diffuserve.model.quant.checkpoint_ct import CompressedTensorsCheckpoint
from diffuserve.model.quant.checkpoint_fp8 import Fp8Checkpoint
from diffuserve.model.quant.checkpoint_gptq_awq import AWQ_ORDER, GptqAwqCheckpoint
from diffuserve.model.quant.scheme import make_scheme
from diffuserve.model.quant.writer import quantize_checkpoint
from diffuserve.reference.clover_moe_checkpoint import write_clover_moe_checkpoint
from diffuserve.reference.reference_quant import reference_dequantize
from tests.model.quant.conftest import GROUP, model_logits
from tests.model.quant.test_quant_loading import unfinalized

CT_SCHEMES = {
    "int4-group-asym": dict(num_bits=4, type="int", symmetric=False, strategy="group", group_size=32),
    "int4-channel-sym": dict(num_bits=4, type="int", symmetric=True, strategy="channel"),
    "int8-channel": dict(num_bits=8, type="int", symmetric=True, strategy="channel"),
    "fp8-channel": dict(num_bits=8, type="float", symmetric=True, strategy="channel"),
}


def _scale_and_zero(w: torch.Tensor, args: dict) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Min-max scales (and zeros) over the scheme's groups, as a test-side choice of quantization parameters."""
    groups = w.reshape(w.shape[0], -1, args.get("group_size", w.shape[1]))
    top = 448.0 if args["type"] == "float" else 2 ** (args["num_bits"] - 1) - 1
    if args["symmetric"]:
        return (groups.abs().amax(-1) / top).clamp(min=1e-6), None
    low, high = groups.amin(-1).clamp(max=0), groups.amax(-1).clamp(min=0)
    scale = ((high - low) / (2 ** args["num_bits"] - 1)).clamp(min=1e-6)
    return scale, (-(2 ** (args["num_bits"] - 1)) - torch.round(low / scale)).to(torch.int8)


@pytest.mark.parametrize("name", CT_SCHEMES)
def test_library_written_compressed_tensors_decode_to_the_library_decompression(name):
    args = CT_SCHEMES[name]
    scheme = QuantizationScheme(targets=["Linear"], weights=QuantizationArgs(**args))
    w = torch.randn(24, 64, generator=torch.Generator().manual_seed(1))
    scale, zero = _scale_and_zero(w, args)
    state = {"weight": w, "weight_scale": scale} | ({"weight_zero_point": zero} if zero is not None else {})
    compressor = FloatQuantizationCompressor if args["type"] == "float" else PackedQuantizationCompressor
    stored = compressor.compress(state, scheme)
    expected = compressor.decompress(stored, scheme)["weight"]
    config = {"config_groups": {"group_0": {"targets": ["Linear"], "weights": args}}}
    names = [f"layer.{k}" for k in stored]
    reader = CompressedTensorsCheckpoint(config, names)
    roles = {role: stored[k] for k in stored if (split := reader.role_of(f"layer.{k}")) for _, role in [split]}
    parts, shape = reader.decode("layer.weight", roles)
    assert shape == (24, 64)
    torch.testing.assert_close(reference_dequantize(reader.format_for("layer.weight"), parts).float(), expected)


def _library_decompress(checkpoint, module: str, weights_args: dict) -> torch.Tensor:
    scheme = QuantizationScheme(targets=["Linear"], weights=QuantizationArgs(**weights_args))
    with safe_open(str(checkpoint / "model.safetensors"), framework="pt") as f:
        state = {k[len(module) + 1 :]: f.get_tensor(k) for k in f.keys() if k.startswith(module + ".")}  # noqa: SIM118
    compressor = FloatQuantizationCompressor if weights_args["type"] == "float" else PackedQuantizationCompressor
    return compressor.decompress(state, scheme)["weight"]


@pytest.mark.parametrize("method", ["int4", "int8", "fp8"])
def test_diffuserve_quantize_writes_what_the_library_and_the_loader_agree_on(family_dirs, tmp_path, method):
    src, dst = family_dirs["sdar"], tmp_path / method
    quantize_checkpoint(src, dst, make_scheme(method, group_size=GROUP))
    quant = json.loads((dst / "config.json").read_text())["quantization_config"]
    weights_args = {k: v for k, v in quant["config_groups"]["group_0"]["weights"].items() if k != "dynamic"}
    written = quant_weights(unfinalized(dst, None))
    on_load = quant_weights(unfinalized(src, make_scheme(method, group_size=GROUP)))
    for name, weight in on_load.items():  # the very values quantizing on load gives
        assert all(a is b or torch.equal(a, b) for a, b in zip(weight.parts(), written[name].parts())), name
    q_proj = _library_decompress(dst, "model.layers.0.self_attn.q_proj", weights_args)
    qkv = written["model.layers.0.self_attn.qkv_proj.weight"]
    ours = reference_dequantize(qkv.fmt, qkv.parts())[: q_proj.shape[0]]
    torch.testing.assert_close(ours.float(), q_proj.float(), rtol=1e-6, atol=1e-6)
    _, model = load_model(dst, max_model_len=64)  # loads as it is, no --quantization
    _, quantized = load_model(src, max_model_len=64, quantization=make_scheme(method, group_size=GROUP))
    ids = torch.arange(10)[None]
    torch.testing.assert_close(model_logits(model, ids), model_logits(quantized, ids), rtol=0, atol=0)


def fp8_blocks(w: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """w [*, N, K] -> (fp8 values, scale_inv [*, ceil(N / b), ceil(K / b)]): max |w| of a block -> 448."""
    n, k = w.shape[-2:]
    padded = torch.nn.functional.pad(w, (0, -k % block, 0, -n % block))
    tiles = padded.unflatten(-1, (-1, block)).unflatten(-3, (-1, block))  # [*, N/b, b, K/b, b]
    scale = (tiles.abs().amax(dim=(-3, -1)) / 448).clamp(min=1e-8)  # [*, N/b, K/b]
    q = (tiles / scale[..., :, None, :, None]).flatten(-4, -3).flatten(-2)[..., :n, :k]
    return q.to(torch.float8_e4m3fn), scale


def test_fp8_block_decode_equals_transformers_dequantization():
    w = torch.randn(3, 40, 56)
    q, scale = fp8_blocks(w, 16)
    reader = Fp8Checkpoint({"quant_method": "fp8", "weight_block_size": [16, 16]}, ["e", "e_scale_inv"])
    parts, _ = reader.decode("e", {"qdata": q, "scale": scale})
    expected = _dequantize_fp8_weight(q, scale, [16, 16], torch.float64)
    for e in range(3):
        matrix = type(parts)(parts.qdata[e], parts.scale[e], None)
        torch.testing.assert_close(reference_dequantize(reader.format, matrix), expected[e])


def _is_fp8_target(name: str) -> bool:
    projections = name.endswith(("proj.weight", "experts.gate_up_proj", "experts.down_proj"))
    return projections and not any(part in name for part in ("in_proj_a", "in_proj_b", "mlp.gate.weight"))


@pytest.mark.parametrize("per_expert", [False, True])
def test_fp8_block_checkpoint_computes_its_dequantized_weights(family_dirs, tmp_path, per_expert):
    """Clover with fused ([E, 2I, H] + _scale_inv [E, ...]) or per-expert fp8 experts, 16 x 16 blocks; the
    reference is the float model of transformers' dequantization of the same tensors."""
    src = family_dirs["clover"]
    if per_expert:
        config = json.loads((src / "config.json").read_text())
        src = write_clover_moe_checkpoint(tmp_path / "per-expert", config, seed=5, per_expert=True)
    fp8_dir, float_dir = tmp_path / "fp8", tmp_path / "dequantized"
    shutil.copytree(src, fp8_dir)
    shutil.copytree(src, float_dir)
    with safe_open(str(src / "model.safetensors"), framework="pt") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118
    quantized, dequantized = dict(tensors), dict(tensors)
    for name, tensor in tensors.items():
        if _is_fp8_target(name):
            q, scale = fp8_blocks(tensor, 16)
            quantized[name], quantized[name + "_scale_inv"] = q, scale
            dequantized[name] = _dequantize_fp8_weight(q, scale, [16, 16], torch.float32)
    save_file(quantized, str(fp8_dir / "model.safetensors"))
    save_file(dequantized, str(float_dir / "model.safetensors"))
    config = json.loads((fp8_dir / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "fp8", "weight_block_size": [16, 16], "fmt": "e4m3"}
    (fp8_dir / "config.json").write_text(json.dumps(config))
    _, model = load_model(fp8_dir, max_model_len=64)
    _, reference = load_model(float_dir, max_model_len=64)
    assert len(quant_weights(model)) >= 12
    ids = torch.arange(12)[None]
    expected = model_logits(reference, ids)
    assert ((model_logits(model, ids) - expected).abs().max() / expected.abs().max()).item() < 1e-4


def _pack_along_rows(values: torch.Tensor) -> torch.Tensor:
    """[R, C] 0..15 -> int32 [R / 8, C]: row 8i + j at bits 4j of word i (GPTQ's qweight)."""
    r, c = values.shape
    v = values.to(torch.int64).reshape(r // 8, 8, c)
    word = sum(v[:, j] << (4 * j) for j in range(8))
    return torch.where(word >= 1 << 31, word - (1 << 32), word).to(torch.int32)


def _pack_along_columns(values: torch.Tensor, order: tuple[int, ...]) -> torch.Tensor:
    """[R, C] -> int32 [R, C / 8]: bits 4i of word c hold column 8c + order[i]."""
    r, c = values.shape
    v = values.to(torch.int64).reshape(r, c // 8, 8)
    word = sum(v[:, :, order[i]] << (4 * i) for i in range(8))
    return torch.where(word >= 1 << 31, word - (1 << 32), word).to(torch.int32)


@pytest.mark.parametrize(
    ("method", "extra"),
    [
        ("gptq", {"sym": False}),
        ("gptq", {"sym": False, "checkpoint_format": "gptq_v2"}),
        ("gptq", {"sym": True}),
        ("awq", {"zero_point": True, "version": "gemm"}),
    ],
)
def test_gptq_and_awq_layouts_decode_to_the_packed_values(method, extra):
    g = torch.Generator().manual_seed(2)
    n, k, group = 16, 64, 32
    q = torch.randint(0, 16, (k, n), generator=g)  # [K, N], as both formats store the input dimension first
    zero = torch.full((k // group, n), 8) if extra.get("sym") else torch.randint(1, 15, (k // group, n), generator=g)
    scales = torch.rand(k // group, n, generator=g).half() + 0.01
    sequential = tuple(range(8))
    if method == "gptq":
        stored_zero = zero - (0 if extra.get("checkpoint_format") == "gptq_v2" else 1)
        tensors = {"qweight": _pack_along_rows(q), "qzeros": _pack_along_columns(stored_zero, sequential)}
    else:
        tensors = {"qweight": _pack_along_columns(q, AWQ_ORDER), "qzeros": _pack_along_columns(zero, AWQ_ORDER)}
    tensors |= {"scales": scales, "g_idx": torch.arange(k, dtype=torch.int32) // group}
    config = {"quant_method": method, "bits": 4, "group_size": group, **extra}
    reader = GptqAwqCheckpoint(config, [f"x.{r}" for r in tensors])
    parts, shape = reader.decode("x.weight", tensors)
    assert shape == (n, k)
    expected = (q.double() - zero.repeat_interleave(group, 0).double()) * scales.double().repeat_interleave(group, 0)
    torch.testing.assert_close(reference_dequantize(reader.format, parts), expected.T)
