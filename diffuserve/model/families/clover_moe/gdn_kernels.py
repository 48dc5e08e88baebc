"""Which kernels run the causal Gated DeltaNet scan: its depthwise conv and its delta rule.

Two backends compute the same maths (tests/model/test_gdn_kernels.py checks the adapter against the packages'
documented contracts):
  - torch: ours (delta_rule: chunked for many tokens, recurrent for one; F.conv1d over [ring | tokens]), on
    every device;
  - the CUDA kernels, when installed (`pip install 'diffuserve[cuda-kernels]'`): flash-linear-attention's (fla)
    `chunk_gated_delta_rule` (T > 1) and `fused_recurrent_gated_delta_rule` (T = 1), and causal-conv1d's
    `causal_conv1d_fn` (T > 1, from the ring as `initial_states`) and `causal_conv1d_update` (T = 1) for the conv
    when that package is installed too and its limits hold (2 to 4 taps, channels a multiple of 8).
`select` picks once, for a model on a device: `auto` takes each kernel whose package imports when the device is
CUDA, and torch otherwise; `fla` is `auto` that raises where fla cannot run; `torch` is ours everywhere.

How our layout meets fla's: q, k arrive L2-normalised in fp32 by the layer (the torch path's normalisation, so
both backends see the same inputs: `use_qk_l2norm_in_kernel=False`) with q already scaled by Dk^-0.5
(`scale=1.0`). They are repeated from the key heads to the value heads here (value head j reads key head
j // (Hv / Hk)), because fla's chunk kernel reads key and value heads one to one before 0.5. The state is
[B, Hv, Dk, Dv] fp32 in both. Kernel arguments are passed by keyword: the packages' positional orders differ
(fla's naive reference takes beta before g).

Only the causal scan dispatches here. The block-diffusion preview (gdn_preview) and the rescan baseline's state
rebuild (gdn_rescan, `GatedDeltaNet.scan_state`) always run on the torch path.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from diffuserve.model.families.clover_moe.delta_rule import chunked_delta_rule, recurrent_delta_rule

BACKENDS = ("auto", "torch", "fla")
INSTALL_HINT = "pip install 'diffuserve[cuda-kernels]'"


@dataclass(frozen=True)
class GdnKernels:
    """The CUDA kernels a model runs with; None: that part runs on the torch path."""

    chunk_rule: Callable[..., Any] | None = None
    """fla's chunk_gated_delta_rule (many tokens)."""
    recurrent_rule: Callable[..., Any] | None = None
    """fla's fused_recurrent_gated_delta_rule (one token)."""
    conv_fn: Callable[..., Any] | None = None
    """causal-conv1d's causal_conv1d_fn (many tokens)."""
    conv_update: Callable[..., Any] | None = None
    """causal-conv1d's causal_conv1d_update (one token)."""


TORCH = GdnKernels()


def is_cuda(device: torch.device) -> bool:
    """The device check of `select` (tests replace it to run the kernel adapter on doubles)."""
    return device.type == "cuda"


def _import(module: str, *names: str) -> tuple[Any, ...] | str:
    """The functions `names` of `module`, or why they cannot be imported."""
    try:
        loaded = importlib.import_module(module)
        return tuple(getattr(loaded, name) for name in names)
    except (ImportError, AttributeError) as error:
        return f"{type(error).__name__}: {error}"


def select(backend: str, device: torch.device) -> GdnKernels:
    """The kernels `backend` runs a model on `device` with (see the module docstring); one-line ValueError for
    an unknown backend and for `fla` where it cannot run."""
    if backend not in BACKENDS:
        raise ValueError(f"gdn_backend: {backend!r} is not one of {', '.join(BACKENDS)}; pick one of those")
    if backend == "torch":
        return TORCH
    if not is_cuda(device):
        if backend == "fla":
            raise ValueError(
                f"gdn_backend: fla needs a CUDA device, the model is on {device}; use --gdn-backend auto or torch"
            )
        return TORCH
    rules = _import("fla.ops.gated_delta_rule", "chunk_gated_delta_rule", "fused_recurrent_gated_delta_rule")
    if isinstance(rules, str):
        if backend == "fla":
            raise ValueError(
                f"gdn_backend: fla needs flash-linear-attention, which does not import ({rules}); "
                f"{INSTALL_HINT} or use --gdn-backend auto"
            )
        return TORCH
    convs = _import("causal_conv1d", "causal_conv1d_fn", "causal_conv1d_update")
    return GdnKernels(*rules, *(convs if isinstance(convs, tuple) else (None, None)))


def causal_conv(
    kernels: GdnKernels, mixed: torch.Tensor, ring: torch.Tensor, weight: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The depthwise causal conv + SiLU of T new inputs after the ring. mixed [B, T, D], ring [B, D, k - 1] (the
    last k - 1 inputs before them), weight [D, 1, k] -> (out [B, T, D] in mixed's dtype, the ring after them).
    The ring given is not modified."""
    width = weight.shape[-1]
    if kernels.conv_fn is None or kernels.conv_update is None or not 2 <= width <= 4 or mixed.shape[-1] % 8:
        window = torch.cat([ring.to(mixed.dtype), mixed.transpose(1, 2)], dim=-1)
        out = F.silu(depthwise_conv(window, weight.squeeze(1)))
        return out.transpose(1, 2), window[..., window.shape[-1] - (width - 1) :]
    x = mixed.contiguous().transpose(1, 2)  # [B, D, T], channel-last strides (the kernel's final-state layout)
    taps = weight.squeeze(1)
    if mixed.shape[1] == 1:
        state = ring.to(mixed.dtype, copy=True).contiguous()  # updated in place by the kernel: our copy
        out = kernels.conv_update(x=x, conv_state=state, weight=taps, bias=None, activation="silu")
        return out.transpose(1, 2), state
    initial = ring.to(mixed.dtype).transpose(1, 2).contiguous().transpose(1, 2)  # channel-last, as x
    out, final = kernels.conv_fn(
        x=x, weight=taps, bias=None, initial_states=initial, return_final_states=True, activation="silu"
    )
    return out.transpose(1, 2), final.contiguous()


def depthwise_conv(window: torch.Tensor, taps: torch.Tensor) -> torch.Tensor:
    """window [B, C, L], taps [C, W] -> [B, C, L - W + 1]: out[t] = sum_j window[t + j] * taps[j] per channel
    (F.conv1d with groups = C). In fp32 a multiply-add per tap: with the few taps of a GDN conv this is 2-4x
    faster on the CPU than oneDNN's depthwise convolution at the engine's lengths (32-512 positions). In 16-bit
    dtypes F.conv1d, which accumulates in fp32 where a sum of rounded products would not."""
    taps = taps.to(window.dtype)
    if window.dtype != torch.float32:
        return F.conv1d(window, taps[:, None, :], groups=taps.shape[0])
    length = window.shape[-1] - taps.shape[1] + 1
    out = window[..., :length] * taps[:, :1]
    for j in range(1, taps.shape[1]):
        out = out + window[..., j : j + length] * taps[:, j : j + 1]
    return out


def value_heads_first(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k [B, T, Hk, Dk], v [B, T, Hv, Dv] -> the torch path's layout: q, k [B, Hv, T, Dk], v [B, Hv, T, Dv]."""
    repeat = v.shape[2] // k.shape[2]  # value head j reads key head j // repeat
    q, k = (t.repeat_interleave(repeat, dim=2) for t in (q, k))
    return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)


def delta_rule(
    kernels: GdnKernels,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    in_place: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """q, k [B, T, Hk, Dk] (L2-normalised, q * Dk^-0.5), v [B, T, Hv, Dv], g, beta [B, T, Hv], state
    [B, Hv, Dk, Dv], all fp32 -> (o [B, Hv, T, Dv] fp32, the state after). The state given is not modified,
    unless `in_place`: then the torch path's one-token rule advances it where it lies and returns it (a decode
    step's states are the largest tensors it touches); the other paths return a new state either way."""
    one_token = q.shape[1] == 1
    if kernels.chunk_rule is None or kernels.recurrent_rule is None:
        heads_first = (*value_heads_first(q, k, v), g.transpose(1, 2), beta.transpose(1, 2), state)
        if one_token:
            return recurrent_delta_rule(*heads_first, in_place=in_place and state.is_contiguous())
        return chunked_delta_rule(*heads_first)
    repeat = v.shape[2] // k.shape[2]
    q, k = (t.repeat_interleave(repeat, dim=2) for t in (q, k))
    kernel = kernels.recurrent_rule if one_token else kernels.chunk_rule
    o, final = kernel(
        q=q,
        k=k,
        v=v.contiguous(),
        g=g,
        beta=beta,
        scale=1.0,
        initial_state=state,
        output_final_state=True,
        use_qk_l2norm_in_kernel=False,
    )
    return o.transpose(1, 2).float(), final.float()
