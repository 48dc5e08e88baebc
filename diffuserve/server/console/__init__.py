"""The web console: the page and its static files (page.py, static/), and the planner's HTTP API it charts
(plan_api.py, plan_models.py). Served by the same app as the OpenAI API; knows nothing of the engine's internals."""
