"""Per-model-version counters in the shape of Triton's statistics extension."""

from __future__ import annotations

import time
from typing import Any

#: Upper bounds (ns) of the request duration histogram's buckets, 100 µs to 10 s; a last bucket
#: (index ``len(DURATION_BOUNDS_NS)``) holds everything longer (+Inf).
DURATION_BOUNDS_NS = (
    100_000,
    250_000,
    500_000,
    1_000_000,
    2_500_000,
    5_000_000,
    10_000_000,
    25_000_000,
    50_000_000,
    100_000_000,
    250_000_000,
    500_000_000,
    1_000_000_000,
    2_500_000_000,
    5_000_000_000,
    10_000_000_000,
)


class ModelStats:
    """Counters updated on the event loop thread only, so they need no lock.

    Durations follow Triton: ``success``/``fail`` are whole-request times, ``queue`` is the time
    from enqueue to dispatch, ``compute_*`` are the batch's times charged to each of its requests.
    """

    __slots__ = (
        "success_count",
        "success_ns",
        "fail_count",
        "fail_ns",
        "queue_count",
        "queue_ns",
        "input_count",
        "input_ns",
        "infer_count",
        "infer_ns",
        "output_count",
        "output_ns",
        "inference_count",
        "execution_count",
        "last_inference_ms",
        "batches",
        "duration_buckets",
    )

    def __init__(self) -> None:
        self.success_count = self.success_ns = 0
        self.fail_count = self.fail_ns = 0
        self.queue_count = self.queue_ns = 0
        self.input_count = self.input_ns = 0
        self.infer_count = self.infer_ns = 0
        self.output_count = self.output_ns = 0
        self.inference_count = 0
        self.execution_count = 0
        self.last_inference_ms = 0
        #: batch size -> [executions, compute_input ns, compute_infer ns, compute_output ns]
        self.batches: dict[int, list[int]] = {}
        #: successful requests per duration bucket (not cumulative): index ``bisect_left(DURATION_BOUNDS_NS, ns)``
        self.duration_buckets = [0] * (len(DURATION_BOUNDS_NS) + 1)

    def record_batch(
        self, rows: int, requests: int, queue_ns: int, input_ns: int, infer_ns: int, output_ns: int
    ) -> None:
        self.execution_count += 1
        self.inference_count += rows
        self.last_inference_ms = time.time_ns() // 1_000_000
        self.queue_count += requests
        self.queue_ns += queue_ns
        self.input_count += requests
        self.input_ns += input_ns * requests
        self.infer_count += requests
        self.infer_ns += infer_ns * requests
        self.output_count += requests
        self.output_ns += output_ns * requests
        entry = self.batches.get(rows)
        if entry is None:
            self.batches[rows] = [1, input_ns, infer_ns, output_ns]
        else:
            entry[0] += 1
            entry[1] += input_ns
            entry[2] += infer_ns
            entry[3] += output_ns

    def to_dict(self, name: str, version: str) -> dict[str, Any]:
        def duration(count: int, ns: int) -> dict[str, int]:
            return {"count": count, "ns": ns}

        return {
            "name": name,
            "version": version,
            "last_inference": self.last_inference_ms,
            "inference_count": self.inference_count,
            "execution_count": self.execution_count,
            "inference_stats": {
                "success": duration(self.success_count, self.success_ns),
                "fail": duration(self.fail_count, self.fail_ns),
                "queue": duration(self.queue_count, self.queue_ns),
                "compute_input": duration(self.input_count, self.input_ns),
                "compute_infer": duration(self.infer_count, self.infer_ns),
                "compute_output": duration(self.output_count, self.output_ns),
                "cache_hit": duration(0, 0),
                "cache_miss": duration(0, 0),
            },
            "batch_stats": [
                {
                    "batch_size": size,
                    "compute_input": duration(entry[0], entry[1]),
                    "compute_infer": duration(entry[0], entry[2]),
                    "compute_output": duration(entry[0], entry[3]),
                }
                for size, entry in sorted(self.batches.items())
            ],
            "memory_usage": [],
        }
