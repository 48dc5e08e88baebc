"""The bundled default model's side of the project: synthetic tasks with exact answers, the block-diffusion
trainer that produced the model, and `diffuserve eval` (accuracy and TPF over a sweep of decoders)."""
