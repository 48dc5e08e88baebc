"""Offline generation with the bundled model (or any model directory given as the first argument).

python examples/offline_generate.py [MODEL_DIR]
"""

import sys

from diffuserve import LLM, SamplingParams
from diffuserve.model.hub import resolve_model

llm = LLM(resolve_model(sys.argv[1] if len(sys.argv) > 1 else None))

# Several prompts run through one engine concurrently; each completion reports its forwards (NFE) and
# tokens per forward (TPF): block diffusion accepts several tokens per forward when the model is confident.
conversations = [[{"role": "user", "content": q}] for q in ("What is 48+35?", "Reverse: 3 1 4 1 5")]
for threshold in (0.95, 0.7):
    params = SamplingParams(max_tokens=64, decoder="threshold", threshold=threshold)
    for conversation, out in zip(conversations, llm.chat(conversations, params)):
        completion = out.outputs[0]
        print(
            f"threshold {threshold}: {conversation[0]['content']!r} -> {completion.text!r} "
            f"(NFE {completion.num_forwards}, TPF {completion.tokens_per_forward:.2f})"
        )
