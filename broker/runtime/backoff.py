"""Retry delays shared by the runtime's re-send loops.

Where it sits: `PublisherSession` (re-sending unresolved publishes in order)
and `Node.queue_command_reliable` (settles, returns, channel-down, policy
pushes) retry through the event loop's `call_later`; both take their delays
from a `Backoff`: exponential from `first` up to `cap`, back to the start
after progress. (The at-least-once dead-letter worker re-publishes a letter
whose target is missing at a fixed interval: a different question, see
runtime/dead_letter.py.) A `RestartGate` spaces the restarts of a member
a failed write stopped (`Registry.restart_stopped`,
`MetadataStore.restart_stopped`).
"""
from __future__ import annotations

import time
from collections.abc import Callable


class Backoff:
    """Delays first, 2*first, 4*first, ... capped at `cap`; with
    `immediate`, the very first retry (and the first after `reset`) runs at
    once (delay 0)."""

    __slots__ = ("first", "cap", "immediate", "_next")

    def __init__(self, first: float = 0.01, cap: float = 1.0, immediate: bool = False) -> None:
        if not 0 < first <= cap:
            raise ValueError(f"need 0 < first <= cap, got {first}, {cap}")
        self.first = first
        self.cap = cap
        self.immediate = immediate
        self._next = 0.0 if immediate else first

    def next(self) -> float:
        """The delay before the next attempt (and advance)."""
        delay = self._next
        self._next = min(max(delay * 2, self.first), self.cap)
        return delay

    def reset(self) -> None:
        """Progress was made: start again from the shortest delay."""
        self._next = 0.0 if self.immediate else self.first


class RestartGate:
    """When a stopped member may be started again: at once the first time,
    then `first`, 2*`first`, ... `cap` seconds after each attempt. An attempt
    `quiet` seconds or more after the previous one starts the series again
    (the member ran that long: its next failure is a new one)."""

    __slots__ = ("_backoff", "quiet", "_clock", "_not_before", "_last", "attempts")

    def __init__(self, first: float = 2.0, cap: float = 60.0, quiet: float = 600.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._backoff = Backoff(first, cap)
        self.quiet = quiet
        self._clock = clock
        self._not_before = 0.0
        self._last: float | None = None
        self.attempts = 0  # in all

    def due(self) -> bool:
        return self._clock() >= self._not_before

    def attempt(self) -> None:
        """An attempt is made now."""
        now = self._clock()
        if self._last is not None and now - self._last >= self.quiet:
            self._backoff.reset()
        self._last = now
        self._not_before = now + self._backoff.next()
        self.attempts += 1

    def reopen(self) -> None:
        """The next attempt may be made at once (the wait is over)."""
        self._not_before = 0.0


__all__ = ["Backoff", "RestartGate"]
