"""Where routes not yet on the service (the household API, the voice socket) queue work: the
service's submission (`homeai.service.submit`), off the event loop, refusals as API errors."""

from homeai.service.submit import REFUSALS, off_loop, refusal, submit

__all__ = ["REFUSALS", "off_loop", "refusal", "submit"]
