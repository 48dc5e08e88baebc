"""Quantize on load, for every family and format: the quantized model computes what a float model holding the
reference dequantization of its very quantized weights computes (1e-4, fp32), and under tensor / expert
parallelism every rank stores exactly its slices of the single-process quantized parts (quantized over whole
rows, then sharded)."""

from __future__ import annotations

import pytest
import torch

from diffuserve.distributed.group import ParallelGroup
from diffuserve.model.loader import build_model, load_args, load_model, load_weights, read_model_config
from diffuserve.model.quant.apply import quant_weights
from diffuserve.model.quant.formats import QuantParts
from diffuserve.model.quant.loading import quant_plan
from diffuserve.model.quant.scheme import make_scheme
from diffuserve.reference.reference_quant import reference_dequantize
from tests.model.quant.conftest import GROUP, model_logits

METHODS = ("int8", "int4", "fp8")


def unfinalized(model_dir, scheme, group: ParallelGroup | None = None):
    """The quantized model as loaded, before its weights take the kernels' layouts (canonical parts)."""
    family, args = load_args(model_dir)
    plan = quant_plan(read_model_config(model_dir)[0], model_dir, family, args, scheme)
    assert plan is not None
    model = build_model(family, args, 64, torch.float32, "cpu", group, None, plan.format_for)
    load_weights(model, family, args, model_dir, False, plan.reader)
    return model


def dequantized_float_model(model_dir, scheme):
    """A float model whose quantized weights are replaced by the reference dequantization of their parts."""
    weights = {name: w for name, w in quant_weights(unfinalized(model_dir, scheme)).items()}
    _, model = load_model(model_dir, max_model_len=64)
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, weight in weights.items():
            parts = weight.parts()
            if len(weight.shape) == 2:
                params[name].copy_(reference_dequantize(weight.fmt, parts))
                continue
            for e in range(weight.shape[0]):
                matrix = QuantParts(parts.qdata[e], parts.scale[e], None if parts.zero is None else parts.zero[e])
                params[name][e].copy_(reference_dequantize(weight.fmt, matrix))
    return model, weights


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("family", ["sdar", "llada2", "clover"])
def test_quantized_model_computes_its_dequantized_weights(family_dirs, family, method):
    scheme = make_scheme(method, "all", GROUP)
    reference, weights = dequantized_float_model(family_dirs[family], scheme)
    kinds = {name.split(".")[-2] if "experts" not in name else "experts" for name in weights}
    assert {"experts", "lm_head"} <= kinds and len(weights) >= 8  # experts first, and every other target
    _, quantized = load_model(family_dirs[family], max_model_len=64, quantization=scheme)
    ids = torch.randint(0, 300, (1, 12), generator=torch.Generator().manual_seed(0))
    expected, out = model_logits(reference, ids), model_logits(quantized, ids)
    assert ((out - expected).abs().max() / expected.abs().max()).item() < 1e-4
    _, float_model = load_model(family_dirs[family], max_model_len=64)
    assert not torch.allclose(model_logits(float_model, ids), out, atol=1e-4)  # it is quantized at all


def _join(weight_parts: list[QuantParts], name: str, spec, fmt) -> list[torch.Tensor]:
    """Undo the split of each part: per rank, its segment pieces, interleaved by segment (as for floats); a
    per-channel scale of a split input width is held whole by every rank."""
    joined = []
    for index, part_name in enumerate(("qdata", "scale", "zero")):
        locals_ = [p[index] for p in weight_parts]
        if locals_[0] is None:
            continue
        divisor = {"qdata": fmt.pack, "scale": fmt.group_size or 0, "zero": fmt.group_size or 0}[part_name]
        along_k = spec.dim == len(locals_[0].shape) - 1
        if along_k and divisor == 0:
            assert all(torch.equal(t, locals_[0]) for t in locals_), name
            joined.append(locals_[0])
            continue
        unit = divisor if along_k else 1
        pieces: list[list[torch.Tensor]] = [[] for _ in spec.segments]
        for local in locals_:
            for i, part in enumerate(local.split([s // spec.size // unit for s in spec.segments], dim=spec.dim)):
                pieces[i].append(part)
        joined.append(torch.cat([torch.cat(p, dim=spec.dim) for p in pieces], dim=spec.dim))
    return joined


@pytest.mark.parametrize("expert_parallel", [False, True])
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("family", ["sdar", "llada2"])
def test_rank_parts_put_together_are_the_single_process_parts(family_dirs, family, method, expert_parallel):
    scheme = make_scheme(method, group_size=GROUP)
    full = quant_weights(unfinalized(family_dirs[family], scheme))
    ranks = [
        quant_weights(unfinalized(family_dirs[family], scheme, ParallelGroup(r, 2, expert_parallel))) for r in range(2)
    ]
    sharded = 0
    for name, weight in full.items():
        expected = [p for p in weight.parts() if p is not None]
        spec = ranks[0][name].shard
        if spec is None:
            got = [p for p in ranks[0][name].parts() if p is not None]
        else:
            sharded += 1
            got = _join([r[name].parts() for r in ranks], name, spec, weight.fmt)
        assert all(torch.equal(a, b) for a, b in zip(got, expected)), name
    assert sharded >= 6


def test_dummy_weights_quantize_chunk_by_chunk(family_dirs):
    _, model = load_model(
        family_dirs["sdar"], max_model_len=64, load_format="dummy", quantization=make_scheme("int4", group_size=GROUP)
    )
    assert {w.kernel.name for w in quant_weights(model).values() if w.kernel is not None} == {"dequant"}
    assert torch.isfinite(model_logits(model, torch.arange(8)[None])).all()
