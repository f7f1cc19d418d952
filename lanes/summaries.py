"""The summaries lane: long documents to summarise; throughput counts, and it must never starve."""

from lanes.base import BACKGROUND, LanePolicy

POLICY = LanePolicy(
    name="summaries", lane_class=BACKGROUND, priority=10, weight=1.0, window_ms=50.0, max_batch=8,
    max_queue=256, ttft_target_ms=60000.0, itl_target_ms=1000.0, max_tokens=256,
)
