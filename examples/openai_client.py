"""Talk to `diffuserve serve` with the official OpenAI client (start the server first:
`bash scripts/run.sh serve`).

    python examples/openai_client.py [BASE_URL]
"""

import sys

from openai import OpenAI

base_url = sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:8000/v1"
client = OpenAI(base_url=base_url, api_key="unused")
model = client.models.list().data[0].id

# Streaming: each chunk is one committed diffusion block, final as soon as it arrives.
stream = client.chat.completions.create(
    model=model,
    messages=[{"role": "user", "content": "What is 27+15?"}],
    stream=True,
    stream_options={"include_usage": True},
)
for chunk in stream:
    if chunk.choices and chunk.choices[0].delta.content:
        print(chunk.choices[0].delta.content, end="", flush=True)
    if chunk.usage:
        print(f"\nusage: {chunk.usage}")

# Diffusion knobs travel as extra fields of the request body.
reply = client.chat.completions.create(
    model=model,
    messages=[{"role": "user", "content": "Sort: 9 2 7"}],
    extra_body={"threshold": 0.7},
)
print(reply.choices[0].message.content, reply.usage)
