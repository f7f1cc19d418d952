"""The indexing lane: document chunks embedded during scheduled jobs, in large batches."""

from lanes.base import BACKGROUND, LanePolicy

POLICY = LanePolicy(
    name="indexing", lane_class=BACKGROUND, priority=10, weight=1.0, window_ms=200.0, max_batch=32,
    max_queue=1024, ttft_target_ms=60000.0, itl_target_ms=1000.0, max_tokens=0,
)
