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


def test_a_restart_gate_spaces_attempts_and_starts_over_after_a_quiet_spell() -> None:
    from broker.runtime.backoff import RestartGate

    now = [100.0]
    gate = RestartGate(first=2.0, cap=8.0, quiet=600.0, clock=lambda: now[0])
    assert gate.due()  # the first attempt at once
    waits = []
    for _ in range(5):
        gate.attempt()
        start = now[0]
        while not gate.due():
            now[0] += 0.5
        waits.append(now[0] - start)
    assert waits == [2.0, 4.0, 8.0, 8.0, 8.0]
    now[0] += 600.0  # ran ten minutes: a new failure starts the series again
    gate.attempt()
    assert not gate.due()
    now[0] += 2.0
    assert gate.due() and gate.attempts == 6
    gate.attempt()
    gate.reopen()
    assert gate.due()
