"""Standalone DiffusionGemma generation: several requests decoded together, step by step, on our model's paged
forward and the renoise decoding functions (diffusion_gemma_decoding). Not the serving engine: no scheduler, no
page pool, no server; the prototype of what the engine will do (docs/models/diffusion-gemma.md, "DiffusionGemma").

Every forward takes one slice of rows from each unfinished request, in one of two roles:

    commit  committed tokens not yet in the cache (a prompt chunk of at most C tokens, or the canvas just
            finished): causal rows whose K/V the caches keep
    canvas  the request's current canvas (C rows at [P, P + C), P = its committed length): one denoising step,
            its K/V written and overwritten every step, its logits decoded with the request's counter-based draws

K/V live in one slot tensor per layer. Full layers give each request `max_len` slots (slot = base + position);
sliding layers only a ring of R = W - 1 + C slots (slot = base + position mod R): a step never reads a sliding
key more than W - 1 positions before its first row (diffusion_gemma_masks) nor writes more than C rows, so R
slots hold every key it can see. A canvas follows transformers' `generate` for that request: C random tokens,
at most `max_denoising_steps` steps, its tokens the last step's argmax, the tokens after a first EOS set to
`pad_token_id`, stopping after the canvas that holds an EOS or reaches `max_new_tokens` (whole canvases: the
output may run past it, as transformers' does).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from diffuserve.decoding.renoise_draws import DrawKeys
from diffuserve.decoding.renoise_steps import CanvasKnobs, denoise_step, initial_canvas, stop_rule
from diffuserve.model.families.diffusion_gemma.attention import GemmaAttentionInputs
from diffuserve.model.families.diffusion_gemma.config import FULL, SLIDING, gemma_args
from diffuserve.model.families.diffusion_gemma.masks import key_start, rows_mask
from diffuserve.model.families.diffusion_gemma.model import DiffusionGemmaForBlockDiffusion
from diffuserve.model.layers.attention import PagedAttentionInputs, SequenceSlice
from diffuserve.model.shapes import window_group
from diffuserve.model.step_inputs import CanvasInputs, StepInputs
from diffuserve.renoise_knobs import RenoiseDefaults


@dataclass(frozen=True)
class GemmaRequest:
    prompt: list[int]
    seed: int
    knobs: RenoiseDefaults


@dataclass
class GemmaOutput:
    tokens: list[int]
    """Prompt, then every canvas (after its first EOS: pad ids, if the knobs name one)."""
    canvases: list[torch.Tensor] = field(default_factory=list)
    """[C] per denoising step, all canvases in order: the canvas that step denoised."""
    accepted: list[torch.Tensor] = field(default_factory=list)
    """[C] bool per denoising step."""


@dataclass
class _Sequence:
    """One request's progress: its committed tokens (`encoded` of them in the cache) and its canvas."""

    request: GemmaRequest
    output: GemmaOutput
    encoded: int = 0
    canvas: torch.Tensor | None = None
    step: int = 0
    previous: torch.Tensor | None = None
    """[1, C] the argmax canvas of the canvas's last step (-1 before any), and `run`: steps in a row ending on it."""
    run: int = 0
    soft: torch.Tensor | None = None
    finished: bool = False

    @property
    def committed(self) -> int:
        return len(self.output.tokens)


class _Caches:
    """K/V slots of every layer, per kind: full layers `max_len` per request, sliding layers a ring of R."""

    def __init__(self, model: DiffusionGemmaForBlockDiffusion, num_requests: int, max_len: int) -> None:
        gemma = gemma_args(model.args)
        self.window = gemma.sliding_window
        self.ring = gemma.sliding_window - 1 + gemma.canvas_length
        self.per_request = {SLIDING: self.ring, FULL: max_len}
        weight = model.model.embed_tokens.weight
        self.k: dict[str, list[torch.Tensor]] = {}
        self.v: dict[str, list[torch.Tensor]] = {}
        for kind, shape in ((SLIDING, gemma.sliding), (FULL, gemma.full)):
            size = (num_requests * self.per_request[kind], shape.num_kv_heads, shape.head_dim)
            layers = range(gemma.num_layers_of(kind))
            self.k[kind] = [weight.new_zeros(size) for _ in layers]
            self.v[kind] = [weight.new_zeros(size) for _ in layers]

    def slots(self, kind: str, index: int, positions: torch.Tensor) -> torch.Tensor:
        local = positions % self.ring if kind == SLIDING else positions
        return index * self.per_request[kind] + local


def _rows(seq: _Sequence, canvas_length: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """(token ids, positions, is_canvas) of the sequence's rows this forward."""
    if seq.encoded < seq.committed:  # prompt chunks and finished canvases: at most C rows, for the ring
        end = min(seq.committed, seq.encoded + canvas_length)
        ids = torch.tensor(seq.output.tokens[seq.encoded : end], device=device)
        return ids, torch.arange(seq.encoded, end, device=device), False
    assert seq.canvas is not None, "a sequence with nothing to commit has a canvas"
    return seq.canvas, torch.arange(seq.committed, seq.committed + canvas_length, device=device), True


def _attention(caches: _Caches, batch: list[tuple[int, torch.Tensor, bool]]) -> GemmaAttentionInputs:
    """Per kind: the rows' slots, and per sequence its key range and mask. batch: (request index, row positions,
    is_canvas) in row order."""
    inputs = {}
    for kind in (SLIDING, FULL):
        slices, mappings, start = [], [], 0
        for index, positions, is_canvas in batch:
            first = key_start(kind, caches.window, int(positions[0]))
            keys = torch.arange(first, int(positions[-1]) + 1, device=positions.device)
            mask = rows_mask(kind, caches.window, positions, keys, is_canvas)
            slices.append(SequenceSlice.of(start, len(positions), caches.slots(kind, index, keys), mask))
            mappings.append(caches.slots(kind, index, positions))
            start += len(positions)
        inputs[kind] = PagedAttentionInputs(torch.cat(mappings), tuple(slices), caches.k[kind], caches.v[kind])
    return GemmaAttentionInputs(inputs[SLIDING], inputs[FULL])


def _keys(seq: _Sequence, device: torch.device) -> DrawKeys:
    """The canvas's draw keys: the request's seed, the canvas's start (the committed length), the step."""
    return DrawKeys.of([seq.request.seed], [seq.committed], [seq.step], device)


def _start_canvas(seq: _Sequence, canvas_length: int, vocab_size: int, device: torch.device) -> None:
    seq.step, seq.soft, seq.run = 0, None, 0
    seq.canvas = initial_canvas(_keys(seq, device), canvas_length, vocab_size)[0]
    seq.previous = torch.full((1, canvas_length), -1, dtype=torch.long, device=device)


def _finish_canvas(seq: _Sequence, tokens: torch.Tensor, max_canvases: int, canvas_length: int, vocab: int) -> None:
    """Appends the canvas's final tokens; ends the request (EOS or length) or starts its next canvas."""
    knobs = seq.request.knobs
    is_eos = torch.isin(tokens, torch.tensor(knobs.eos_token_ids, dtype=torch.long, device=tokens.device))
    generated = seq.committed + canvas_length - len(seq.request.prompt)
    seq.finished = bool(is_eos.any()) or generated >= knobs.max_new_tokens or generated >= max_canvases * canvas_length
    if is_eos.any() and knobs.pad_token_id is not None:
        after_first = (is_eos.cumsum(0) > 0) & ~((is_eos.cumsum(0) == 1) & is_eos)
        tokens = tokens.masked_fill(after_first, knobs.pad_token_id)
    seq.output.tokens.extend(tokens.tolist())
    seq.canvas = None
    if not seq.finished:
        _start_canvas(seq, canvas_length, vocab, tokens.device)


def _decode(seq: _Sequence, logits: torch.Tensor, model: DiffusionGemmaForBlockDiffusion) -> None:
    """One denoising step of the sequence's canvas from its logits [C, V]."""
    knobs, gemma = seq.request.knobs, gemma_args(model.args)
    assert seq.canvas is not None and seq.previous is not None, "a canvas row belongs to a started canvas"
    batch_knobs = CanvasKnobs.of([knobs], logits.device)
    result = denoise_step(logits[None], batch_knobs, _keys(seq, logits.device))  # a batch of one canvas
    seq.output.canvases.append(seq.canvas)
    seq.output.accepted.append(result.accepted[0])
    stop, runs = stop_rule(result, seq.previous, torch.tensor([seq.run], device=logits.device), batch_knobs)
    seq.previous, seq.run = result.argmax, int(runs[0])
    seq.step += 1
    if bool(stop[0]) or seq.step == knobs.max_denoising_steps:
        max_canvases = math.ceil(knobs.max_new_tokens / gemma.canvas_length)
        _finish_canvas(seq, result.argmax[0], max_canvases, gemma.canvas_length, model.args.vocab_size)
    else:
        seq.canvas, seq.soft = result.canvas[0], model.self_conditioning_input(result.logits[0])


def _forward(model: DiffusionGemmaForBlockDiffusion, caches: _Caches, active: list[tuple[int, _Sequence]]) -> None:
    """One forward over every active sequence's rows, then each canvas's step."""
    canvas_length = gemma_args(model.args).canvas_length
    weight = model.model.embed_tokens.weight
    rows = [(index, seq, *_rows(seq, canvas_length, weight.device)) for index, seq in active]
    ids = torch.cat([r[2] for r in rows])
    positions = torch.cat([r[3] for r in rows])
    is_canvas = torch.cat([torch.full((len(r[3]),), r[4], device=weight.device) for r in rows])
    zeros = weight.new_zeros(canvas_length, model.args.hidden_size)
    soft = [s.soft if s.soft is not None else zeros for _, s, *_, c in rows if c]
    attn = _attention(caches, [(index, pos, c) for index, _, _, pos, c in rows])
    canvas = CanvasInputs(is_canvas.nonzero().flatten(), torch.cat(soft) if soft else zeros[:0])
    step = StepInputs(attn.full, {window_group(gemma_args(model.args).sliding_window): attn.sliding}, canvas=canvas)
    hidden = model(ids, positions, step)
    logits = model.compute_logits(hidden[is_canvas]).split(canvas_length)
    canvases = iter(logits)
    for _, seq, _, pos, is_canvas_rows in rows:
        if is_canvas_rows:
            _decode(seq, next(canvases), model)
        else:
            seq.encoded = int(pos[-1]) + 1
            if seq.canvas is None and not seq.finished and seq.encoded == seq.committed:
                _start_canvas(seq, canvas_length, model.args.vocab_size, weight.device)


@torch.no_grad()
def generate(model: DiffusionGemmaForBlockDiffusion, requests: list[GemmaRequest]) -> list[GemmaOutput]:
    """Decodes `requests` together (each with its own seed and knobs) -> their outputs."""
    gemma = gemma_args(model.args)
    canvas = gemma.canvas_length
    max_len = max(len(r.prompt) + math.ceil(r.knobs.max_new_tokens / canvas) * canvas for r in requests)
    caches = _Caches(model, len(requests), max_len)
    seqs = [_Sequence(r, GemmaOutput(list(r.prompt))) for r in requests]
    while active := [(i, s) for i, s in enumerate(seqs) if not s.finished]:
        _forward(model, caches, active)
    return [s.output for s in seqs]
