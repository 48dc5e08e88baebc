"""The engine's bookkeeping, without torch: requests and their blocks, the scheduler, the outputs a step produces,
and every cache kind's host-side manager (pages, state slots, canvas slots). Knows nothing of tensors or models."""
