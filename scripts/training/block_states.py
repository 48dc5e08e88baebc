"""The causal GDN maths of the clean stream, shaped for training: the delta rule and the depthwise conv over a
whole conversation, keeping the state at every block boundary (which the noisy blocks are previewed against).

The delta rule is delta_rule.chunked_delta_rule's algebra with one chunk per block: every chunk's matrices are
built at once and only the state recurrence runs block by block (a few matmuls each), so a 12-block row costs a
dozen small steps rather than a dozen full calls. Exactness against `DenseClover.forward_causal` is tested
(tests/eval/test_hybrid_forward.py). Knows nothing of batches or losses.
"""

from __future__ import annotations

import torch


def depthwise_conv(window: torch.Tensor, taps: torch.Tensor) -> torch.Tensor:
    """window [B, C, k - 1 + T], taps [C, k] -> [B, C, T]: out[t] = sum_j window[t + j] * taps[j] (F.conv1d's
    depthwise maths as k shifted multiply-adds, whose backward is far cheaper on CPU)."""
    width = window.shape[-1] - taps.shape[-1] + 1
    return sum(window[..., j : j + width] * taps[:, j, None] for j in range(taps.shape[-1]))


def block_delta_rule(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, block: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """q, k [B, Hv, L, Dk], v [B, Hv, L, Dv], g, beta [B, Hv, L] fp32, L a multiple of `block`, from an empty
    state -> (o [B, Hv, L, Dv], S at each block start [B, L / block, Hv, Dk, Dv])."""
    b, h, length = k.shape[:3]
    n = length // block
    q, k, v = (x.reshape(b, h, n, block, x.shape[-1]) for x in (q, k, v))
    g, beta = g.reshape(b, h, n, block), beta.reshape(b, h, n, block)
    cum = g.cumsum(-1)  # [B, Hv, N, T] log-decay from the block start
    lower = torch.ones(block, block, dtype=torch.bool, device=q.device).tril()
    decay = (cum[..., :, None] - cum[..., None, :]).masked_fill(~lower, float("-inf")).exp()  # [.., T, T]
    system = torch.eye(block, device=q.device) + ((k @ k.transpose(-1, -2)) * decay * beta[..., None]).tril(-1)
    u_v = torch.linalg.solve_triangular(system, v * beta[..., None], upper=False, unitriangular=True)
    u_s = torch.linalg.solve_triangular(system, k * (beta * cum.exp())[..., None], upper=False, unitriangular=True)
    scores = (q @ k.transpose(-1, -2)) * decay
    q_decayed = q * cum.exp()[..., None]
    k_to_end = (k * (cum[..., -1:] - cum).exp()[..., None]).transpose(-1, -2)  # [B, Hv, N, Dk, T]
    block_decay = cum[..., -1, None, None].exp()  # [B, Hv, N, 1, 1]
    state = q.new_zeros(b, h, q.shape[-1], v.shape[-1])
    outputs, starts = [], []
    for i in range(n):
        starts.append(state)
        u = u_v[:, :, i] - u_s[:, :, i] @ state  # [B, Hv, T, Dv]
        outputs.append(q_decayed[:, :, i] @ state + scores[:, :, i] @ u)
        state = state * block_decay[:, :, i] + k_to_end[:, :, i] @ u
    return torch.cat(outputs, dim=2), torch.stack(starts, dim=1)
