"""The OpenAI-compatible HTTP server (`diffuserve serve`). Never imports `diffuserve.model`.

cli (flags; config.py ServerConfig) -> app (routes, API key) -> serving (each endpoint's lifecycle), which uses
parsing (request -> SamplingParams and prompt token ids), bridge (engine-loop thread), output_stream (a request's
outputs on the event loop), responses (bodies and SSE) and errors (the OpenAI error shape); protocol holds the wire
models, metrics the Prometheus series.
"""
