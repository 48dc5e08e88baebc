"""The family x option matrix: every option of the engine and of a request, alone and in the pairs that touch the
same code, on every family (reference/matrix_families.py). Each cell either decodes the family's independent
reference tokens under that option, or is refused before any step runs with one line naming the option and why;
no cell may fail inside a step. tests/test_option_matrix.py runs the fast cells, scripts/option_matrix.py every
cell and writes the table into docs/internals/testing.md.

How the pairs were chosen: two options form a pair when both change the same code: the K/V pages (fp8 K/V with
prefix hits, chunked prefill, preemption, quantized weights, tensor parallelism, the compiled step), the weights
and the expert dispatch (quantization with tensor / expert parallelism and expert offload, offload under expert
parallelism), and the per-request decoding state that must survive the engine's scheduling (structured output,
seeds and logprobs with preemption, prefix hits, n > 1 and tensor parallelism), and the outputs made beside the
next forward with what ends a request or changes a step's requests (stop strings, preemption, n > 1, worker
processes). Verified decoding is paired with every option that is not another decoder: its drafts, rollbacks and
causal checks meet all of them.

Outcomes: "exact" (the reference's tokens, and what the option adds: logprobs, prompt scores, hits,
preemptions, the grammar), "refused: <the one-line error>", or "ran: no reference" where the family's
reference cannot apply the option (the cell ran every step without failing; the table says so).
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from diffuserve import LLM, SamplingParams
from diffuserve.errors import GenerationFailed
from diffuserve.reference.matrix_families import FAMILIES, MAX_MODEL_LEN, QUANT_GROUP_SIZE, reference_tokens
from diffuserve.structured_outputs import StructuredOutputsParams
from diffuserve.text.tokenizer import Tokenizer

PROMPTS = [[5, 9, 14], [3, 1, 4, 1, 5, 9, 2, 6, 5], [7, 30, 11, 2, 8, 19, 4, 66, 12, 3, 90, 21, 40, 6]]
"""Three prompts: inside the first block, across two, across four (chunked prefill splits it)."""
STRUCTURED = "[a-z]{6,8}"


@dataclass(frozen=True)
class Option:
    name: str
    engine: dict[str, Any] = field(default_factory=dict)
    """LLM options."""
    params: dict[str, Any] = field(default_factory=dict)
    """SamplingParams changes."""
    field: str = ""
    """The option's name in a refusal (the field the error must name)."""
    slow: bool = False
    """Spawns worker processes or compiles: run by the script, not in CI."""

    @property
    def names(self) -> tuple[str, ...]:
        """What a refusal of it may name: its field, or a setting it makes (ep2 is refused as the tensor parallelism
        it also asks for where a family cannot split at all)."""
        return tuple(n for n in (self.field, *self.engine, *self.params) if n)


OPTIONS = {
    o.name: o
    for o in [
        Option("kv fp8", {"kv_cache_dtype": "fp8"}, field="kv_cache_dtype"),
        Option("int8", {"quantization": "int8"}, field="quantization"),
        Option("int4", {"quantization": "int4"}, field="quantization"),
        Option("fp8 weights", {"quantization": "fp8"}, field="quantization"),
        Option("tp2", {"tensor_parallel_size": 2}, field="tensor_parallel_size", slow=True),
        Option("ep2", {"tensor_parallel_size": 2, "enable_expert_parallel": True}, field="expert", slow=True),
        Option("expert offload", {"expert_offload": True}, field="expert_offload"),
        Option("prefix hit", {"enable_prefix_caching": True, "page_size": 4}, field="prefix"),
        Option("chunked prefill", {"max_num_batched_tokens": 8}, field="max_num_batched_tokens"),
        Option("preemption", {"page_size": 4}, field="num_pages"),
        Option("decoder fixed", params={"decoder": "fixed", "steps": 2}, field="decoder"),
        Option("decoder entropy", params={"decoder": "entropy"}, field="decoder"),
        Option("decoder edit", params={"decoder": "edit"}, field="decoder"),
        Option("decoder renoise", params={"decoder": "renoise"}, field="decoder"),
        Option("decoder verified", params={"decoder": "verified"}, field="decoder"),
        Option(
            "structured",
            params={"structured_outputs": StructuredOutputsParams(regex=STRUCTURED)},
            field="structured_outputs",
        ),
        Option("logprobs", params={"logprobs": 2}, field="logprobs"),
        Option("prompt scoring", params={"prompt_logprobs": 1}, field="prompt_logprobs"),
        Option("n=2", params={"n": 2, "temperature": 0.8, "seed": 5}, field="n"),
        Option("seed", params={"temperature": 0.8, "seed": 7}, field="seed"),
        Option("stop string", field="stop"),
        Option("attention loop", {"attention_backend": "loop"}, field="attention_backend"),
        Option("attention batched", {"attention_backend": "batched"}, field="attention_backend"),
        Option("moe loop", {"moe_backend": "loop"}, field="moe_backend"),
        Option("moe bmm", {"moe_backend": "bmm"}, field="moe_backend"),
        Option("moe grouped_mm", {"moe_backend": "grouped_mm"}, field="moe_backend"),
        Option("compiled", {"enforce_eager": False}, field="enforce_eager", slow=True),
        Option("overlap outputs", {"overlap_outputs": True}, field="overlap_outputs"),
    ]
}
PAIRS = [
    ("kv fp8", "prefix hit"),
    ("kv fp8", "chunked prefill"),
    ("kv fp8", "preemption"),
    ("kv fp8", "int8"),
    ("kv fp8", "tp2"),
    ("kv fp8", "compiled"),
    ("int4", "tp2"),
    ("int4", "ep2"),
    ("int8", "expert offload"),
    ("expert offload", "ep2"),
    ("structured", "tp2"),
    ("structured", "preemption"),
    ("structured", "n=2"),
    ("seed", "preemption"),
    ("logprobs", "prefix hit"),
    ("logprobs", "chunked prefill"),
    ("prefix hit", "preemption"),
    # Outputs made beside the next forward, with what ends a request a step late or changes who is in a step.
    ("overlap outputs", "stop string"),
    ("overlap outputs", "preemption"),
    ("overlap outputs", "n=2"),
    ("overlap outputs", "tp2"),
    # Verified decoding with every option that is not another decoder: each works or is refused in one line.
    *[("decoder verified", name) for name in OPTIONS if not name.startswith("decoder ")],
]
TRIPLES = [("int8", "expert offload", "ep2"), ("kv fp8", "prefix hit", "preemption")]
"""Expert offload with quantized experts under expert parallelism; prefix caching with fp8 K/V under preemption."""
CI_FAMILIES = ("sdar_moe", "clover_moe")
"""The families whose pairs and backend cells run in CI: an attention-only MoE and the hybrid."""
"""Expert offload with quantized experts under expert parallelism (the issue's own example)."""


@dataclass(frozen=True)
class Cell:
    family: str
    options: tuple[str, ...]

    @property
    def slow(self) -> bool:
        """Run by the script only: an option that spawns processes or compiles, or (to keep CI's share small) a
        pair or a backend outside the two families that reach every code path (sdar_moe, clover_moe)."""
        if any(OPTIONS[o].slow for o in self.options):
            return True
        varies_only_backends = len(self.options) > 1 or self.options[0].startswith(("moe ", "attention "))
        return varies_only_backends and self.family not in CI_FAMILIES

    @property
    def id(self) -> str:
        return f"{self.family}-{'+'.join(self.options)}".replace(" ", "_")


def cells() -> list[Cell]:
    combos = [(o,) for o in OPTIONS] + PAIRS + TRIPLES
    return [Cell(family, combo) for family in FAMILIES for combo in combos]


@dataclass(frozen=True)
class CellResult:
    outcome: str
    """"exact", "refused: ...", "ran: no reference", or "FAIL: ..."."""
    seconds: float


def run_cell(cell: Cell, model_dir: Path) -> CellResult:
    started = time.perf_counter()
    try:
        outcome = _run(cell, model_dir)
    except AssertionError as e:
        outcome = f"FAIL: {e}"
    except Exception as e:  # neither the reference's tokens nor a refusal: the cell fails, the run goes on
        outcome = f"FAIL: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    return CellResult(outcome, time.perf_counter() - started)


def _run(cell: Cell, model_dir: Path) -> str:
    family = FAMILIES[cell.family]
    options = [OPTIONS[o] for o in cell.options]
    engine = {"max_model_len": MAX_MODEL_LEN, "num_pages": 64, **dict(family.engine_options)}
    for option in options:
        engine.update(option.engine)
    if "preemption" in cell.options:
        verified = "decoder verified" in cell.options
        engine["num_pages"] = family.verified_preemption_pages if verified else family.preemption_pages
    if "quantization" in engine:
        engine["quantization_group_size"] = QUANT_GROUP_SIZE
    params = _params(cell, model_dir, engine.get("quantization"), options)
    llm = None
    try:
        llm = LLM(str(model_dir), **engine)
        if "prefix hit" in cell.options:
            llm.generate(_prompts(), params)  # fills the prefix cache
        outputs = llm.generate(_prompts(), params)
        preemptions = llm.engine.stats().num_preemptions
    except GenerationFailed as e:
        raise AssertionError(f"failed inside a step: {e}") from None
    except ValueError as e:
        return _refusal(str(e), options, llm)
    finally:
        if llm is not None:
            llm.shutdown()
    assert "preemption" not in cell.options or preemptions, "the page budget preempted nothing"
    return _check(cell, model_dir, engine.get("quantization"), params, outputs)


def _prompts() -> list[dict[str, list[int]]]:
    return [{"prompt_token_ids": p} for p in PROMPTS]


def _base_params(family: str) -> SamplingParams:
    if family == "diffusion_gemma":
        return SamplingParams(max_tokens=8, seed=12)
    threshold = 0.5 if family.startswith("clover") else 0.7
    return SamplingParams(max_tokens=8, ignore_eos=True, threshold=threshold, temperature=0.0)


def _params(cell: Cell, model_dir: Path, quantization: str | None, options: list[Option]) -> list[SamplingParams]:
    base = _base_params(cell.family)
    for option in options:
        base = base.replace(**option.params)
    if "structured" in cell.options:
        base = base.replace(ignore_eos=False)
    params = [base if base.seed is None else base.replace(seed=base.seed + 10 * i) for i in range(len(PROMPTS))]
    refused = base.decoder == "verified" and FAMILIES[cell.family].reference not in ("clover", "clover_ar")
    if "stop string" in cell.options and (refused or not (model_dir / "tokenizer.json").exists()):
        # A model without a tokenizer refuses stop strings, one without a next-token causal path verified
        # decoding (its reference has no such decoder to give an answer to cut): either way no step runs.
        params = [p.replace(stop=["a"]) for p in params]
    elif "stop string" in cell.options:
        texts = _reference_texts(cell, model_dir, quantization, params)
        hits = [c for text in texts for c in text[1:] if c.isprintable() and not c.isspace()]
        assert hits, f"the reference answers {texts} hold no character to stop at"
        stop = hits[len(hits) // 2]  # a character some answer holds, past its first
        params = [p.replace(stop=[stop]) for p in params]
    return params


def _reference_texts(cell: Cell, model_dir: Path, quantization: str | None, params: list[SamplingParams]) -> list[str]:
    """The reference answers as text (the tokenizer's decode, special tokens skipped)."""
    tokenizer = Tokenizer(str(model_dir))
    kv_fp8 = "kv fp8" in cell.options
    answers = [
        reference_tokens(cell.family, str(model_dir), quantization, kv_fp8, tuple(prompt), p.replace(stop=[]))
        for prompt, p in zip(PROMPTS, params)
    ]
    return [tokenizer.decode(list(a), skip_special_tokens=True) for a in answers]


def _refusal(message: str, options: list[Option], llm: LLM | None) -> str:
    assert "\n" not in message, f"a refusal must be one line: {message!r}"
    assert llm is None or llm.engine.counters.num_steps == 0, f"refused after a step ran: {message}"
    named = [o.name for o in options if any(n in message for n in o.names)]
    assert named or not any(o.names for o in options), f"the refusal names no option: {message}"
    return f"refused: {message}"


def _check(cell: Cell, model_dir: Path, quantization: str | None, params: list[SamplingParams], outputs: list) -> str:
    names = set(cell.options)
    family = FAMILIES[cell.family]
    reference_params = [p.replace(n=1, logprobs=None, prompt_logprobs=None, stop=[]) for p in params]
    if "structured" in names or not _has_reference(family.reference, quantization, params[0]):
        _check_without_reference(names, outputs)
        return "exact" if "structured" in names else "ran: no reference"
    if "stop string" in names:
        stop = params[0].stop[0]
        for text, out in zip(_reference_texts(cell, model_dir, quantization, params), outputs):
            assert out.outputs[0].text == text.split(stop)[0], f"{out.outputs[0].text!r} != {text!r} cut at {stop!r}"
        return "exact"
    kv_fp8 = "kv fp8" in names
    for prompt, p, out in zip(PROMPTS, reference_params, outputs):
        for i, completion in enumerate(out.outputs):
            child = p if p.seed is None else p.replace(seed=p.seed + i)
            expected = reference_tokens(cell.family, str(model_dir), quantization, kv_fp8, tuple(prompt), child)
            assert tuple(completion.token_ids) == expected, f"{completion.token_ids} != reference {list(expected)}"
            if "logprobs" in names:
                assert completion.logprobs is not None and len(completion.logprobs) == len(expected)
        if "prompt scoring" in names:
            assert out.prompt_logprobs is not None and len(out.prompt_logprobs) == len(prompt)
    if "prefix hit" in names and ("preemption" not in names or family.prefix_survives_preemption):
        assert any(o.num_cached_tokens for o in outputs), "the second run found no prefix in the cache"
    return "exact"


def _has_reference(kind: str, quantization: str | None, params: SamplingParams) -> bool:
    """Whether the family's reference can run the option: transformers' DiffusionGemma cannot take our quantized
    weights; sampled verified decoding on a Clover with the diffusion tensors is distributed as the autoregressive
    reference's sampling (tests/engine/test_verified_sampling.py) but draws differently."""
    if kind == "clover" and params.decoder == "verified" and params.temperature:
        return False
    return kind != "transformers" or quantization is None


def _check_without_reference(names: set[str], outputs: list) -> None:
    """Structured output: each answer's text is a match of the grammar (the grammar is the oracle);
    otherwise every request ran to its end."""
    for out in outputs:
        for completion in out.outputs:
            assert completion.finish_reason in ("stop", "length"), completion.finish_reason
            if "structured" in names:
                assert re.fullmatch(STRUCTURED, completion.text), f"{completion.text!r} does not match {STRUCTURED}"
