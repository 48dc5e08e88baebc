"""Decoding: every rule that turns a block's logits into what a step writes, behind one `Decoder` protocol
(protocol.py) and one registry (registry.py): the mask decoders (threshold, fixed, entropy, edit), renoise, the
autoregressive next-token rule, and grammar-constrained decoding as a wrapper around the first and the last.
Knows nothing of batches, caches or models: the model runner hands a request's decoder its block's logit rows."""
