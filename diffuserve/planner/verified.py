"""Verified decoding (decoder=verified) in a plan: its tokens per forward and the memory its rollback needs.

Tokens per forward. A verified request drafts a block with the threshold policy and the forward that commits it
checks the draft against the causal path: kept drafts and, at the first rejected one, the causal token become
output; the rest of the block is drafted again, and the next block's step that the checking forward carried is
thrown away. Its TPF is therefore its output tokens per forward, drafting and discarded forwards included. In
order of precedence it is given (`--verified-tpf`), derived from a per-draft acceptance rate (`--acceptance-rate`,
the formula below), or the value measured on the bundled model (MEASURED_VERIFIED_TPF, its source stated).

    the formula   f(L): expected forwards until the L positions still to draft of a block are all output, each
                  draft kept position by position with probability a (independently), drafts written d = the
                  diffusion TPF per forward:
                      f(0) = 0
                      f(L) = max(1, L / d) + sum_{k<L} a^k (1 - a) (1 + f(L - k - 1))
                  (drafting the L positions; a rejection after k kept drafts costs the discarded step and leaves
                  L - k - 1 positions to draft after the causal token); TPF = S / f(S). At a = 1 it is the
                  diffusion TPF min(d, S); at a = 0 each check keeps nothing and writes one causal token.
                  A model, not a measurement: real acceptances are not independent of the position.

Memory. Before the forward that checks a request's draft, the worker saves the request's state slot (each GDN
layer's recurrent state and conv ring: worker/cache/state_step.py) so that a rejection can put it back; the saved
copy is one more state per verifying sequence (0 for models without linear-attention layers; attention K/V need
no copy). Knows nothing of flags, hardware or time; imports no torch.
"""

from __future__ import annotations

from diffuserve.planner.inputs import Deployment
from diffuserve.planner.model_spec import ModelSpec
from diffuserve.planner.recurrent_state import state_bytes_per_sequence

MEASURED_VERIFIED_TPF = 1.49
MEASURED_SOURCE = (
    "measured: the bundled model (trained for both readings), block 4, threshold drafts, 600 held-out task "
    "prompts, docs/results/eval.json"
)
"""The verified TPF used when none is given: `diffuserve eval`'s verified row on the bundled model, prompts of the
tasks it was trained on (tests check it against the results file; random prompts give less: compare-verified.json)."""


def forwards_to_finish(remaining: int, acceptance_rate: float, draft_tpf: float) -> float:
    """f(remaining) of the module docstring, by the recursion from f(0) up."""
    a, f = acceptance_rate, [0.0]
    for length in range(1, remaining + 1):
        rejected = sum(a**k * (1 - a) * (1 + f[length - k - 1]) for k in range(length))
        f.append(max(1.0, length / draft_tpf) + rejected)
    return f[remaining]


def verified_tpf_from_acceptance(acceptance_rate: float, draft_tpf: float, block_length: int) -> float:
    """Verified decoding's output tokens per forward: S / f(S)."""
    if not 0.0 <= acceptance_rate <= 1.0:
        raise ValueError(
            f"acceptance_rate: must be in [0, 1] (the share of drafted tokens the causal check keeps), got "
            f"{acceptance_rate}"
        )
    return block_length / forwards_to_finish(block_length, acceptance_rate, draft_tpf)


def verified_tpf(
    given: float | None, acceptance_rate: float | None, draft_tpf: float, block_length: int
) -> tuple[float, str]:
    """(verified TPF, where it comes from): given > derived from the acceptance rate > measured (capped at S)."""
    if given is not None:
        return given, "given (--verified-tpf)"
    if acceptance_rate is not None:
        tpf = verified_tpf_from_acceptance(acceptance_rate, draft_tpf, block_length)
        return tpf, f"acceptance rate {acceptance_rate} with draft TPF {draft_tpf} at block {block_length}"
    return min(MEASURED_VERIFIED_TPF, block_length), MEASURED_SOURCE


def backup_bytes_per_sequence(spec: ModelSpec, deployment: Deployment) -> float:
    """The saved copy of a verifying sequence's GDN state and conv rings, on one device (0 without GDN layers)."""
    return state_bytes_per_sequence(spec, deployment)
