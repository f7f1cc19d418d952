"""The protocol-neutral service between the routes and the engine (issue 28).

Every protocol (OpenAI, Ollama, the household API, the voice socket, Wyoming) asks the service and
formats what it answers: `homeai.service.errors.ServiceError` for a refusal, an answer stream
(`homeai.service.answer`) for generation. The service imports no web framework.
"""

from homeai.service.errors import ServiceError

__all__ = ["ServiceError"]
