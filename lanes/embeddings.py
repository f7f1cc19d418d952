"""The embeddings lane: /v1/embeddings calls, batched for throughput."""

from lanes.base import BACKGROUND, LanePolicy

POLICY = LanePolicy(
    name="embeddings", lane_class=BACKGROUND, priority=10, weight=1.0, window_ms=20.0, max_batch=32,
    max_queue=1024, ttft_target_ms=10000.0, itl_target_ms=1000.0, max_tokens=0,
)
