"""The OpenAI-compatible HTTP server (`diffuserve serve`): FastAPI routes, protocol models, the async bridge to
the engine loop, metrics and auth. Never imports `diffuserve.model`."""
