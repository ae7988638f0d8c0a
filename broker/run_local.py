"""`make run`: start a local 3-node cluster (AMQP 5672-5674, management
15672-15674, metrics 15692-15694) with data under ./data.

Until the node runtime exists this starts nothing and says so: it must never
pretend a broker is running.
"""
from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    try:
        import broker.runtime.cluster_local as cluster_local
    except ImportError:
        print(
            "make run: the broker node runtime is not implemented yet, so no cluster is started.\n"
            "What exists so far is tested by `make test`; `make bench` prints the Raft core's "
            "throughput.",
            file=sys.stderr,
        )
        return 2
    return int(cluster_local.main(argv) or 0)  # pragma: no cover


if __name__ == "__main__":
    sys.exit(main())
