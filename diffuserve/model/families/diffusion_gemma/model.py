"""The `diffusion_gemma` family: DiffusionGemma-26B-A4B (`DiffusionGemmaForBlockDiffusion`), a Gemma-4 MoE text
stack run two ways with one set of weights (transformers ties its encoder to its decoder):

    committed rows (encoder): causal; their K/V are what a cache keeps (the prompt, every finished canvas)
    canvas rows    (decoder): bidirectional over the canvas and the cached prefix; their K/V are never kept;
                              input = RMSNorm(embedding + SelfConditioning(previous step's soft embeddings))

Both roles may share one forward (`CanvasInputs.rows` says which rows are canvas rows); they differ only in the
mask (the attention inputs: diffusion_gemma_masks), the canvas rows' self-conditioning and the layer scalar each
role multiplies a layer's output by (`encoder_layer_scalar` / `layer_scalar`: separate buffers in the checkpoint).
The forward takes the engine's inputs in its cache layout's order (diffusion_gemma_config.cache_layout): the full
layers' attention inputs, the sliding layers', then the canvas rows with their self-conditioning input.
Layers: input / post-attention RMSNorms around attention (layers/gemma_attention: 5 sliding : 1 full, K = V on
full layers), then the dense GeGLU beside the routed experts (layers/gemma_moe). Embeddings times sqrt(H); logits
soft-capped `cap * tanh(logits / cap)` in fp32; no logit shift (the logit at a canvas position predicts that
position). Module tree: `model.embed_tokens`, `model.layers.{i}.{input_layernorm, self_attn,
post_attention_layernorm, feed_forward, layer_scalar, encoder_layer_scalar}`, `model.norm`,
`model.self_conditioning`, `lm_head` (tied); checkpoint names in diffusion_gemma_weights. Text only: the vision
tower is not run. Knows nothing of requests or caches beyond the attention inputs it is given.
"""

from __future__ import annotations

import torch
from torch import nn

from diffuserve.model.config import ModelArgs
from diffuserve.model.families.diffusion_gemma.attention import GemmaAttention, GemmaAttentionInputs
from diffuserve.model.families.diffusion_gemma.config import FULL, SLIDING, gemma_args
from diffuserve.model.families.diffusion_gemma.moe import GeGLU, GemmaFeedForward
from diffuserve.model.families.diffusion_gemma.norm import GemmaRMSNorm
from diffuserve.model.families.diffusion_gemma.rotary import GemmaRotary
from diffuserve.model.interface import DiffusionModel, StepRules
from diffuserve.model.step_inputs import StepInputs


class DiffusionGemmaLayer(nn.Module):
    """h = x + post_attention_layernorm(attn(input_layernorm(x))); out = (h + feed_forward(h)) * scalar, the
    scalar of the row's role."""

    def __init__(self, args: ModelArgs, layer_id: int, rotary: GemmaRotary) -> None:
        super().__init__()
        self.input_layernorm = GemmaRMSNorm(args.hidden_size, args.rms_norm_eps)
        self.self_attn = GemmaAttention(args, layer_id, rotary)
        self.post_attention_layernorm = GemmaRMSNorm(args.hidden_size, args.rms_norm_eps)
        self.feed_forward = GemmaFeedForward(args)
        # Buffers in the checkpoint; parameters here so the loader fills them (never trained).
        self.layer_scalar = nn.Parameter(torch.ones(1), requires_grad=False)
        self.encoder_layer_scalar = nn.Parameter(torch.ones(1), requires_grad=False)

    def forward(
        self, x: torch.Tensor, positions: torch.Tensor, attn: GemmaAttentionInputs, is_canvas: torch.Tensor
    ) -> torch.Tensor:
        """x [..., H], positions and is_canvas [...] -> [..., H]."""
        h = x + self.post_attention_layernorm(self.self_attn(self.input_layernorm(x), positions, attn))
        scalar = torch.where(is_canvas[..., None], self.layer_scalar, self.encoder_layer_scalar)  # [..., 1]
        return (h + self.feed_forward(h)) * scalar


class SelfConditioning(nn.Module):
    """post_norm(embedding + GeGLU(pre_norm(soft))), post_norm without scale (`DiffusionGemmaSelfConditioning`)."""

    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.pre_norm = GemmaRMSNorm(args.hidden_size, args.rms_norm_eps)
        self.mlp = GeGLU(args.hidden_size, args.intermediate_size)
        self.post_norm = GemmaRMSNorm(args.hidden_size, args.rms_norm_eps, with_scale=False)

    def forward(self, embeddings: torch.Tensor, soft: torch.Tensor) -> torch.Tensor:
        return self.post_norm(embeddings + self.mlp(self.pre_norm(soft)))


class DiffusionGemmaTextModel(nn.Module):
    def __init__(self, args: ModelArgs, max_model_len: int) -> None:
        super().__init__()
        gemma = gemma_args(args)
        self.embed_tokens = nn.Embedding(args.vocab_size, args.hidden_size)
        self.embed_scale = args.hidden_size**0.5
        # One table per layer kind (its own head size and RoPE), shared by the layers of that kind.
        rotary = {
            kind: GemmaRotary(shape.rope, shape.head_dim, max_model_len)
            for kind, shape in ((SLIDING, gemma.sliding), (FULL, gemma.full))
        }
        self.rotary = nn.ModuleDict(rotary)
        self.layers = nn.ModuleList(DiffusionGemmaLayer(args, i, rotary[gemma.kind(i)]) for i in range(args.num_layers))
        self.norm = GemmaRMSNorm(args.hidden_size, args.rms_norm_eps)
        self.self_conditioning = SelfConditioning(args)

    def scaled_embedding(self, input_ids: torch.Tensor) -> torch.Tensor:
        """ids [...] -> [..., H]: the embedding times sqrt(H), the scale rounded to the weights' dtype first."""
        weight = self.embed_tokens.weight
        return self.embed_tokens(input_ids) * torch.tensor(self.embed_scale).to(weight.dtype)


class DiffusionGemmaForBlockDiffusion(DiffusionModel):
    def __init__(self, args: ModelArgs, max_model_len: int) -> None:
        super().__init__()
        self.args = args
        self.softcap = gemma_args(args).final_logit_softcapping
        self.sliding_window = gemma_args(args).sliding_window
        self.model = DiffusionGemmaTextModel(args, max_model_len)
        self.lm_head = nn.Linear(args.hidden_size, args.vocab_size, bias=False)
        self.lm_head.weight = self.model.embed_tokens.weight

    @property
    def step_rules(self) -> StepRules:
        """Committed rows causal, canvas rows bidirectional over the prefix and the canvas; renoise canvases."""
        return StepRules(causal_commits=True, renoise_canvas=True, block_window_from_start=True)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        step: StepInputs,
    ) -> torch.Tensor:
        """input_ids, positions [N] with paged inputs (or [Bt, T] with dense ones) -> hidden [..., H] before the
        final norm. `canvas.rows` index the flattened rows (rows past them, e.g. bucket padding, are committed
        rows); `canvas.soft` [M, H] is their self-conditioning input (zeros on a canvas's first step, as the
        reference's None)."""
        canvas = step.require_canvas()
        x = self.model.scaled_embedding(input_ids)  # [..., H]
        lead, hidden = x.shape[:-1], x.shape[-1]
        flat = x.reshape(-1, hidden)
        is_canvas = torch.zeros(flat.shape[0], dtype=torch.bool, device=flat.device)
        if canvas.rows.numel():
            is_canvas[canvas.rows] = True
            conditioned = self.model.self_conditioning(flat[canvas.rows], canvas.soft.to(flat.dtype))
            flat = flat.index_copy(0, canvas.rows, conditioned)
        x, is_canvas = flat.view(*lead, hidden), is_canvas.view(lead)
        attn = GemmaAttentionInputs(step.window(self.sliding_window), step.attention)
        for layer in self.model.layers:
            x = layer(x, positions, attn, is_canvas)
        return x

    def self_conditioning_input(self, logits: torch.Tensor) -> torch.Tensor:
        """A step's processed logits [M, V] -> the next step's self-conditioning input [M, H], its soft
        embeddings: softmax (fp32) @ embedding table x sqrt(H), in the table's dtype (transformers' decoder, step
        1.c.v)."""
        weight = self.model.embed_tokens.weight
        probs = logits.to(weight.dtype).softmax(dim=-1, dtype=torch.float32).to(weight.dtype)
        return (probs @ weight) * torch.tensor(self.model.embed_scale).to(weight.dtype)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [..., H] -> soft-capped logits [..., V] fp32 (the head in the model dtype, the cap in fp32)."""
        logits = self.lm_head(self.model.norm(hidden)).float()
        return torch.tanh(logits / self.softcap) * self.softcap
