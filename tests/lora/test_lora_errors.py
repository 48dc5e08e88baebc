"""Adapters the engine refuses, each with one line naming the field and the fix (the engine keeps serving), the
adapter limits, unloading an adapter in use, and a quantized base with a 16/32-bit adapter."""

from __future__ import annotations

import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from diffuserve import LLM, LoRARequest, SamplingParams
from diffuserve.engine.lora_adapters import AdapterInUse, AdapterNotFound
from diffuserve.errors import RequestError
from diffuserve.model.loader import load_args, load_model
from diffuserve.model.lora.layer import lora_context
from diffuserve.model.lora.slots import LoRASlots
from diffuserve.model.quant.scheme import make_scheme
from tests.lora.adapters import adapter_for_checkpoint, edit_config, write_base
from tests.model.test_hf_parity import _hf_model

PROMPT = {"prompt_token_ids": [5, 6, 7, 8, 9]}
GREEDY = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def dense(tmp_path_factory):
    root = tmp_path_factory.mktemp("lora-errors")
    base = write_base(root, "dense")
    return root, base, adapter_for_checkpoint(base, root / "good", seed=1)


def _copy(dense, name: str):
    root, _, good = dense
    shutil.copytree(good, root / name, dirs_exist_ok=True)
    return root / name


@pytest.mark.parametrize(
    "edit, expected",
    [
        (dict(use_dora=True), "use_dora True: DoRA adapters are not supported"),
        (dict(bias="all"), "bias 'all' is not supported; train with bias='none'"),
        (dict(modules_to_save=["lm_head"]), "modules_to_save ['lm_head']: fully trained modules"),
        (dict(peft_type="IA3"), "peft_type 'IA3' is not supported"),
        (dict(r=32), "rank r=32 is above max_lora_rank 4; restart with --max-lora-rank 32"),
        (dict(rank_pattern={"q_proj": 8}), "rank r=8 is above max_lora_rank 4"),
    ],
)
def test_refused_config_fields(dense, edit, expected):
    adapter = _copy(dense, "edited")
    edit_config(adapter, **edit)
    llm = LLM(str(dense[1]), enable_lora=True, max_lora_rank=4)
    with pytest.raises(RequestError, match=expected.replace("(", r"\(").replace("[", r"\[")) as error:
        llm.generate(PROMPT, GREEDY, lora_request=LoRARequest("edited", 1, str(adapter)))
    assert "\n" not in str(error.value)
    assert llm.generate(PROMPT, GREEDY)[0].outputs[0].token_ids  # still serving
    assert not llm.engine.adapters.loaded


def test_missing_file_wrong_shape_and_unknown_module(dense):
    root, base, _ = dense
    llm = LLM(str(base), enable_lora=True, max_lora_rank=4)
    missing = _copy(dense, "missing")
    (missing / "adapter_model.safetensors").unlink()
    with pytest.raises(RequestError, match=r"has no adapter_model.safetensors"):
        llm.engine.adapters.load("missing", str(missing))
    with pytest.raises(RequestError, match="is not a directory"):
        llm.engine.adapters.load("nowhere", str(root / "nowhere"))
    for name, change in (("narrow", lambda t: t[:, :8]), ("stray", None)):
        adapter = _copy(dense, name)
        tensors = load_file(adapter / "adapter_model.safetensors")
        key = next(k for k in tensors if k.endswith("q_proj.lora_A.weight"))
        if change is None:
            stray = key.replace("self_attn.q_proj", "self_attn.rotary")
            b_key = key.replace("lora_A", "lora_B")
            tensors[stray], tensors[stray.replace("lora_A", "lora_B")] = tensors[key].clone(), tensors[b_key].clone()
        else:
            tensors[key] = change(tensors[key]).contiguous()
        save_file(tensors, adapter / "adapter_model.safetensors")
        expected = "it was trained for another base model" if change else "'model.layers.0.self_attn.rotary' is not"
        with pytest.raises(RequestError, match=expected):
            llm.engine.adapters.load(name, str(adapter))
    assert not llm.engine.adapters.loaded


def test_routed_expert_adapter_is_refused(tmp_path):
    peft = pytest.importorskip("peft")
    base = write_base(tmp_path, "moe")
    model = peft.get_peft_model(
        _hf_model("moe"),
        peft.LoraConfig(r=2, target_modules=["q_proj", "gate_proj", "up_proj"], init_lora_weights=False),
    )
    model.save_pretrained(tmp_path / "experts")
    llm = LLM(str(base), enable_lora=True, max_lora_rank=8)
    with pytest.raises(RequestError, match=r"target_parameters \['down_proj', 'gate_up_proj'\]|routed expert"):
        llm.engine.adapters.load("experts", str(tmp_path / "experts"))


def test_limits_unknown_names_and_unload_in_use(dense):
    _, base, good = dense
    llm = LLM(str(base), enable_lora=True, max_loras=1, max_lora_rank=4, lora_modules=[f"good={good}"])
    with pytest.raises(RequestError, match=r"1 adapters are loaded, the limit .max_loras.; .* --max-loras 2"):
        llm.engine.adapters.load("other", str(good))
    with pytest.raises(AdapterNotFound, match=r"'nope' is not a loaded adapter .loaded: good."):
        llm.engine.add_request("r0", [1, 2, 3], GREEDY, "nope")
    llm.engine.add_request("r1", [1, 2, 3], GREEDY, "good")
    with pytest.raises(AdapterInUse, match="'good' is in use"):
        llm.engine.unload_lora_adapter("good")
    while llm.engine.has_unfinished_requests():
        llm.engine.step()
    llm.engine.unload_lora_adapter("good")
    llm.engine.adapters.load("other", str(good))  # the freed slot is reused
    with pytest.raises(RequestError, match="'other' is already loaded; unload it first"):
        llm.engine.adapters.load("other", str(good))
    with pytest.raises(RequestError, match="an adapter needs a name"):
        llm.engine.adapters.load("", str(good))
    with pytest.raises(RequestError, match="without adapters; restart with --enable-lora"):
        LLM(str(base)).engine.adapters.load("good", str(good))
    with pytest.raises(ValueError, match="enable_lora: adapters run on one rank only"):
        LLM(str(base), enable_lora=True, tensor_parallel_size=2)


@pytest.mark.parametrize("method", ["int8", "fp8", "int4"])
def test_quantized_base_adds_the_exact_fp32_delta(dense, method):
    _, base, good = dense
    family, _ = load_args(base)
    args, model = load_model(base, dtype="float32", quantization=make_scheme(method, "all", 16))
    slots = LoRASlots(model, family, args, 1, 4, torch.float32, torch.device("cpu"))
    slots.load(1, "good", good)
    tensors = load_file(good / "adapter_model.safetensors")
    a = tensors["base_model.model.model.layers.0.self_attn.o_proj.lora_A.weight"]
    b = tensors["base_model.model.model.layers.0.self_attn.o_proj.lora_B.weight"]
    linear = model.get_submodule("model.layers.0.self_attn.o_proj")
    assert type(linear).__name__ == "QuantLinear"
    x = torch.randn(5, a.shape[1], generator=torch.Generator().manual_seed(0))
    with torch.no_grad(), lora_context(torch.ones(5, dtype=torch.long)):
        adapted = linear(x)
    expected = linear(x) + x @ a.t() @ b.t() * 2.0  # lora_alpha / r = 8 / 4
    assert (adapted - expected).abs().max().item() <= 1e-5
