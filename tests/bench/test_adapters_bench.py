"""`diffuserve bench adapters` on the tiny sdar-moe model: one run times the base model alone and an engine serving
adapters with 0, 1 and 4 of them in the batch; the random adapters it writes are served (a request with one differs
from the base model's output), and the table and the JSON line agree."""

from __future__ import annotations

from diffuserve import LLM, LoRARequest, SamplingParams
from diffuserve.bench.adapters import random_adapter


def test_the_bench_times_every_variant(run_bench, bench_model_dir, tmp_path):
    code, result, table = run_bench(
        ["adapters", "--model", str(bench_model_dir), "--num-prompts", "4", "--prompt-tokens", "6",
         "--output-tokens", "4", "--repeats", "1", "--rank", "4", "--adapter-dir", str(tmp_path)]
    )  # fmt: skip
    assert code == 0
    variants = [r["variant"] for r in result["results"]]
    assert variants == [
        "base model, no --enable-lora",
        "--enable-lora, 0 adapters in the batch",
        "--enable-lora, 1 adapters in the batch",
        "--enable-lora, 4 adapters in the batch",
    ]
    assert result["results"][0]["vs_base"] == 1.0 and all(r["tokens_per_s"] > 0 for r in result["results"])
    assert all(v in table for v in variants)


def test_a_random_adapter_changes_the_output(bench_model_dir, tmp_path):
    adapter = random_adapter(bench_model_dir, tmp_path / "a", rank=4, seed=0)
    llm = LLM(str(bench_model_dir), enable_lora=True, max_lora_rank=4)
    params = SamplingParams(max_tokens=8, ignore_eos=True)
    prompt = [{"prompt_token_ids": [5, 6, 7, 8]}]
    base = llm.generate(prompt, params, use_tqdm=False)[0].outputs[0].token_ids
    adapted = llm.generate(prompt, params, lora_request=LoRARequest("a", 1, str(adapter)), use_tqdm=False)
    assert adapted[0].outputs[0].token_ids != base
