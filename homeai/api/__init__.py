"""The daemon's HTTP side: routes read their protocol's request, ask the service (homeai.service)
and write its answer stream in their protocol's shape; they never schedule and never touch the
engine or the runner.

app.py (factory over the assembled program, homeai.app; lifespan) · runtime.py (the HTTP side of
one app: metrics, stats writer, admission, socket counts) · deps.py,
auth.py (typed dependencies: the service, the runtime, the caller) · openai.py + schemas.py,
shapes.py, streaming.py (OpenAI: SSE or one object) · ollama.py, ollama_schemas.py,
ollama_route.py (Ollama generation: NDJSON) · ollama_manage.py, ollama_models.py (Ollama's model
management) · household.py, household_answer.py (conversations, household SSE with storage) ·
voice.py, voice_protocol.py, voice_turn.py (the voice socket) · transcriptions.py · lanes.py,
metrics.py, prometheus.py, health.py (state and metrics) · jobs.py, web.py · dispatch.py (lanes
served remotely) · errors.py (error handlers) · limits.py, origin.py, http_server.py, connections.py,
revocation.py, shutdown.py, recorder.py (the listener's guards and bookkeeping).
"""
