"""The trainer of the bundled default model (`scripts/train_tiny_model.py`): the two-stream block-diffusion batches
(`diffusion_batch`) and the optimisation loop and checkpoint writing (`train`). Not part of the installed package:
serving never trains. Import it from the repository root as `scripts.training`."""
