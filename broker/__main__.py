"""`qq-broker`: start one broker node (`broker.runtime.app.main`)."""
from __future__ import annotations

import sys

import broker.runtime.app as app


def main(argv: list[str] | None = None) -> int:
    return int(app.main(argv) or 0)  # pragma: no cover


if __name__ == "__main__":
    sys.exit(main())
