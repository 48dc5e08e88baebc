"""What runs a step on a device: the model runner (the step batch, each cache kind's step metadata, decoding the
blocks), the executor (one rank's model part and caches, the forward), the caches' tensors, expert offload and
statistics, prompt scoring. Knows nothing of the scheduler's policy or of HTTP."""
