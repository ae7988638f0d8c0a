"""`qq-broker`: start one broker node (`broker.runtime.app.main`)."""
from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    try:
        from broker.runtime import app  # noqa: F401  (exists once the node runtime lands)
    except ImportError:
        print(
            "qq-broker: the broker node runtime is not implemented yet "
            "(see the open issue 'A broker node that real AMQP 0-9-1 clients use unchanged').\n"
            "Nothing is listening on 5672. Available now: the Raft core, storage and "
            "queue-machine libraries and their tests (`make test`).",
            file=sys.stderr,
        )
        return 2
    return int(app.main(argv) or 0)  # pragma: no cover


if __name__ == "__main__":
    sys.exit(main())
