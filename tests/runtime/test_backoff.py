"""Retry delays (runtime/backoff.py)."""
from __future__ import annotations

import pytest

from broker.runtime.backoff import Backoff


def test_doubles_up_to_the_cap_and_starts_over_after_progress() -> None:
    b = Backoff(0.01, 0.1)
    assert [b.next() for _ in range(6)] == [0.01, 0.02, 0.04, 0.08, 0.1, 0.1]
    b.reset()
    assert b.next() == 0.01


def test_immediate_first_retry() -> None:
    b = Backoff(0.01, 1.0, immediate=True)
    assert [b.next() for _ in range(3)] == [0.0, 0.01, 0.02]
    b.reset()
    assert b.next() == 0.0


@pytest.mark.parametrize(("first", "cap"), [(0.0, 1.0), (2.0, 1.0), (-1.0, 1.0)])
def test_bad_bounds_are_refused(first: float, cap: float) -> None:
    with pytest.raises(ValueError, match="0 < first <= cap"):
        Backoff(first, cap)
