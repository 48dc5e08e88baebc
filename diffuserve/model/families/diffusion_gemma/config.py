"""ModelArgs for the `diffusion_gemma` family (`DiffusionGemmaForBlockDiffusion`, google/diffusiongemma-26B-A4B-it),
and the decoding defaults of its `generation_config.json`.

Owns the reading of a `diffusion_gemma` config.json: the text stack under `text_config` (top-level `canvas_length`
and `tie_word_embeddings`), the 5 : 1 sliding / full `layer_types`, the full layers' own head size and KV heads
(`global_head_dim` / `num_global_key_value_heads` as published, or the `per_layer_config` table that transformers'
`save_pretrained` writes instead), and the RoPE of each layer kind. Defaults and rules are those of transformers
5.x `DiffusionGemmaTextConfig.__post_init__` (the last layer forced to full attention, `global_head_dim` 512,
`sliding_window` 512, `final_logit_softcapping` 30). The family-only part rides in `ModelArgs.extra["gemma"]` as
one `GemmaArgs`. Standard library only (the planner and the engine's control plane may import it); every problem
is a one-line ValueError naming the field, the value and the fix. Knows nothing of weights or requests.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from diffuserve.model.config import ModelArgs, RopeArgs, first_field, require_field
from diffuserve.model.shapes import CacheLayout, CanvasState, PagedKV, SlidingWindowKV
from diffuserve.renoise_knobs import RenoiseDefaults

SLIDING, FULL = "sliding_attention", "full_attention"
NO_MASK_TOKEN = -1
"""DiffusionGemma corrupts with random tokens, never a mask token."""
ACTIVATIONS = ("gelu_pytorch_tanh",)
ROPE_DEFAULTS: dict[str, dict[str, Any]] = {
    SLIDING: {"rope_type": "default", "rope_theta": 10_000.0},
    FULL: {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1_000_000.0},
}
"""transformers' per-kind RoPE when config.json has no `rope_parameters`."""


@dataclass(frozen=True)
class GemmaRope:
    """One layer kind's RoPE. `default`: every pair of dims rotates; `proportional`: the pairs (i, i + D/2) with
    i < partial_rotary_factor * D / 2 rotate at frequencies theta^(-2i/D), the others not at all."""

    rope_type: str
    theta: float
    partial_rotary_factor: float = 1.0
    factor: float = 1.0


@dataclass(frozen=True)
class AttentionShape:
    """Heads of one layer kind: Hkv KV heads of dim D (query heads are the model's `num_heads`)."""

    num_kv_heads: int
    head_dim: int
    rope: GemmaRope


@dataclass(frozen=True)
class GemmaArgs:
    """What ModelArgs has no words for (kept in `ModelArgs.extra["gemma"]`)."""

    layer_types: tuple[str, ...]
    sliding_window: int
    """A sliding layer's causal query sees its last `sliding_window` positions (itself included)."""
    sliding: AttentionShape
    full: AttentionShape
    """Full layers: no v_proj, V is the (v-normed) K projection."""
    final_logit_softcapping: float
    canvas_length: int

    def kind(self, layer_id: int) -> str:
        return self.layer_types[layer_id]

    def shape(self, layer_id: int) -> AttentionShape:
        return self.sliding if self.kind(layer_id) == SLIDING else self.full

    def kind_index(self, layer_id: int) -> int:
        """Index of the layer among the layers of its kind (its K/V cache in the kind's list)."""
        return self.layer_types[:layer_id].count(self.kind(layer_id))

    def num_layers_of(self, kind: str) -> int:
        return self.layer_types.count(kind)


def gemma_args(args: ModelArgs) -> GemmaArgs:
    return args.extra["gemma"]


def _layer_types(text: dict, num_layers: int) -> tuple[str, ...]:
    types = text.get("layer_types")
    if types is None:  # transformers' default pattern: every sixth layer is full attention
        types = [FULL if (i + 1) % 6 == 0 else SLIDING for i in range(num_layers)]
    if len(types) != num_layers:
        raise ValueError(
            f"config.json: `layer_types` has {len(types)} entries, expected num_hidden_layers = {num_layers}"
        )
    unknown = sorted({t for t in types if t not in (SLIDING, FULL)})
    if unknown:
        raise ValueError(f"config.json: `layer_types` contains {unknown}; expected only {SLIDING!r} / {FULL!r}")
    # transformers forces the last layer to full attention (with a warning); we load the same model.
    return (*types[:-1], FULL)


def _rope(text: dict, kind: str) -> GemmaRope:
    params: dict[str, Any] | None = (text.get("rope_parameters") or ROPE_DEFAULTS).get(kind)
    if params is None:
        raise ValueError(f"config.json: `rope_parameters` has no {kind!r} entry; add one (rope_type and rope_theta)")
    rope_type = params.get("rope_type", "default")
    partial = float(params.get("partial_rotary_factor", 1.0))
    if rope_type not in ("default", "proportional") or (rope_type == "default" and partial != 1.0):
        raise ValueError(
            f"config.json: rope_parameters.{kind} is {params}; diffuserve runs DiffusionGemma with rope_type "
            "'default' (no partial_rotary_factor) or 'proportional'"
        )
    theta = float(first_field(params, "rope_theta", default=10_000.0))
    return GemmaRope(rope_type, theta, partial, float(params.get("factor", 1.0)))


def _full_overrides(text: dict, types: tuple[str, ...]) -> dict[str, int]:
    """head_dim / num_key_value_heads of the full layers: `per_layer_config` if present (all full layers alike),
    else `global_head_dim` (512) and `num_global_key_value_heads` (gated by `attention_k_eq_v`, default true)."""
    table = text.get("per_layer_config")
    if table is None:
        overrides = {"head_dim": int(text.get("global_head_dim") or 512)}
        if text.get("attention_k_eq_v", True) and text.get("num_global_key_value_heads") is not None:
            overrides["num_key_value_heads"] = int(text["num_global_key_value_heads"])
        return overrides
    by_layer = {int(k): v for k, v in table.items()}
    full = [by_layer.get(i, {}) for i, kind in enumerate(types) if kind == FULL]
    sliding = [i for i, kind in enumerate(types) if kind == SLIDING and by_layer.get(i)]
    if sliding or any(entry != full[0] for entry in full):
        raise ValueError(
            "config.json: `per_layer_config` gives layers of one kind different shapes; diffuserve runs one "
            "shape per layer kind (the sliding layers the top-level one, the full layers one override)"
        )
    return {k: int(v) for k, v in full[0].items() if k in ("head_dim", "num_key_value_heads")}


def _check_text(text: dict) -> None:
    if text.get("use_bidirectional_attention") == "all":
        raise ValueError(
            "config.json: text_config.use_bidirectional_attention is 'all' (a bidirectional encoder); diffuserve "
            "runs DiffusionGemma's causal encoder only ('vision' or null, as published)"
        )
    activation = text.get("hidden_activation", "gelu_pytorch_tanh")
    if activation not in ACTIVATIONS:
        raise ValueError(f"config.json: hidden_activation {activation!r} is not supported; expected {ACTIVATIONS}")
    if text.get("attention_bias"):
        raise ValueError(
            "config.json: text_config.attention_bias is true; transformers then keeps the encoder's attention "
            "biases apart from the decoder's (its weight ties skip biases), which diffuserve does not model: the "
            "published DiffusionGemma has none; set it to false"
        )
    heads = int(require_field(text, "num_attention_heads"))
    for key in ("num_key_value_heads", "num_global_key_value_heads"):
        if text.get(key) and heads % int(text[key]):
            raise ValueError(f"config.json: `{key}` = {text[key]} does not divide num_attention_heads = {heads}")


def _check_tied(config: dict) -> None:
    if config.get("tie_word_embeddings", True) is False:
        raise ValueError(
            "config.json: tie_word_embeddings is false, which unties DiffusionGemma's encoder from its decoder; "
            "diffuserve loads the tied model (as published): set it to true"
        )


def diffusion_gemma_args_from_hf(config: dict, generation_config: dict | None = None) -> ModelArgs:
    """Builds ModelArgs for `DiffusionGemmaForBlockDiffusion` configs (see the module docstring)."""
    generation_config = generation_config or {}
    text = dict(config.get("text_config") or {})
    _check_text(text)
    _check_tied(config)
    layers = int(require_field(text, "num_hidden_layers"))
    types = _layer_types(text, layers)
    sliding_kv, sliding_dim = int(text.get("num_key_value_heads") or 4), int(text.get("head_dim") or 256)
    sliding = AttentionShape(sliding_kv, sliding_dim, _rope(text, SLIDING))
    over = _full_overrides(text, types)
    full_kv = over.get("num_key_value_heads", sliding.num_kv_heads)
    full = AttentionShape(full_kv, over.get("head_dim", sliding.head_dim), _rope(text, FULL))
    canvas = int(config.get("canvas_length") or 256)
    softcap = text.get("final_logit_softcapping", 30.0)
    gemma = GemmaArgs(types, int(text.get("sliding_window") or 512), sliding, full, float(softcap), canvas)
    experts = int(text.get("num_experts") or 0)
    eos = generation_config.get("eos_token_id", text.get("eos_token_id"))
    return ModelArgs(
        architecture=(config.get("architectures") or ["?"])[0],
        vocab_size=int(require_field(text, "vocab_size")),
        hidden_size=int(require_field(text, "hidden_size")),
        num_layers=layers,
        num_heads=int(require_field(text, "num_attention_heads")),
        num_kv_heads=sliding.num_kv_heads,
        head_dim=sliding.head_dim,
        intermediate_size=int(require_field(text, "intermediate_size")),
        mask_token_id=NO_MASK_TOKEN,
        block_length=canvas,
        num_experts=experts,
        num_experts_per_tok=int(text.get("top_k_experts") or 0) if experts else 0,
        moe_intermediate_size=int(text.get("moe_intermediate_size") or 0) if experts else 0,
        rms_norm_eps=float(text.get("rms_norm_eps", 1e-6)),
        rope=RopeArgs(theta=sliding.rope.theta),
        max_position_embeddings=int(text.get("max_position_embeddings") or 131_072),
        tie_word_embeddings=True,
        eos_token_ids=() if eos is None else tuple(eos) if isinstance(eos, list) else (int(eos),),
        pad_token_id=generation_config.get("pad_token_id", text.get("pad_token_id")),
        torch_dtype=first_field(text, "dtype", "torch_dtype", default=first_field(config, "dtype", "torch_dtype")),
        extra={"gemma": gemma},
    )


def _field(generation: dict, key: str, default: Any) -> Any:
    value = generation.get(key)
    return default if value is None else value


def renoise_defaults(generation: dict) -> RenoiseDefaults:
    """generation_config.json -> RenoiseDefaults (`sampler_config.entropy_bound` is where transformers writes the
    bound); values checked as transformers' `validate()` checks them, as ValueErrors naming the field."""
    base = RenoiseDefaults()
    sampler = generation.get("sampler_config") or {}
    eos = generation.get("eos_token_id")
    defaults = RenoiseDefaults(
        max_denoising_steps=int(_field(generation, "max_denoising_steps", base.max_denoising_steps)),
        entropy_bound=float(_field(sampler, "entropy_bound", base.entropy_bound)),
        t_min=float(_field(generation, "t_min", base.t_min)),
        t_max=float(_field(generation, "t_max", base.t_max)),
        stability_threshold=int(_field(generation, "stability_threshold", base.stability_threshold)),
        confidence_threshold=float(_field(generation, "confidence_threshold", base.confidence_threshold)),
        max_new_tokens=int(_field(generation, "max_new_tokens", base.max_new_tokens)),
        eos_token_ids=() if eos is None else tuple(eos) if isinstance(eos, list) else (int(eos),),
        pad_token_id=generation.get("pad_token_id"),
    )
    check_renoise(defaults)
    return defaults


def check_renoise(knobs: RenoiseDefaults) -> None:
    """The reference's ranges: steps >= 1, bound > 0, 0 <= t_min < t_max, stability >= 0, confidence > 0."""
    checks = (
        ("max_denoising_steps", knobs.max_denoising_steps, knobs.max_denoising_steps >= 1, "an integer >= 1"),
        ("entropy_bound", knobs.entropy_bound, knobs.entropy_bound > 0, "> 0"),
        ("t_min", knobs.t_min, 0 <= knobs.t_min < knobs.t_max, f">= 0 and below t_max = {knobs.t_max}"),
        ("stability_threshold", knobs.stability_threshold, knobs.stability_threshold >= 0, "an integer >= 0"),
        ("confidence_threshold", knobs.confidence_threshold, knobs.confidence_threshold > 0, "> 0"),
        ("max_new_tokens", knobs.max_new_tokens, knobs.max_new_tokens >= 1, "an integer >= 1"),
    )
    for name, value, ok, expected in checks:
        if not ok:
            raise ValueError(f"generation_config.json: `{name}` is {value}; expected {expected}")


def generation_defaults(generation: dict) -> dict[str, Any]:
    """generation_config.json -> the request defaults (SamplingParams names) of a DiffusionGemma model: the renoise
    decoder with the file's knobs (`max_denoising_steps` is `steps`), transformers' where the file has none."""
    knobs = renoise_defaults(generation)
    return {
        "decoder": "renoise",
        "steps": knobs.max_denoising_steps,
        "entropy_bound": knobs.entropy_bound,
        "t_min": knobs.t_min,
        "t_max": knobs.t_max,
        "stability_threshold": knobs.stability_threshold,
        "confidence_threshold": knobs.confidence_threshold,
    }


def cache_layout(args: ModelArgs, dtype: str) -> CacheLayout:
    """Full layers: K/V of every position (their own head shape); sliding layers: only their window's
    (`SlidingWindowKV`, window W: a committed row sees its last W positions, a canvas row the W - 1 before the
    canvas); beside them, each running canvas's self-conditioning input."""
    gemma = gemma_args(args)
    full = PagedKV(gemma.full.num_kv_heads, gemma.full.head_dim, dtype)
    sliding = SlidingWindowKV(gemma.sliding.num_kv_heads, gemma.sliding.head_dim, dtype, gemma.sliding_window)
    layers = tuple(sliding if kind == SLIDING else full for kind in gemma.layer_types)
    return CacheLayout(layers, CanvasState(args.block_length, args.hidden_size, dtype))
