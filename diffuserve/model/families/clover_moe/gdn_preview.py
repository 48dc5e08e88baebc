"""The block-diffusion preview operator of a Gated DeltaNet layer (Clover-35B-A3B-Preview): how a block that is
being denoised is mixed, bidirectionally, while the committed prefix stays causal.

What is published (cortiq release notes and kernel comments; tensor names from the llama.cpp converter, which
drops them; see docs/models/clover.md):
  - the committed state (conv ring and S) is read and never written while a block is previewed;
  - the block's conv adds right (anti-causal) taps `conv_right_weight` [conv_dim, k - 1]:
        out[t] = sum_j in[t + j - (k - 1)] * taps[j]      over [ring | block]
               + sum_{d=1..k-1} block[t + d] * right[d - 1]   (positions past the block's end read 0)
  - the mixer is "a block softmax with a history slot read from the clean state", with learned
    `bd_softmax_logit_scale`, `bd_softmax_history_bias`, `bd_softmax_history_c`.
What is reconstructed here (the exact formula and the shapes are not published; this is the one function to
change when the official code is readable):
  - each of the three `bd_softmax_*` tensors holds one value per value head [Hv], used linearly;
  - block logits  l[t, s] = logit_scale * (q_t . k_s)  over every position s of the block (q, k normalised as
    the causal path does: L2, q * Dk^-0.5; value head h reads key head h // (Hv / Hk));
  - the history slot's value is the clean state's read-out  h_t = S^T q_t  (what GDN outputs for a query
    before writing anything), and its logit  l_hist[t] = history_bias + history_c * g_t,  with g_t <= 0 the
    row's own log-decay: exp(l_hist) = exp(history_bias) * exp(g_t)^history_c, so a row whose gate forgets reads
    less history, as the causal rule's decay would have it;
  - o_t = sum_s p[t, s] v_s + p[t, hist] h_t  with p = softmax over (l[t, :], l_hist[t]); beta is not used
    (nothing is written); z, the gated output norm and out_proj are the causal path's.
Neutral values (tested): `conv_right_weight` = 0 gives the causal conv; `history_bias` = -inf gives plain
bidirectional softmax attention over the block with temperature `logit_scale`; `history_bias` -> +inf gives the
causal delta rule's read-out of the clean state with nothing written (beta = 0, g = 0); `history_c` = 0 makes
the history logit a per-head constant.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from diffuserve.model.families.clover_moe.gdn_kernels import depthwise_conv

DIFFUSION_TENSORS = ("conv_right_weight", "bd_softmax_logit_scale", "bd_softmax_history_bias", "bd_softmax_history_c")


def add_diffusion_parameters(layer: nn.Module, conv_dim: int, conv_kernel: int, num_value_heads: int) -> None:
    """Registers the four diffusion tensors on a GDN layer, under their checkpoint names (values: the loader's)."""
    layer.conv_right_weight = nn.Parameter(torch.empty(conv_dim, conv_kernel - 1))
    for name in DIFFUSION_TENSORS[1:]:
        setattr(layer, name, nn.Parameter(torch.empty(num_value_heads)))


def block_conv(block: torch.Tensor, ring: torch.Tensor, left: torch.Tensor, right: torch.Tensor) -> torch.Tensor:
    """block [B, C, T] conv inputs, ring [B, C, k - 1] (read only), left [C, 1, k] causal taps, right [C, k - 1]
    -> [B, C, T] pre-activation: the causal conv over [ring | block] plus the right taps inside the block."""
    # One conv of 2k - 1 taps over [ring | block | k - 1 zeros]: output t reads ring/block positions t - k + 1 .. t
    # through `left` and block positions t + 1 .. t + k - 1 (zero past the end) through `right`.
    window = F.pad(torch.cat([ring.to(block.dtype), block], dim=-1), (0, right.shape[1]))
    return depthwise_conv(window, torch.cat([left.squeeze(1), right], dim=1))


def _per_head(t: torch.Tensor) -> torch.Tensor:
    return t.float()[None, :, None]  # [Hv] -> [1, Hv, 1]


def preview_mix(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    state: torch.Tensor,
    logit_scale: torch.Tensor,
    history_bias: torch.Tensor,
    history_c: torch.Tensor,
) -> torch.Tensor:
    """q, k [B, Hv, T, Dk], v [B, Hv, T, Dv], g [B, Hv, T] (fp32, as the causal path computes them), state S
    [B, Hv, Dk, Dv] (read only), the three bd_softmax tensors [Hv] -> o [B, Hv, T, Dv] fp32 (module docstring)."""
    history = torch.einsum("bhkv,bhtk->bhtv", state, q)  # h_t = S^T q_t
    logits = _per_head(logit_scale)[..., None] * (q @ k.transpose(-1, -2))  # [B, Hv, T, T]
    history_logit = _per_head(history_bias) + _per_head(history_c) * g  # [B, Hv, T]
    weights = torch.softmax(torch.cat([logits, history_logit[..., None]], dim=-1), dim=-1)
    return weights[..., :-1] @ v + weights[..., -1:] * history
