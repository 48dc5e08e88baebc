"""The bundled default model's side of the project: synthetic tasks with exact answers and `diffuserve eval`
(accuracy and TPF over a sweep of decoders). The trainer that produced the model is scripts/training/."""
