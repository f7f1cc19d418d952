"""The protocol-neutral service between the routes and the engine (issue 28).

Every protocol (OpenAI, Ollama, the household API, the voice socket, Wyoming) asks the `Service`
and formats what it answers: a `ServiceError` for a refusal, an `Answer` (a stream of `Thinking`,
`Text`, `Call`, then `Done` or `Failed`) for generation, `Embeddings` for vectors. It imports no web
framework; `homeai.api` and `homeai.wyoming` sit above it, `homeai.engine` below.
"""

from homeai.service.answer import Answer, Call, Done, Failed, Text, Thinking, Usage, Whole
from homeai.service.asks import ChatAsk, CompletionAsk, EmbedAsk, Embeddings, ImageIn, ThinkAsk
from homeai.service.core import Service
from homeai.service.errors import ServiceError
from homeai.service.rights import Caller
from homeai.service.sampling import SamplingAsk
from homeai.service.speaking import Speaking

__all__ = ["Answer", "Call", "Caller", "ChatAsk", "CompletionAsk", "Done", "EmbedAsk", "Embeddings", "Failed", "ImageIn",
           "SamplingAsk", "Service", "ServiceError", "Speaking", "Text", "Thinking", "ThinkAsk", "Usage", "Whole"]
