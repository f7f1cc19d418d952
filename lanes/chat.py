"""The chat lane: the household web chat and OpenAI clients; TTFT and a steady reading pace count."""

from lanes.base import INTERACTIVE, LanePolicy

POLICY = LanePolicy(
    name="chat", lane_class=INTERACTIVE, priority=1, weight=2.0, window_ms=5.0, max_batch=16,
    max_queue=64, ttft_target_ms=1500.0, itl_target_ms=100.0, max_tokens=512,
)
