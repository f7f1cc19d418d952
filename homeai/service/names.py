"""Model names that pick a lane: `<model>:<lane>`, for clients that can name a model but cannot send
homeai's lane header (Open WebUI's "Task model" setting, say `SmolLM2-135M-Instruct.Q4_1:summaries`).

* `<model>:<lane>` is the served model on `<lane>`, for every configured lane; `<model>` and
  `<model>:latest` are the served model on the request's own lane (its header, the member's
  default, the endpoint's).
* `/v1/models` and `/api/tags` list `<model>:<lane>` for the lanes the member may use, but the
  embeddings lane (the embeddings routes' own default: naming it adds nothing).
* The name's lane is the request's own choice, as a body's `lane` is: it wins over the
  `X-HomeAI-Lane` header (set once for a connection) and the member's default lane; a body `lane`
  that names another lane is a 400 `lane_conflict`. Rights are checked on the lane used: one the
  member may not use is the same 403 as with the header.
* A suffix that is not a lane leaves the name as it is: it names no served model, a 404.
* `[clients] model_alias` (say `home`) is a short name for the served model, as `<id>` is: `home`,
  `home:latest` and `home:<lane>` are taken, and listed after the file's names (`home:latest` in
  `/api/tags`), so that a client's model picker, which cuts long names, still tells the lanes apart.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable

from homeai.service.errors import ServiceError
from lanes import embeddings

SEPARATOR = ":"


def split(name: str | None, lanes: Collection[str]) -> tuple[str | None, str | None]:
    """(`<model>`, `<lane>`) when `name` is `<model>:<lane>` for one of `lanes`; else (`name`, None)."""
    if name:
        model, sep, lane = name.rpartition(SEPARATOR)
        if sep and model and lane in lanes:
            return model, lane
    return name, None


def listed(model_id: str, lanes: Iterable[str], allowed: Collection[str], alias: str = "") -> list[str]:
    """The lane names `model_id` is listed under for a member who may use `allowed`, in the lanes' order;
    then, with an `alias`, the alias itself and its lane names."""
    lanes = [lane for lane in lanes if lane in allowed and lane != embeddings.POLICY.name]
    named = [f"{model_id}{SEPARATOR}{lane}" for lane in lanes]
    return named + ([alias] + [f"{alias}{SEPARATOR}{lane}" for lane in lanes] if alias else [])


def asked_lane(named: str | None, body_lane: str | None, header: str | None) -> str | None:
    """The lane a request asks for: its model name's (`named`) or its body's, else its header's."""
    if named and body_lane and named != body_lane:
        raise ServiceError(400, f"the model name picks lane {named!r} but `lane` names {body_lane!r}: name one",
                           code="lane_conflict", param="lane")
    return named or body_lane or header
