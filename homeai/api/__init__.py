"""The daemon's HTTP side: routes never schedule, they submit to the engine and shape answers.

app.py (factory, lifespan) · runtime.py (store, model, engine, metrics, stats writer of one app)
· openai.py, lanes.py, metrics.py, health.py (routers) · auth.py, deps.py (typed dependencies)
· schemas.py (request bodies) · shapes.py, streaming.py (responses, SSE, abort on disconnect)
· errors.py (OpenAI error shape) · limits.py (body size) · recorder.py (request_stats writer)
· jobs.py (jobs and search routes, from the jobs work; not yet included by app.py).
"""
