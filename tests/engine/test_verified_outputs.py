"""Verified decoding (decoder=verified) with logprobs and with structured output, on the tiny random Clover of
tests/engine/test_verified_decoding.py (whose drafts are mostly wrong, so most blocks are rolled back somewhere):

- logprobs are the causal rows': equal to an uncached causal recompute of prompt + output (the mask token at
  probability 0; sampled: the tempered, top-k filtered distribution, written here without the engine's code), to
  transformers' Qwen3_5MoeForCausalLM on the same weights, and to the engine's own autoregressive decoding;
- structured output: the verified, grammar-constrained tokens are the engine's grammar-constrained autoregressive
  tokens (JSON schema, regex, choice), on the tiny model and on the bundled one.

A verifier that ignores the grammar mask, or logprobs read from the drafts' rows, fails them."""

from __future__ import annotations

import json
import math
import re
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from diffuserve import LLM, SamplingParams
from diffuserve.core.request import Request
from diffuserve.core.writes import BlockWrite
from diffuserve.decoding import constrained, verified
from diffuserve.decoding.logprobs import logprob_rows, token_logprobs
from diffuserve.decoding.protocol import BlockDecode
from diffuserve.errors import GenerationFailed
from diffuserve.model.families.clover_moe.dense import DenseClover
from diffuserve.model.families.clover_moe.gdn_preview import DIFFUSION_TENSORS
from diffuserve.model.hub import resolve_model
from diffuserve.model.loader import load_model
from diffuserve.structured_outputs import StructuredOutputsParams
from tests.engine.test_oracle_mutations import apply_source_mutation
from tests.engine.test_verified_decoding import PROMPTS, _checkpoints, _greedy

TOLERANCE = dict(rel_tol=1e-5, abs_tol=2e-4)
"""fp32 on CPU: the engine's cached forward and an uncached recompute differ by ~1e-6 to 1e-4 in the logits, up to
~1e-4 in a logprob (an unlikely alternative at -16, or one at temperature 0.8, which scales the logits' noise by
1.25); a logprob read from a wrong row is off by far more."""
HF_TOLERANCE = dict(rel_tol=1e-4, abs_tol=1e-3)
"""transformers' own (torch) gated-delta and attention code: logprobs ~1e-4 apart from ours."""
PREEMPTING = dict(num_pages=5, max_model_len=128)
"""With a state budget of 4 slots (`_engine`): 8 requests preempt one another."""
SPECS = [
    StructuredOutputsParams(
        json={
            "type": "object",
            "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "minimum": 0, "maximum": 99}},
            "required": ["ok", "n"],
            "additionalProperties": False,
        }
    ),
    StructuredOutputsParams(regex=r"(yes|no)-[a-c]{2,5}"),
    StructuredOutputsParams(choice=["red", "green", "blue"]),
]


@pytest.fixture(scope="module")
def dirs(tmp_path_factory) -> tuple[Path, Path]:
    """(the tiny Clover with the diffusion tensors, the same weights without them)."""
    return _checkpoints(tmp_path_factory.mktemp("verified-outputs"), 4)


def _engine(model_dir: Path, preempting: bool = False) -> LLM:
    if not preempting:
        return LLM(str(model_dir), device="cpu", max_model_len=128)
    slot = LLM(str(model_dir), device="cpu", max_model_len=128).engine.state_pool.slot_bytes
    return LLM(str(model_dir), device="cpu", state_cache_memory=4 * slot, **PREEMPTING)


def _reference(
    model_dir: Path,
    prompt: list[int],
    tokens: list[int],
    params: SamplingParams,
    stop_ids: frozenset[int] = frozenset(),
) -> torch.Tensor:
    """[T, V] the log-distribution of each output position from one uncached causal pass over prompt + tokens:
    the mask token at probability 0, the stop ids too below min_tokens, and with a temperature the logits divided
    by it, outside the top-k at 0."""
    _, model = _loaded(model_dir)
    with torch.no_grad():
        hidden, _ = DenseClover(model).forward_causal(torch.tensor([prompt + tokens]))
        logits = model.compute_logits(hidden[0, len(prompt) - 1 : len(prompt) - 1 + len(tokens)]).float()
    logits[:, model.args.mask_token_id] = float("-inf")
    logits[: params.min_tokens, sorted(stop_ids)] = float("-inf")  # no stop below min_tokens
    if params.temperature:
        logits = logits / params.temperature
        if params.top_k:
            kth = logits.sort(dim=-1, descending=True).values[:, params.top_k - 1 : params.top_k]
            logits = torch.where(logits < kth, float("-inf"), logits)
    return torch.log_softmax(logits, dim=-1)


_MODELS: dict[Path, tuple] = {}


def _loaded(model_dir: Path) -> tuple:
    if model_dir not in _MODELS:
        _MODELS[model_dir] = load_model(model_dir)
    return _MODELS[model_dir]


def _assert_logprobs(completion, log_probs: torch.Tensor, k: int, tolerance: dict = TOLERANCE) -> None:
    """Each token's logprob, rank and top-k alternatives are those of its row of `log_probs` [T, V]."""
    assert completion.logprobs is not None and len(completion.logprobs) == len(completion.token_ids) > 0
    for token, entry, row in zip(completion.token_ids, completion.logprobs, log_probs, strict=True):
        assert math.isclose(entry[token].logprob, float(row[token]), **tolerance)
        assert entry[token].rank == 1 + int((row > row[token]).sum())
        values, ids = row.topk(k)
        top = {int(t): float(v) for t, v in zip(ids, values) if v > float("-inf")}
        assert {t for t in entry if t != token} <= top.keys() and top.keys() <= entry.keys()
        assert all(math.isclose(entry[t].logprob, v, **tolerance) for t, v in top.items())


CASES = {
    "greedy, preempted": (_greedy(12, decoder="verified", logprobs=3), True),
    "greedy, cut by stop ids": (
        _greedy(12, decoder="verified", logprobs=0, ignore_eos=False, stop_token_ids=[17, 55, 100, 3], min_tokens=3),
        False,
    ),
    "sampled, top-k": (_greedy(12, decoder="verified", logprobs=2, temperature=0.8, top_k=20, seed=3), True),
}


@pytest.mark.parametrize("case", list(CASES))
def test_verified_logprobs_are_the_causal_rows(dirs, case):
    bd, ar = dirs
    params, preempting = CASES[case]
    llm = _engine(bd, preempting)
    outputs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params)
    stop_ids = llm.engine.resolve_params(params, 1).stop_ids  # the stop ids and the model's EOS ids
    for prompt, out in zip(PROMPTS, outputs, strict=True):
        tokens = list(out.outputs[0].token_ids)
        _assert_logprobs(out.outputs[0], _reference(bd, prompt, tokens, params, stop_ids), params.logprobs or 0)
    if not params.temperature:  # the engine's autoregressive decoding: the same tokens and the same logprobs
        plain = params.replace(decoder=None)
        for out, auto in zip(outputs, _engine(ar).generate([{"prompt_token_ids": p} for p in PROMPTS], plain)):
            assert out.outputs[0].token_ids == auto.outputs[0].token_ids
            assert out.outputs[0].logprobs == auto.outputs[0].logprobs or all(
                a.keys() == b.keys() and all(math.isclose(a[t].logprob, b[t].logprob, **TOLERANCE) for t in a)
                for a, b in zip(out.outputs[0].logprobs, auto.outputs[0].logprobs, strict=True)
            )


@pytest.mark.hf
def test_verified_logprobs_equal_transformers_log_softmax(dirs):
    pytest.importorskip("transformers")
    from tests.model.test_clover_moe_parity import _hf_model

    bd, _ = dirs
    params = _greedy(12, decoder="verified", logprobs=4)
    outputs = _engine(bd).generate([{"prompt_token_ids": p} for p in PROMPTS[:4]], params)
    hf = _hf_model(bd)
    mask = json.loads((bd / "config.json").read_text())["mask_token_id"]
    for prompt, out in zip(PROMPTS, outputs):
        tokens = list(out.outputs[0].token_ids)
        with torch.no_grad():
            logits = hf(input_ids=torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1 : -1].float()
        logits[:, mask] = float("-inf")
        _assert_logprobs(out.outputs[0], torch.log_softmax(logits, dim=-1), 4, HF_TOLERANCE)


def test_verified_prompt_logprobs_are_the_engines_prompt_scores(dirs):
    """Prompt scoring does not depend on the decoder: verified requests score their prompt as threshold ones (a
    verified request commits its whole prompt, a threshold one only its complete blocks, so the last block's
    scores come from forwards of another layout: equal within fp32 noise)."""
    bd, _ = dirs
    prompts = [{"prompt_token_ids": p} for p in PROMPTS[:3]]
    llm = _engine(bd)
    got = llm.generate(prompts, _greedy(8, decoder="verified", prompt_logprobs=2))
    want = llm.generate(prompts, _greedy(8, prompt_logprobs=2))
    for g, w in zip(got, want, strict=True):
        assert g.prompt_logprobs is not None and w.prompt_logprobs is not None
        assert g.prompt_logprobs[0] is None and w.prompt_logprobs[0] is None
        for a, b in zip(g.prompt_logprobs[1:], w.prompt_logprobs[1:], strict=True):
            assert a is not None and b is not None and a.keys() == b.keys()
            assert all(a[t].rank == b[t].rank and math.isclose(a[t].logprob, b[t].logprob, **TOLERANCE) for t in a)
    assert all(o.prompt_logprobs is not None and len(o.prompt_logprobs) == len(p) for o, p in zip(got, PROMPTS))


def _oracle_drafts(monkeypatch, ar: Path) -> None:
    """Drafts written by an oracle that knows the autoregressive answer and gets every position p with
    p % 5 == 3 wrong (blocks kept whole, others cut anywhere), with logprobs from the diffusion rows it was given,
    as a drafting mask decoder computes them: random weights' own drafts are kept practically only right after
    decided tokens, where the draft row is the causal row, so only such an oracle keeps drafts whose rows differ."""
    answers = {
        tuple(p): o.outputs[0].token_ids + [0] * 8
        for p, o in zip(PROMPTS, _engine(ar).generate([{"prompt_token_ids": p} for p in PROMPTS], _greedy(12)))
    }

    def oracle(self, request, rows, positions, generators):
        first = request.block_start - request.num_prompt_tokens  # output position of canvas index 0
        answer = answers[tuple(request.prompt_token_ids)]
        tokens = torch.zeros(self.block_length, dtype=torch.long)
        for i in positions:
            tokens[i] = answer[first + i] + (1 if (request.block_start + i) % 5 == 3 else 0)
        index = torch.tensor(positions)
        table = logprob_rows(torch.log_softmax(rows, dim=-1), tokens[index], index, self.block_length, 3)
        accepted = [(i, int(tokens[i])) for i in positions]
        return BlockDecode(BlockWrite(accepted, token_logprobs(table, tokens, index)))

    monkeypatch.setattr(verified.VerifiedDecoder, "decode", oracle)


def _check_oracle_drafted_logprobs(bd: Path) -> None:
    params = _greedy(12, decoder="verified", logprobs=3)
    llm = _engine(bd)
    outputs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params)
    spec = llm.engine.stats().spec_decode
    assert spec.num_accepted_tokens > spec.num_drafts  # drafts kept past a block's first position
    for prompt, out in zip(PROMPTS, outputs, strict=True):
        _assert_logprobs(out.outputs[0], _reference(bd, prompt, list(out.outputs[0].token_ids), params), 3)


def test_verified_logprobs_of_drafts_kept_whole_or_cut_anywhere(dirs, monkeypatch):
    bd, ar = dirs
    _oracle_drafts(monkeypatch, ar)
    _check_oracle_drafted_logprobs(bd)


def test_logprobs_read_from_the_draft_rows_fail_the_check(dirs, monkeypatch):
    """The mutation: each draft a verified position keeps reports the logprobs its drafting step wrote (from the
    diffusion row that proposed it) instead of its causal row's."""
    bd, ar = dirs
    _oracle_drafts(monkeypatch, ar)
    written: dict[tuple[str, int], object] = {}  # (request id, position) -> the draft step's logprobs there
    apply_step = Request.apply_step

    def recording(request: Request, accepted, logprobs=None, final=None) -> None:
        for (index, _), entry in zip(accepted, logprobs or [], strict=False):
            written[request.request_id, request.block_start + index] = entry
        apply_step(request, accepted, logprobs, final)

    verify = verified.VerifiedDecoder.verify

    def from_drafts(self, request, rows, positions, drafts, generators):
        verdict = verify(self, request, rows, positions, drafts, generators)
        own = verdict.logprobs[: verdict.num_accepted]  # a head is checked before its step's writes are recorded
        kept = [written.get((request.request_id, p), o) for p, o in zip(positions, own)]
        return replace(verdict, logprobs=kept + verdict.logprobs[verdict.num_accepted :])  # the correction's: causal

    monkeypatch.setattr(Request, "apply_step", recording)
    monkeypatch.setattr(verified.VerifiedDecoder, "verify", from_drafts)
    with pytest.raises(AssertionError):
        _check_oracle_drafted_logprobs(bd)


def _constrained(model_dir: Path, decoder: str | None, temperature: float = 0.0, preempting: bool = False):
    """Each request's text and tokens: 6 prompts, each constrained by one of the 3 grammars, in one batch."""
    llm = _engine(model_dir, preempting)
    prompts = [{"prompt_token_ids": p} for p in PROMPTS[:6]]
    params = [
        SamplingParams(
            max_tokens=40, temperature=temperature, seed=i, threshold=0.5, structured_outputs=SPECS[i % len(SPECS)]
        ).replace(**({"decoder": decoder} if decoder else {}))
        for i in range(len(prompts))
    ]
    return [(o.outputs[0].text, list(o.outputs[0].token_ids)) for o in llm.generate(prompts, params)]


def _matches(spec: StructuredOutputsParams, text: str) -> bool:
    if spec.json is not None:
        value = json.loads(text)
        return set(value) == {"ok", "n"} and isinstance(value["ok"], bool) and 0 <= value["n"] <= 99
    if spec.regex is not None:
        return re.fullmatch(spec.regex, text) is not None
    return text in (spec.choice or [])


def test_verified_structured_output_is_the_constrained_autoregressive_output(dirs):
    bd, ar = dirs
    want = _constrained(ar, None)
    got = _constrained(bd, "verified", preempting=True)
    assert got == want
    assert all(_matches(SPECS[i % len(SPECS)], text) for i, (text, _) in enumerate(got))
    sampled = _constrained(bd, "verified", temperature=0.9)
    assert all(_matches(SPECS[i % len(SPECS)], text) for i, (text, _) in enumerate(sampled))


GRAMMAR_MUTATIONS = {
    "the causal rows not grammar-masked": (
        verified,
        "rows[i] = grammar_masked(rows[i : i + 1], grammar.allowed())[0]",
        "pass",
    ),
    "the matcher not rolled back to the verified tokens": (
        constrained,
        "state.sync(request.output_token_ids + request.draft.tokens[: positions[0] - first])",
        "pass",
    ),
}


@pytest.mark.parametrize("mutation", list(GRAMMAR_MUTATIONS))
def test_a_verifier_breaking_the_grammar_fails_the_check(dirs, monkeypatch, mutation):
    bd, ar = dirs
    want = _constrained(ar, None)
    apply_source_mutation(monkeypatch, *GRAMMAR_MUTATIONS[mutation])
    try:
        got = _constrained(bd, "verified")
        sampled = _constrained(bd, "verified", temperature=0.9)
    except GenerationFailed:  # a token the grammar refuses reached the matcher: the requests fail
        return
    # Greedy, the matcher stays in step on its own (each step's walk syncs it); a sampled head that is redrawn
    # leaves it one token behind, which only the sync repairs.
    assert got != want or not all(_matches(SPECS[i % len(SPECS)], text) for i, (text, _) in enumerate(sampled))


@pytest.fixture(scope="module")
def bundled(tmp_path_factory) -> tuple[Path, Path]:
    """(the bundled model, the same weights without the diffusion tensors)."""
    model = Path(resolve_model(None))
    ar = tmp_path_factory.mktemp("bundled") / "ar"
    shutil.copytree(model, ar)
    state = load_file(str(ar / "model.safetensors"))
    kept = {n: t for n, t in state.items() if n.rsplit(".", 1)[-1] not in DIFFUSION_TENSORS}
    save_file(kept, str(ar / "model.safetensors"), metadata={"format": "pt"})
    return model, ar


FREE = SamplingParams(max_tokens=24, logprobs=2)
SCHEMA = {"type": "object", "properties": {"answer": {"type": "integer"}}, "required": ["answer"]}


def _bundled_answers(model: Path, ar: Path, params: SamplingParams) -> tuple:
    """(verified on the bundled model, autoregressive on its copy without diffusion tensors) for `27+15 in JSON`."""
    messages = [{"role": "user", "content": "27+15 in JSON"}]
    got = LLM(str(model)).chat(messages, params.replace(decoder="verified")).outputs[0]
    return got, LLM(str(ar)).chat(messages, params).outputs[0]


def _assert_same_logprobs(got, want) -> None:
    assert got.logprobs is not None and want.logprobs is not None
    for a, b in zip(got.logprobs, want.logprobs, strict=True):
        assert a.keys() == b.keys() and all(math.isclose(a[t].logprob, b[t].logprob, **TOLERANCE) for t in a)


@pytest.mark.parametrize("constrained", [False, True])
def test_bundled_model_verified_is_its_autoregressive_output(bundled, constrained):
    """The bundled model was trained as a block-diffusion model, not for its causal reading: verified decoding gives
    its causal path's answer (free, not JSON; under the schema, 22 where its diffusion answer is 42), the same as
    its (grammar-constrained) autoregressive decoding, logprobs included."""
    schema = StructuredOutputsParams(json=SCHEMA) if constrained else None
    got, want = _bundled_answers(*bundled, FREE.replace(structured_outputs=schema))
    assert got.token_ids == want.token_ids and got.num_accepted_tokens > 0
    _assert_same_logprobs(got, want)
    if constrained:
        assert isinstance(json.loads(got.text)["answer"], int)
