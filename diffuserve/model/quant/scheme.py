"""What the user asked to quantize on load: `--quantization fp8|int8|int4`, which weights (`--quantization-targets`)
and the int4 group (`--quantization-group-size`). Standard library only: the engine config validates with it, and
model/quant (the quantized weights themselves) reads it.

The targets name groups of weight matrices, routed experts first (93 % of Clover's bytes):

    experts        routed experts: every expert's gate_up_proj and down_proj
    shared_expert  the shared expert's gate_up_proj and down_proj (not its sigmoid gate)
    dense_mlp      the dense SwiGLU layers (sdar / LLaDA2 `first_k_dense_replace` layers)
    attention      q / k / v / o projections (sdar qkv_proj, Clover q_proj with its output gate)
    gdn            Gated DeltaNet in_proj_qkv, in_proj_z and out_proj
    lm_head        the LM head (off by default)

Never quantized: embeddings, norms, routers (`mlp.gate`), `shared_expert_gate`, the GDN layers' `in_proj_a` /
`in_proj_b` (32 rows feeding the decay and the write strength), `conv1d`, `A_log`, `dt_bias` and the preview
tensors. The default is every target but the LM head: its errors go straight into the logits a decoder
thresholds, it is read only for the rows that need logits, and the published FP8 / GPTQ / AWQ releases keep it in
16 bits too.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

METHODS = ("fp8", "int8", "int4")
TARGETS = ("experts", "shared_expert", "dense_mlp", "attention", "gdn", "lm_head")
DEFAULT_TARGETS = "experts,shared_expert,dense_mlp,attention,gdn"
INT4_GROUP_SIZES = (32, 64, 128, 256)
"""Groups the int4 matmul kernels take (torch's CPU and CUDA int4 kernels); others run the dequantizing matmul."""

# Our parameter names (after the family's renaming), each matched to the target that owns it.
_TARGET_PATTERNS = (
    ("experts", re.compile(r".*\.mlp\.experts\.(gate_up_proj|down_proj)")),
    ("shared_expert", re.compile(r".*\.mlp\.shared_experts?\.(gate_up_proj|down_proj)\.weight")),
    ("dense_mlp", re.compile(r".*\.mlp\.(gate_up_proj|down_proj)\.weight")),
    ("attention", re.compile(r".*\.self_attn\.(qkv_proj|q_proj|k_proj|v_proj|o_proj)\.weight")),
    ("gdn", re.compile(r".*\.linear_attn\.(in_proj_qkv|in_proj_z|out_proj)\.weight")),
    ("lm_head", re.compile(r"lm_head\.weight")),
)


def target_of(param: str) -> str | None:
    """The target owning parameter `param` (our name), None for weights that are never quantized."""
    for target, pattern in _TARGET_PATTERNS:
        if pattern.fullmatch(param):
            return target
    return None


@dataclass(frozen=True)
class QuantScheme:
    """Quantize-on-load request; `method` None means no quantization."""

    method: str | None = None
    targets: frozenset[str] = frozenset(DEFAULT_TARGETS.split(","))
    group_size: int = 128

    def quantizes(self, param: str) -> bool:
        """Whether weight `param` (our name: `...qkv_proj.weight`, `...experts.gate_up_proj`) is quantized."""
        return self.method is not None and target_of(param) in self.targets


def parse_targets(text: str) -> frozenset[str]:
    """`experts,attention` -> the set; `all` = every target; an unknown name is a one-line error."""
    names = [t.strip() for t in text.split(",") if t.strip()]
    if names == ["all"]:
        return frozenset(TARGETS)
    unknown = [n for n in names if n not in TARGETS]
    if unknown or not names:
        raise ValueError(
            f"quantization_targets: {text!r} names {', '.join(unknown) or 'nothing'}; use a comma-separated "
            f"subset of {', '.join(TARGETS)} (or all)"
        )
    return frozenset(names)


def make_scheme(method: str | None, targets: str = DEFAULT_TARGETS, group_size: int = 128) -> QuantScheme:
    """Validated scheme from the three engine options (errors name the field, the value and the fix)."""
    if method is not None and method not in METHODS:
        raise ValueError(f"quantization: {method!r} is not supported; use one of {', '.join(METHODS)}")
    if group_size < 2 or group_size % 2:
        raise ValueError(f"quantization_group_size: must be an even number >= 2, got {group_size}")
    return QuantScheme(method, parse_targets(targets), group_size)
