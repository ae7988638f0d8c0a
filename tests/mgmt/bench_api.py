"""Management API and metrics latency on a real 3-node cluster (not a test).

    .venv/bin/python -m tests.mgmt.bench_api [QUEUES]

Declares QUEUES (default 300) quorum queues through the API, then times
GET /api/queues and a /metrics scrape three times each. Belongs in bench/
(kept here because that directory is another engineer's)."""
from __future__ import annotations

import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tests.mgmt.conftest import MgmtCluster


def main(n: int) -> None:
    c = MgmtCluster(Path(tempfile.mkdtemp(prefix="qq-bench-mgmt-")))
    c.start()
    try:
        api = c.apis[0]
        t = time.perf_counter()
        with ThreadPoolExecutor(8) as ex:
            codes = list(ex.map(lambda i: api.put(f"/api/queues/%2F/b{i}",
                                                  {"durable": True, "type": "quorum"})[0], range(n)))
        assert all(code == 201 for code in codes), codes
        print(f"declare {n} quorum queues via the API (8 threads): {time.perf_counter() - t:.2f} s")
        for _ in range(3):
            t = time.perf_counter()
            _, body = api.get("/api/queues")
            print(f"GET /api/queues ({len(body)} queues): {(time.perf_counter() - t) * 1000:.0f} ms")
        for _ in range(3):
            t = time.perf_counter()
            url = f"http://127.0.0.1:{c.nodes[0].metrics_port}/metrics"
            with urllib.request.urlopen(url, timeout=60) as resp:
                size = len(resp.read())
            print(f"GET /metrics ({size} bytes): {(time.perf_counter() - t) * 1000:.0f} ms")
    finally:
        c.kill_all()


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 300)
