"""The gated delta rule of Gated DeltaNet, in its two exact forms: recurrent (token by token) and chunked.

Per value head, with an fp32 state S [Dk, Dv], a decay g_t <= 0 (log space), a write strength beta_t in (0, 1),
an L2-normalised key k_t and a query q_t already scaled by Dk^-0.5:

    S_t = exp(g_t) S_{t-1} + k_t u_t^T,   u_t = beta_t (v_t - exp(g_t) S_{t-1}^T k_t),   o_t = S_t^T q_t

The chunked form solves a chunk of C tokens at once. With c_t the cumulative log-decay inside the chunk (so
exp(c_t - c_s) is the decay from s to t) and S0 the state at the chunk's start, unrolling the recurrence gives

    (I + A) U = beta*V - (beta*exp(c)*K) S0,    A[t, s] = beta_t exp(c_t - c_s) (k_t . k_s)  for s < t
    O   = (exp(c)*Q) S0 + ((Q K^T) * exp(c_t - c_s), s <= t) U
    S_C = exp(c_C) S0 + (K * exp(c_C - c))^T U

so a chunk costs a few matmuls and one unit-triangular solve. Both forms take and return the state, so a
sequence can be split anywhere. Shapes: B batch, T tokens, Hv value heads, Dk / Dv key / value head dims.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

CHUNK_SIZE = 64


def recurrent_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    in_place: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """q, k [B, Hv, T, Dk], v [B, Hv, T, Dv], g, beta [B, Hv, T], state [B, Hv, Dk, Dv] (all fp32)
    -> (o [B, Hv, T, Dv], final state). The input state is not modified, unless `in_place` (then it must be
    contiguous, and it is the final state returned).

    Written for a decode step's batch of states (B x Hv small matrices, 16 MiB at 128 sequences of clover-moe-bench):
    each read is a batched matmul of [1, Dk] rows (an `einsum` here permuted the whole state first, 3x slower), and
    after the first decay, which copies the input unless `in_place`, the state is updated in place (`baddbmm_`: the
    rank-1 write without a [B, Hv, Dk, Dv] temporary)."""
    out = torch.empty_like(v)
    batch, heads, _, dk = k.shape
    dv = v.shape[-1]
    for t in range(q.shape[2]):
        decay = g[:, :, t, None, None].exp()
        copy = t == 0 and not in_place
        state = (state * decay).contiguous() if copy else state.mul_(decay)  # contiguous: viewed as rows below
        read = (k[:, :, t, None, :] @ state).squeeze(-2)  # [B, Hv, Dv]: what S already stores under k_t
        update = (v[:, :, t] - read) * beta[:, :, t, None]  # [B, Hv, Dv]
        rows = state.view(batch * heads, dk, dv)
        rows.baddbmm_(k[:, :, t].reshape(batch * heads, dk, 1), update.reshape(batch * heads, 1, dv))
        out[:, :, t] = (q[:, :, t, None, :] @ state).squeeze(-2)
    return out, state


def chunked_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    chunk_size: int = CHUNK_SIZE,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Same contract as `recurrent_delta_rule`, C = chunk_size tokens at a time (see the module docstring)."""
    length = q.shape[2]
    chunk_size = _fitted(chunk_size, length)
    q, k, v, g, beta = (_in_chunks(x, chunk_size) for x in (q, k, v, g, beta))
    cum, decay, u_v, u_s, k_to_end = _chunk_terms(k, v, g, beta)
    scores = (q @ k.transpose(-1, -2)) * decay  # [B, Hv, N, C, C]
    q_decayed = q * cum.exp()[..., None]
    out = torch.empty_like(v)
    for i in range(k.shape[2]):
        u = u_v[:, :, i] - u_s[:, :, i] @ state  # [B, Hv, C, Dv]
        out[:, :, i] = q_decayed[:, :, i] @ state + scores[:, :, i] @ u
        state = state * cum[:, :, i, -1, None, None].exp() + k_to_end[:, :, i].transpose(-1, -2) @ u
    return out.flatten(2, 3)[:, :, :length], state


def chunked_delta_state(
    k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, state: torch.Tensor
) -> torch.Tensor:
    """`chunked_delta_rule`'s final state alone, without the outputs (no q): a prefix's state, rebuilt."""
    chunk_size = _fitted(CHUNK_SIZE, k.shape[2])
    k, v, g, beta = (_in_chunks(x, chunk_size) for x in (k, v, g, beta))
    cum, _, u_v, u_s, k_to_end = _chunk_terms(k, v, g, beta)
    for i in range(k.shape[2]):
        u = u_v[:, :, i] - u_s[:, :, i] @ state
        state = state * cum[:, :, i, -1, None, None].exp() + k_to_end[:, :, i].transpose(-1, -2) @ u
    return state


def _fitted(chunk_size: int, length: int) -> int:
    """A chunk no longer than the scan, rounded up to 16: a 32-token commit solves a 32 x 32 system, not a
    64 x 64 one half made of padding (padding only adds exact zeros, so the result is the same)."""
    return min(chunk_size, -(-length // 16) * 16)


def _in_chunks(x: torch.Tensor, chunk_size: int) -> torch.Tensor:
    """[B, Hv, T, ...] -> [B, Hv, N, C, ...], T padded to N * C. Padding tokens have g = 0, beta = 0, k = 0: they
    write nothing and do not decay the state."""
    pad = (-x.shape[2]) % chunk_size
    x = F.pad(x, (0, 0) * (x.dim() - 3) + (0, pad))
    return x.reshape(*x.shape[:2], x.shape[2] // chunk_size, chunk_size, *x.shape[3:])


def _chunk_terms(k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """What every chunk needs, for all chunks at once (module docstring): cum [B, Hv, N, C], the decay matrix
    [B, Hv, N, C, C] (t, s), U's parts u_v = (I + A)^-1 beta*V and u_s = (I + A)^-1 (beta*exp(c)*K) (so that
    U = u_v - u_s S0), and K decayed to the chunk's end."""
    c = k.shape[3]
    cum = g.cumsum(-1)  # log-decay from the chunk start
    lower = torch.ones(c, c, dtype=torch.bool, device=k.device).tril()
    decay = (cum[..., :, None] - cum[..., None, :]).masked_fill(~lower, float("-inf")).exp()
    kk = k @ k.transpose(-1, -2)  # [B, Hv, N, C, C]
    system = torch.eye(c, device=k.device) + (kk * decay * beta[..., None]).tril(-1)
    rhs_v = v * beta[..., None]
    rhs_s = k * (beta * cum.exp())[..., None]  # multiplies S0 (per chunk, so solved for every chunk at once)
    u_v = torch.linalg.solve_triangular(system, rhs_v, upper=False, unitriangular=True)
    u_s = torch.linalg.solve_triangular(system, rhs_s, upper=False, unitriangular=True)
    k_to_end = k * (cum[..., -1:] - cum).exp()[..., None]
    return cum, decay, u_v, u_s, k_to_end
