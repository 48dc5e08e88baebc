"""The oracles catch the bugs they exist for. Each test applies one known-bad change to the engine in-process
(monkeypatched for the test only) and asserts that the check which guards against it now fails:

- the threshold decoder accepting confidence >= threshold instead of > (strict, as the references): a textual
  mutation of decoding/mask_policies.py, caught by the parity check against the independent reference;
- the K/V cache holding values rounded to fp16: caught by the cached-vs-recompute logits check, though token
  parity on the tests' confident models does not notice it.

A mutation that no longer applies (the source changed) fails loudly, so this file is kept in step with the engine.
"""

from __future__ import annotations

import inspect
import types

import pytest
import torch

from diffuserve import LLM, SamplingParams
from diffuserve.decoding import mask_policies as decoders
from diffuserve.model.layers import attention
from diffuserve.reference.cache_check import check_cached_logits
from diffuserve.reference.parity import check_parity
from diffuserve.reference.reference_model import load_reference
from tests.engine.test_cached_logits import CASES, LOGIT_TOLERANCE, cached_logits_case
from tests.engine.test_generation_parity import PROMPT_LENGTHS, parity_cases


def apply_source_mutation(monkeypatch: pytest.MonkeyPatch, module: types.ModuleType, old: str, new: str) -> None:
    """Rewrites the one occurrence of `old` in `module`'s source as `new`, runs the result as a fresh module and
    patches its functions, and the methods of its classes, over the live module's (undone after the test). Only
    what the rewrite changed is patched: a method using zero-argument super() works only in its own class."""
    source = inspect.getsource(module)
    assert source.count(old) == 1, f"mutation no longer applies: {old!r} occurs {source.count(old)} times"
    mutant = types.ModuleType(module.__name__)
    exec(compile(source.replace(old, new), module.__file__, "exec"), mutant.__dict__)
    for name, value in vars(mutant).items():
        live = getattr(module, name, None)
        if inspect.isclass(value) and inspect.isclass(live) and value.__module__ == module.__name__:
            for attr, member in vars(value).items():
                if inspect.isfunction(member) and member.__code__ != getattr(live, attr).__code__:
                    monkeypatch.setattr(live, attr, member)
        elif inspect.isfunction(value) and value.__module__ == module.__name__:
            monkeypatch.setattr(module, name, value)


@pytest.mark.parametrize("block", [4, 32])
def test_a_non_strict_threshold_fails_parity(saturated_model_dirs, monkeypatch, block):
    model_dir = saturated_model_dirs[block]
    llm, reference = LLM(str(model_dir), num_pages=512, max_num_seqs=8), load_reference(model_dir)
    prompts, params = parity_cases(SamplingParams(decoder="threshold", threshold=1.0), PROMPT_LENGTHS[::3])
    assert not check_parity(llm, reference, prompts, params).mismatches
    apply_source_mutation(monkeypatch, decoders, "> params.threshold", ">= params.threshold")
    mutated = check_parity(llm, reference, prompts, params)
    assert len(mutated.mismatches) >= len(prompts) // 2, mutated.mismatches


def _fp16_kv(real):
    def paged_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        """K/V rounded to fp16 on their way into the cache (and so as every query reads them back)."""
        return real(q, k.half().to(k.dtype), v.half().to(v.dtype), *args, **kwargs)

    return paged_attention


@pytest.mark.parametrize("case", list(CASES))
def test_an_fp16_kv_cache_fails_the_logits_check(low_scale_dirs, monkeypatch, case):
    family, block, base = CASES[case]
    monkeypatch.setattr(attention, "paged_attention", _fp16_kv(attention.paged_attention))
    check = check_cached_logits(*cached_logits_case(low_scale_dirs[family], block, base))
    assert not check.bad_contexts  # the tokens are right; only the numbers drift
    assert check.max_abs_diff > 10 * LOGIT_TOLERANCE, check.max_abs_diff
