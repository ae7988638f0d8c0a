"""A fixed-bucket histogram, counted where a duration is measured (the WAL
writer's thread, the metrics sampler on the event loop) and read at scrape
time (broker/mgmt/metrics.py turns it into a Prometheus histogram).

A reader on another thread may see one observation counted in a bucket and
not yet in `total` (each update is atomic under the GIL, the pair is not)."""
from __future__ import annotations

import bisect


class Histogram:
    """`counts[k]`: observations <= `bounds[k]` and above the bound before it;
    `counts[-1]`: above every bound. `total`: their sum."""

    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.total = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.total += value


__all__ = ["Histogram"]
