"""DiffusionGemma served by the engine == transformers' `generate`, draw for draw: the same canvas at every
denoising step, the same accepted positions, the same final tokens (fp32, tiny random checkpoints written by
transformers). transformers runs each request alone, drawing by the engine's counter rule keyed by the request's
seed (reference_counter_draws: the hash and the inverse-CDF draw in Python integers, in place of its global
generator); the engine runs them batched step by step (one batched renoise step for all canvases, each request
its own seed and knobs), through its paged caches: full layers on pages, sliding layers on a window group whose
pages are freed behind the window (prompts shorter and longer than the window, 8), the self-conditioning input in
the canvas pool. Also under preemption (canvases redone: the same draws, keyed by the canvas's start), with
prefix-cache hits (pages with holes below the window), and alone against batched in any order. Mutating the
acceptance rule, the temperature schedule or the draws' key (the batch row for the request, no step) breaks the
match.

The test models' self-conditioning is damped (`feedback` 0.1): with full-strength random weights the
previous-step -> next-step loop multiplies any rounding difference by ~7 per step (measured), so two correct
fp32 implementations part after a few steps; at 0.1 the loop contracts."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import pytest
import torch

from diffuserve.config import EngineConfig
from diffuserve.core.cache.paged import FREED
from diffuserve.decoding import renoise as renoise_decoding
from diffuserve.decoding import renoise_steps as decoding
from diffuserve.decoding.renoise_draws import DrawKeys, draw_bits
from diffuserve.decoding.renoise_steps import CanvasKnobs
from diffuserve.engine.llm_engine import LLMEngine
from diffuserve.reference.diffusion_gemma_hf import (
    FAST,
    FAST_CANVAS,
    PUBLISHED_STYLE,
    GenerateRecord,
    load_hf_model,
    recorded_generate,
    write_hf_checkpoint,
)
from diffuserve.sampling_params import SamplingParams

pytest.importorskip("transformers")
pytestmark = pytest.mark.hf

EOS = (1, 7)


@dataclass
class EngineRecord:
    """Per request id, every denoising step the engine ran (in order): its input canvas and accepted positions."""

    canvases: dict[str, list[torch.Tensor]] = field(default_factory=lambda: defaultdict(list))
    accepted: dict[str, list[torch.Tensor]] = field(default_factory=lambda: defaultdict(list))
    tokens: dict[str, list[int]] = field(default_factory=dict)
    pages: dict[str, list[tuple[int, int]]] = field(default_factory=lambda: defaultdict(list))
    """Per page group, after every step: (pages a request holds, table entries freed behind its window), the
    largest over the running requests."""


def _checkpoint(tmp_path_factory, name: str, generation: dict, canvas_length: int = 16, **text):
    out = tmp_path_factory.mktemp(name)
    return write_hf_checkpoint(out, text, canvas_length, seed=3, feedback=0.1, generation=generation)


@pytest.fixture(scope="module")
def published(tmp_path_factory):
    model_dir = _checkpoint(tmp_path_factory, "published", PUBLISHED_STYLE)
    return model_dir, load_hf_model(model_dir)


@pytest.fixture(scope="module")
def fast(tmp_path_factory):
    model_dir = _checkpoint(tmp_path_factory, "fast", FAST, FAST_CANVAS)
    return model_dir, load_hf_model(model_dir)


def _engine(model_dir, **options) -> LLMEngine:
    config = dict(dtype="float32", device="cpu", max_model_len=160, max_num_seqs=8, page_size=4) | options
    return LLMEngine(EngineConfig.from_kwargs(str(model_dir), **config))


def run_engine(
    engine: LLMEngine, monkeypatch, requests: dict[str, tuple[list[int], SamplingParams]], stagger: bool = False
) -> EngineRecord:
    """Runs `requests` (id -> prompt, params) together (`stagger`: one more joins after every step), recording
    every denoising step of each (the renoise decoder's batched step wrapped: each request's input canvas and
    accepted positions)."""
    record = EngineRecord()
    decoder = next(d for d in engine.runner.decoding.registry.decoders() if d.name == "renoise")
    step, decode_blocks, block_tokens = decoding.denoise_step, decoder.decode_blocks, decoder.block_tokens
    results, inputs = [], {}

    def recording_tokens(batch, generators):
        tokens = block_tokens(batch, generators)
        inputs.update((request.request_id, canvas) for request, canvas in zip(batch, tokens))
        return tokens

    def recording_step(logits, knobs, keys):
        results.append(step(logits, knobs, keys))
        return results[-1]

    def recording_decode(batch, rows, positions, generators):
        canvases = [torch.tensor(inputs[r.request_id]) for r in batch]  # the step's input canvases
        decoded = decode_blocks(batch, rows, positions, generators)
        for request, canvas, accepted in zip(batch, canvases, results.pop().accepted):
            record.canvases[request.request_id].append(canvas)
            record.accepted[request.request_id].append(accepted.clone())
        return decoded

    with monkeypatch.context() as patch:  # undone when the run ends (an engine may run again)
        patch.setattr(renoise_decoding, "denoise_step", recording_step)
        patch.setattr(decoder, "decode_blocks", recording_decode)
        patch.setattr(decoder, "block_tokens", recording_tokens)
        pending = list(requests.items())
        while pending or engine.has_unfinished_requests():
            for request_id, (prompt, params) in pending[: 1 if stagger else len(pending)]:
                engine.add_request(request_id, prompt, params)
            pending = pending[1:] if stagger else []
            for output in engine.step():
                if output.finished:
                    record.tokens[output.request_id] = output.outputs[0].token_ids
            _record_pages(engine, record)
    engine.cache.check_invariants()
    return record


def _record_pages(engine: LLMEngine, record: EngineRecord) -> None:
    for group in engine.cache.kinds[: 1 + len(engine.runner.executor.sizes.windows)]:
        tables = [r.pages.get(group.name, []) for r in engine.scheduler.running]
        held = max((sum(p != FREED for p in t) for t in tables), default=0)
        freed = max((sum(p == FREED for p in t) for t in tables), default=0)
        record.pages[group.name].append((held, freed))


def expected_tokens(sequences: torch.Tensor, prompt: list[int], max_tokens: int) -> list[int]:
    """transformers' generated tokens as the API returns them: up to and including the first EOS, at most
    max_tokens (transformers returns whole canvases, the tokens after an EOS as pad)."""
    generated = sequences[0, len(prompt) :].tolist()[:max_tokens]
    first_eos = next((i for i, t in enumerate(generated) if t in EOS), None)
    return generated if first_eos is None else generated[: first_eos + 1]


def differences(expected: tuple[torch.Tensor, GenerateRecord], got: EngineRecord, request_id: str, prompt, params):
    """What differs between transformers' run of one request and the engine's (empty: identical)."""
    sequences, record = expected
    canvases, accepted = got.canvases[request_id], got.accepted[request_id]
    found = []
    if len(record.canvases) != len(canvases):
        found.append(f"{len(record.canvases)} steps vs {len(canvases)}")
    for step, pair in enumerate(zip(record.canvases, canvases, record.accepted, accepted)):
        if not (torch.equal(pair[0], pair[1]) and torch.equal(pair[2], pair[3])):
            found.append(f"step {step}: canvas or accepted positions differ")
            break
    if expected_tokens(sequences, prompt, params.max_tokens) != got.tokens[request_id]:
        found.append("final tokens differ")
    return found


def _hf_kwargs(params: SamplingParams) -> dict:
    """generate() kwargs for a request's knobs that differ from the FAST checkpoint's."""
    from transformers.models.diffusion_gemma.generation_diffusion_gemma import EntropyBoundSamplerConfig

    names = {"steps": "max_denoising_steps", "t_min": "t_min", "t_max": "t_max"}
    names |= {"stability_threshold": "stability_threshold", "max_tokens": "max_new_tokens"}
    kwargs = {hf: getattr(params, ours) for ours, hf in names.items() if getattr(params, ours) is not None}
    if params.entropy_bound is not None:
        kwargs["sampler_config"] = EntropyBoundSamplerConfig(entropy_bound=params.entropy_bound)
    return kwargs


def test_one_request_matches_transformers_generate(published, monkeypatch):
    """Default denoising knobs from generation_config.json, a 40-token prompt (window 8): every step and the
    tokens identical; three canvases (the last cut at max_tokens 40)."""
    model_dir, hf = published
    prompt, params = list(range(2, 42)), SamplingParams(max_tokens=40, seed=2)
    got = run_engine(_engine(model_dir), monkeypatch, {"r": (prompt, params)})
    assert differences(recorded_generate(hf, prompt, 2), got, "r", prompt, params) == []
    assert len(got.canvases["r"]) >= 2 * 48  # the second canvas committed and denoised after the first
    # Full layers keep every position's pages (pages of 4); the sliding group (window 8) holds at most the window
    # behind a canvas and the canvas (8 + 16: 6 pages, + 1 straddling), freeing the pages behind it.
    full, (window,) = got.pages["kv"], [g for n, g in got.pages.items() if n != "kv"]
    canvases = -(-len(got.tokens["r"]) // 16)
    assert max(held for held, _ in full) == (40 + 16 * canvases) // 4 and max(freed for _, freed in full) == 0
    assert max(held for held, _ in window) <= 7 and max(freed for _, freed in window) >= (40 - 8) // 4


BATCH = {
    "short": ([5, 6, 9], SamplingParams(max_tokens=40, seed=11)),
    "stable2": (list(range(10, 19)), SamplingParams(max_tokens=40, seed=12, stability_threshold=2)),
    "window": (list(range(30, 55)), SamplingParams(max_tokens=40, seed=13)),
    "hot": (list(range(40, 80)), SamplingParams(max_tokens=40, seed=14, t_min=0.2, t_max=1.0, steps=9)),
    "bound": (
        list(range(40, 80)),
        SamplingParams(max_tokens=20, seed=15, entropy_bound=0.3, stability_threshold=0),
    ),
}
"""Five requests with their own seeds and knobs; prompts of 3 to 40 tokens around the window (8)."""


def test_batched_requests_each_match_their_own_transformers_run(fast, monkeypatch):
    """The five requests batched in one engine (one joining after every step: canvases at different steps
    share forwards, fused commits beside first steps) == five transformers runs; early stops and an EOS-ended
    request among them."""
    model_dir, hf = fast
    got = run_engine(_engine(model_dir), monkeypatch, BATCH, stagger=True)
    for request_id, (prompt, params) in BATCH.items():
        expected = recorded_generate(hf, prompt, params.seed, **_hf_kwargs(params))
        assert differences(expected, got, request_id, prompt, params) == [], request_id
    steps = {r: len(c) for r, c in got.canvases.items()}
    assert any(steps[r] < -(-len(got.tokens[r]) // FAST_CANVAS) * (p.steps or 12) for r, (_, p) in BATCH.items())
    assert any(len(got.tokens[r]) < p.max_tokens for r, (_, p) in BATCH.items())  # ended by an EOS


def test_a_model_without_experts_matches(tmp_path_factory, monkeypatch):
    model_dir = _checkpoint(tmp_path_factory, "dense", FAST, FAST_CANVAS, num_experts=0, top_k_experts=0)
    prompt, params = list(range(3, 23)), SamplingParams(max_tokens=24, seed=5)
    got = run_engine(_engine(model_dir), monkeypatch, {"r": (prompt, params)})
    assert (
        differences(
            recorded_generate(load_hf_model(model_dir), prompt, 5, **_hf_kwargs(params)), got, "r", prompt, params
        )
        == []
    )


def test_preempted_canvases_are_redone_exactly(fast, monkeypatch):
    """Too few pages for the batch (several sizes): requests are preempted, at a canvas's start or in its middle
    (their canvas slot, and with it the self-conditioning input, given back), and redo the canvas from the
    generator state saved at its start; a preempted request's slot is overwritten with noise, as another request
    taking it would. The tokens equal an unconstrained run's, and transformers'."""
    model_dir, hf = fast
    unconstrained = run_engine(_engine(model_dir), monkeypatch, BATCH)
    redone = set()
    for num_pages in (24, 32, 40):
        tight = _engine(model_dir, num_pages=num_pages, max_num_batched_tokens=64)
        _noise_on_preemption(tight)
        got = run_engine(tight, monkeypatch, BATCH)
        assert tight.scheduler.num_preemptions > 0 and got.tokens == unconstrained.tokens, num_pages
        redone |= {r for r in BATCH if len(got.canvases[r]) > len(unconstrained.canvases[r])}
    assert redone  # some canvas was stepped, dropped with its slot and stepped again
    request_id = sorted(redone)[0]
    prompt, params = BATCH[request_id]
    expected = recorded_generate(hf, prompt, params.seed, **_hf_kwargs(params))[0]
    assert unconstrained.tokens[request_id] == expected_tokens(expected, prompt, params.max_tokens)


def _noise_on_preemption(engine: LLMEngine) -> None:
    preempt, pool = engine.scheduler._preempt, engine.runner.executor.caches.canvas
    assert pool is not None

    def preempt_and_clobber(request):
        slot = request.canvas_slot
        preempt(request)
        if slot is not None:
            pool.soft[slot] = torch.randn_like(pool.soft[slot])

    engine.scheduler._preempt = preempt_and_clobber


def test_prefix_cache_hits_match_a_run_without_them(fast, monkeypatch):
    """A second request whose prompt is the first's prompt and answer (a chat turn) reuses their committed pages
    (the canvas K/V the encoder wrote), the sliding window group with its pages below the window freed; it
    decodes what a fresh engine without a prefix cache decodes, and what transformers does."""
    model_dir, hf = fast
    engine = _engine(model_dir)
    first_prompt = list(range(20, 50))
    first = run_engine(engine, monkeypatch, {"a": (first_prompt, SamplingParams(max_tokens=12, seed=3))})
    prompt = first_prompt + first.tokens["a"] + [60, 61, 62]
    params = SamplingParams(max_tokens=16, seed=4)
    got = run_engine(engine, monkeypatch, {"b": (prompt, params)})
    hits = engine.scheduler.num_prefix_hit_tokens
    assert hits >= len(first_prompt) // 4 * 4 + 8  # past the prompt, into the first answer's committed canvas
    fresh = run_engine(_engine(model_dir, enable_prefix_caching=False), monkeypatch, {"b": (prompt, params)})
    assert got.tokens["b"] == fresh.tokens["b"]
    assert differences(recorded_generate(hf, prompt, 4, **_hf_kwargs(params)), got, "b", prompt, params) == []


def _accept_including_the_largest(entropy: torch.Tensor, bound: torch.Tensor) -> torch.Tensor:
    ordered, order = torch.sort(entropy, dim=-1)
    chosen = torch.cumsum(ordered, dim=-1) <= bound[:, None]  # mutation: the sum keeps its largest term
    return torch.scatter(torch.zeros_like(chosen), -1, order, chosen)


def _temperature_rising(steps: torch.Tensor, knobs: CanvasKnobs) -> torch.Tensor:
    done = steps + 1  # mutation: steps taken instead of steps left
    return knobs.t_min + (knobs.t_span * (done / knobs.max_steps))


def _keyed_by_row(keys: DrawKeys, stream: int, length: int) -> torch.Tensor:
    rows = torch.arange(len(keys.seeds), device=keys.seeds.device)  # mutation: the batch row for the request's seed
    return draw_bits(DrawKeys(rows, keys.block_starts, keys.steps), stream, length)


def _without_the_step(keys: DrawKeys, stream: int, length: int) -> torch.Tensor:
    return draw_bits(DrawKeys(keys.seeds, keys.block_starts, keys.steps * 0), stream, length)  # mutation: no step


@pytest.mark.parametrize(
    ("name", "mutant"),
    [
        ("entropy_bound_accept", _accept_including_the_largest),
        ("step_temperature", _temperature_rising),
        ("draw_bits", _keyed_by_row),
        ("draw_bits", _without_the_step),
    ],
)
def test_mutations_break_the_match(fast, monkeypatch, name, mutant):
    model_dir, hf = fast
    prompt, params = BATCH["window"]
    expected = recorded_generate(hf, prompt, params.seed, **_hf_kwargs(params))
    monkeypatch.setattr(decoding, name, mutant)
    got = run_engine(_engine(model_dir), monkeypatch, {"r": (prompt, params)})
    assert differences(expected, got, "r", prompt, params) != []


def _alone(model_dir, monkeypatch, ids: list[str]) -> dict[str, list[int]]:
    """Each of these BATCH requests decoded alone, in an engine of its own."""
    return {r: run_engine(_engine(model_dir), monkeypatch, {r: BATCH[r]}).tokens[r] for r in ids}


def _batched(model_dir, monkeypatch, ids: list[str]) -> list[dict[str, list[int]]]:
    """These BATCH requests batched in two orders (one joining per step)."""
    orders = [ids, list(reversed(ids))]
    return [run_engine(_engine(model_dir), monkeypatch, {r: BATCH[r] for r in order}, True).tokens for order in orders]


@pytest.fixture(scope="module")
def alone(fast) -> dict[str, list[int]]:
    """Every BATCH request's tokens decoded alone, unmutated (computed once for the tests that compare with them)."""
    with pytest.MonkeyPatch.context() as patch:
        return _alone(fast[0], patch, list(BATCH))


def test_a_request_decodes_the_same_alone_and_batched_in_any_order(fast, alone, monkeypatch):
    """The draws are keyed by the request (seed, canvas start, step, position), not by its row in the batch: every
    request's tokens alone equal its tokens batched, whatever the order it was batched in."""
    assert all(tokens == alone for tokens in _batched(fast[0], monkeypatch, list(BATCH)))


def test_draws_keyed_by_the_batch_row_break_alone_equals_batched(fast, monkeypatch):
    model_dir, _ = fast
    monkeypatch.setattr(decoding, "draw_bits", _keyed_by_row)
    ids = ["short", "window"]
    alone = _alone(model_dir, monkeypatch, ids)
    assert any(tokens != alone for tokens in _batched(model_dir, monkeypatch, ids))


def test_min_tokens_forbids_the_stop_ids_of_its_own_canvases_only(fast, monkeypatch):
    """Two requests batched, the same prompt and seed, stopping on a token the free one writes early: the one with
    min_tokens never writes it below min_tokens (its stop ids at -inf in its rows of the batched step), the free
    one still does (the other rows untouched)."""
    model_dir, _ = fast
    prompt, base = list(range(30, 55)), SamplingParams(max_tokens=12, seed=21, ignore_eos=True)
    free = run_engine(_engine(model_dir), monkeypatch, {"free": (prompt, base)}).tokens["free"]
    stop = free[1]
    params = {"free": base.replace(stop_token_ids=[stop]), "min": base.replace(stop_token_ids=[stop], min_tokens=8)}
    got = run_engine(_engine(model_dir), monkeypatch, {r: (prompt, p) for r, p in params.items()}).tokens
    assert stop in got["free"][:8]
    assert stop not in got["min"][:8]


def test_a_penalised_canvas_beside_batched_ones(fast, alone, monkeypatch):
    """A request with a penalty is decoded on its own (its rows penalised first) while the others of the chunk go
    through the batched step, taken out of the chunk's rows around it: every request decodes what it decodes
    alone."""
    model_dir, _ = fast
    requests = dict(BATCH)
    prompt, params = requests["stable2"]
    requests["stable2"] = (prompt, params.replace(presence_penalty=1.5))
    penalised = run_engine(_engine(model_dir), monkeypatch, {"stable2": requests["stable2"]}).tokens["stable2"]
    assert run_engine(_engine(model_dir), monkeypatch, requests).tokens == {**alone, "stable2": penalised}
    assert penalised != alone["stable2"]
