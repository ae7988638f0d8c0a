"""Retry delays shared by the runtime's re-send loops.

Where it sits: `PublisherSession` (re-sending unresolved publishes in order)
and `Node.queue_command_reliable` (settles, returns, channel-down, policy
pushes) retry through the event loop's `call_later`; both take their delays
from a `Backoff`: exponential from `first` up to `cap`, back to the start
after progress. (The at-least-once dead-letter worker re-publishes a letter
whose target is missing at a fixed interval: a different question, see
runtime/dead_letter.py.)
"""
from __future__ import annotations


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


__all__ = ["Backoff"]
