"""The lanes of work that share the model: each module holds a lane's default policy."""

from lanes import chat, embeddings, indexing, summaries, voice
from lanes.base import BACKGROUND, INTERACTIVE, LanePolicy

DEFAULT_POLICIES: dict[str, LanePolicy] = {
    m.POLICY.name: m.POLICY for m in (voice, chat, summaries, indexing, embeddings)
}

__all__ = ["BACKGROUND", "INTERACTIVE", "LanePolicy", "DEFAULT_POLICIES"]
